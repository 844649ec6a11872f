// Environments for mpiml-ppo, written in plain C++ (no LibTorch): Gym's
// CartPole-v1, Pendulum-v1, Acrobot-v1 and MountainCarContinuous-v0, with their
// dynamics, rewards and time limits.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace ppo {

/// Action space: discrete (n choices) or continuous box (dim values in [low, high]).
struct ActionSpace {
    bool discrete = true;
    int n = 0;        ///< number of actions (discrete)
    int dim = 0;      ///< action dimension (continuous)
    double low = 0.0, high = 0.0;
};

struct StepResult {
    std::vector<float> obs;
    double reward = 0.0;
    bool terminated = false;  ///< the MDP ended (no bootstrapping)
    bool truncated = false;   ///< the time limit cut the episode
};

class Env {
public:
    virtual ~Env() = default;
    virtual std::string name() const = 0;
    virtual int obs_dim() const = 0;
    virtual ActionSpace action_space() const = 0;
    virtual int max_episode_steps() const = 0;
    /// Starts an episode and returns its first observation.
    virtual std::vector<float> reset() = 0;
    /// Discrete envs read action[0] as the action index.
    virtual StepResult step(const std::vector<float>& action) = 0;
    /// The environment's own random stream: a seed sequence of s and a tag,
    /// never the stream of an engine seeded with s itself (the action
    /// sampler's), whose draws would tie the start states to the actions.
    void seed(std::uint64_t s) {
        std::seed_seq seq{static_cast<std::uint32_t>(s), static_cast<std::uint32_t>(s >> 32), 0x656e76u};
        rng_.seed(seq);
    }

    /// Everything that carries over between steps (for checkpoints): the
    /// random engine, the step count of the episode in progress and the
    /// dynamics' variables. set_snapshot restores exactly what snapshot took.
    struct Snapshot {
        std::mt19937_64 rng;
        int t = 0;
        std::vector<double> vars;
    };
    Snapshot snapshot() const { return {rng_, t_, vars()}; }
    /// Throws std::invalid_argument when vars has the wrong length.
    void set_snapshot(const Snapshot& s);

protected:
    virtual std::vector<double> vars() const = 0;
    virtual void set_vars(const std::vector<double>& v) = 0;

    std::mt19937_64 rng_{0};
    int t_ = 0;  ///< steps taken in the current episode
};

/// Gym's CartPole-v1: push a cart left (0) or right (1); reward 1 per step;
/// terminates when |theta| > 12 degrees or |x| > 2.4; truncated at 500 steps.
class CartPole final : public Env {
public:
    static constexpr double gravity = 9.8, masscart = 1.0, masspole = 0.1;
    static constexpr double total_mass = masscart + masspole;
    static constexpr double length = 0.5;  // half the pole's length
    static constexpr double polemass_length = masspole * length;
    static constexpr double force_mag = 10.0, tau = 0.02;
    static constexpr double theta_threshold = 12.0 * 2.0 * 3.14159265358979323846 / 360.0;
    static constexpr double x_threshold = 2.4;

    std::string name() const override { return "CartPole-v1"; }
    int obs_dim() const override { return 4; }
    ActionSpace action_space() const override { return {true, 2, 0, 0.0, 0.0}; }
    int max_episode_steps() const override { return 500; }
    std::vector<float> reset() override;
    StepResult step(const std::vector<float>& action) override;

    /// Sets (x, x_dot, theta, theta_dot) without touching the step count.
    void set_state(double x, double x_dot, double theta, double theta_dot);
    const double* state() const { return s_; }

private:
    std::vector<double> vars() const override { return {s_, s_ + 4}; }
    void set_vars(const std::vector<double>& v) override { std::copy(v.begin(), v.end(), s_); }
    std::vector<float> obs() const;
    double s_[4] = {0, 0, 0, 0};
};

