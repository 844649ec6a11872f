#include "envs.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <stdexcept>

namespace ppo {

// ------------------------------------------------------------------ CartPole

std::vector<float> CartPole::reset() {
    std::uniform_real_distribution<double> u(-0.05, 0.05);
    for (double& v : s_) v = u(rng_);
    t_ = 0;
    return obs();
}

void CartPole::set_state(double x, double x_dot, double theta, double theta_dot) {
    s_[0] = x;
    s_[1] = x_dot;
    s_[2] = theta;
    s_[3] = theta_dot;
}

std::vector<float> CartPole::obs() const {
    return {static_cast<float>(s_[0]), static_cast<float>(s_[1]), static_cast<float>(s_[2]),
            static_cast<float>(s_[3])};
}

StepResult CartPole::step(const std::vector<float>& action) {
    const int a = action.empty() ? 0 : static_cast<int>(action[0]);
    if (a != 0 && a != 1) throw std::invalid_argument("CartPole: action must be 0 or 1");
    auto& [x, x_dot, theta, theta_dot] = s_;
    const double force = a == 1 ? force_mag : -force_mag;
    const double costheta = std::cos(theta), sintheta = std::sin(theta);
    // Euler integration, as Gym's default kinematics_integrator.
    const double temp = (force + polemass_length * theta_dot * theta_dot * sintheta) / total_mass;
    const double thetaacc = (gravity * sintheta - costheta * temp) /
                            (length * (4.0 / 3.0 - masspole * costheta * costheta / total_mass));
    const double xacc = temp - polemass_length * thetaacc * costheta / total_mass;
    x = x + tau * x_dot;
    x_dot = x_dot + tau * xacc;
    theta = theta + tau * theta_dot;
    theta_dot = theta_dot + tau * thetaacc;
    ++t_;

    StepResult r;
    r.obs = obs();
    r.reward = 1.0;
    r.terminated = x < -x_threshold || x > x_threshold || theta < -theta_threshold ||
                   theta > theta_threshold;
    r.truncated = !r.terminated && t_ >= max_episode_steps();
    return r;
}

// ------------------------------------------------------------------ Pendulum

double angle_normalize(double x) {
    constexpr double pi = std::numbers::pi;
    double y = std::fmod(x + pi, 2.0 * pi);  // Python's % is never negative here
    if (y < 0) y += 2.0 * pi;
    return y - pi;
}

std::vector<float> Pendulum::reset() {
    std::uniform_real_distribution<double> uth(-std::numbers::pi, std::numbers::pi);
    std::uniform_real_distribution<double> udot(-1.0, 1.0);
    th_ = uth(rng_);
    thdot_ = udot(rng_);
    t_ = 0;
    return obs();
}

void Pendulum::set_state(double theta, double theta_dot) {
    th_ = theta;
    thdot_ = theta_dot;
}

std::vector<float> Pendulum::obs() const {
    return {static_cast<float>(std::cos(th_)), static_cast<float>(std::sin(th_)),
            static_cast<float>(thdot_)};
}

StepResult Pendulum::step(const std::vector<float>& action) {
    const double u = std::clamp(action.empty() ? 0.0 : static_cast<double>(action[0]),
                                -max_torque, max_torque);
    const double an = angle_normalize(th_);
    const double cost = an * an + 0.1 * thdot_ * thdot_ + 0.001 * u * u;
    double newthdot = thdot_ + (3.0 * g / (2.0 * l) * std::sin(th_) + 3.0 / (m * l * l) * u) * dt;
    newthdot = std::clamp(newthdot, -max_speed, max_speed);
    th_ = th_ + newthdot * dt;
    thdot_ = newthdot;
    ++t_;

    StepResult r;
    r.obs = obs();
    r.reward = -cost;
    r.terminated = false;
    r.truncated = t_ >= max_episode_steps();
    return r;
}

// ------------------------------------------------------------------ factory

std::vector<std::string> env_names() { return {"CartPole-v1", "Pendulum-v1"}; }

std::unique_ptr<Env> make_env(const std::string& name) {
    if (name == "CartPole-v1") return std::make_unique<CartPole>();
    if (name == "Pendulum-v1") return std::make_unique<Pendulum>();
    throw std::invalid_argument("unknown environment '" + name +
                                "' (known: CartPole-v1, Pendulum-v1)");
}

}  // namespace ppo
