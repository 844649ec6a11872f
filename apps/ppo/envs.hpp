// Environments for mpiml-ppo, written in plain C++ (no LibTorch): Gym's
// CartPole-v1 and Pendulum-v1, with their dynamics, rewards and time limits.
#pragma once

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
    void seed(std::uint64_t s) { rng_.seed(s); }

protected:
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
    std::vector<float> obs() const;
    double th_ = 0.0, thdot_ = 0.0;
};

/// Gym's angle_normalize: x wrapped into [-pi, pi).
double angle_normalize(double x);

/// "CartPole-v1" or "Pendulum-v1"; throws std::invalid_argument otherwise.
std::unique_ptr<Env> make_env(const std::string& name);
std::vector<std::string> env_names();

}  // namespace ppo