/// Gym's Pendulum-v1: torque in [-2, 2] to swing up and hold a pendulum;
/// reward -(angle^2 + 0.1 thdot^2 + 0.001 u^2); truncated at 200 steps.
class Pendulum final : public Env {
public:
    static constexpr double max_speed = 8.0, max_torque = 2.0, dt = 0.05;
    static constexpr double g = 10.0, m = 1.0, l = 1.0;

    std::string name() const override { return "Pendulum-v1"; }
    int obs_dim() const override { return 3; }
    ActionSpace action_space() const override { return {false, 0, 1, -max_torque, max_torque}; }
    int max_episode_steps() const override { return 200; }
    std::vector<float> reset() override;
    StepResult step(const std::vector<float>& action) override;

    void set_state(double theta, double theta_dot);
    double theta() const { return th_; }
    double theta_dot() const { return thdot_; }

private:
    std::vector<double> vars() const override { return {th_, thdot_}; }
    void set_vars(const std::vector<double>& v) override { set_state(v[0], v[1]); }
    std::vector<float> obs() const;
    double th_ = 0.0, thdot_ = 0.0;
};

/// Gym's Acrobot-v1: two links, torque -1, 0 or +1 (actions 0, 1, 2) on the
/// joint between them; reward -1 per step until the free end rises one link
/// above the base (terminated, reward 0); RK4 over dt = 0.2 with the book's
/// equations; truncated at 500 steps. Observation: cos and sin of both angles,
/// and both angular velocities.
class Acrobot final : public Env {
public:
    static constexpr double dt = 0.2, l1 = 1.0, m1 = 1.0, m2 = 1.0, lc1 = 0.5, lc2 = 0.5;
    static constexpr double moi = 1.0, g = 9.8;
    static constexpr double pi = 3.14159265358979323846;
    static constexpr double max_vel_1 = 4 * pi, max_vel_2 = 9 * pi;

    std::string name() const override { return "Acrobot-v1"; }
    int obs_dim() const override { return 6; }
    ActionSpace action_space() const override { return {true, 3, 0, 0.0, 0.0}; }
    int max_episode_steps() const override { return 500; }
    std::vector<float> reset() override;
    StepResult step(const std::vector<float>& action) override;

    /// Sets (theta1, theta2, dtheta1, dtheta2) without touching the step count.
    void set_state(double theta1, double theta2, double dtheta1, double dtheta2);
    const double* state() const { return s_; }

private:
    std::vector<double> vars() const override { return {s_, s_ + 4}; }
    void set_vars(const std::vector<double>& v) override { std::copy(v.begin(), v.end(), s_); }
    std::vector<float> obs() const;
    double s_[4] = {0, 0, 0, 0};
};

/// Gym's MountainCarContinuous-v0: force in [-1, 1] drives a car up a hill;
/// reward 100 on reaching position 0.45 (terminated) minus 0.1 action^2 per
/// step; truncated at 999 steps. Observation: position, velocity (the state is
/// kept in float32 between steps, as Gym keeps it).
class MountainCarContinuous final : public Env {
public:
    static constexpr double min_position = -1.2, max_position = 0.6, max_speed = 0.07;
    static constexpr double goal_position = 0.45, power = 0.0015;

    std::string name() const override { return "MountainCarContinuous-v0"; }
    int obs_dim() const override { return 2; }
    ActionSpace action_space() const override { return {false, 0, 1, -1.0, 1.0}; }
    int max_episode_steps() const override { return 999; }
    std::vector<float> reset() override;
    StepResult step(const std::vector<float>& action) override;

    void set_state(double position, double velocity);
    double position() const { return pos_; }
    double velocity() const { return vel_; }

private:
    std::vector<double> vars() const override { return {pos_, vel_}; }
    void set_vars(const std::vector<double>& v) override { set_state(v[0], v[1]); }
    double pos_ = 0.0, vel_ = 0.0;
};

/// Gym's angle_normalize: x wrapped into [-pi, pi).
double angle_normalize(double x);

/// One of env_names(); throws std::invalid_argument otherwise.
std::unique_ptr<Env> make_env(const std::string& name);
std::vector<std::string> env_names();

}  // namespace ppo
