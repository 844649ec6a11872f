#include "envs.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <numbers>
#include <stdexcept>

namespace ppo {

void Env::set_snapshot(const Snapshot& s) {
    const std::size_t n = vars().size();
    if (s.vars.size() != n)
        throw std::invalid_argument(name() + ": a snapshot of " + std::to_string(s.vars.size()) +
                                    " variables, expected " + std::to_string(n));
    rng_ = s.rng;
    t_ = s.t;
    set_vars(s.vars);
}

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

// ------------------------------------------------------------------- Acrobot

namespace {

using State5 = std::array<double, 5>;  // theta1, theta2, dtheta1, dtheta2, torque

State5 acrobot_dsdt(const State5& s) {
    using A = Acrobot;
    constexpr double i1 = A::moi, i2 = A::moi;
    const double a = s[4], theta1 = s[0], theta2 = s[1], dtheta1 = s[2], dtheta2 = s[3];
    const double d1 = A::m1 * A::lc1 * A::lc1 +
                      A::m2 * (A::l1 * A::l1 + A::lc2 * A::lc2 +
                               2 * A::l1 * A::lc2 * std::cos(theta2)) +
                      i1 + i2;
    const double d2 = A::m2 * (A::lc2 * A::lc2 + A::l1 * A::lc2 * std::cos(theta2)) + i2;
    const double phi2 = A::m2 * A::lc2 * A::g * std::cos(theta1 + theta2 - A::pi / 2.0);
    const double phi1 = -A::m2 * A::l1 * A::lc2 * dtheta2 * dtheta2 * std::sin(theta2) -
                        2 * A::m2 * A::l1 * A::lc2 * dtheta2 * dtheta1 * std::sin(theta2) +
                        (A::m1 * A::lc1 + A::m2 * A::l1) * A::g * std::cos(theta1 - A::pi / 2) +
                        phi2;
    // The book's equations (Gym's default), not the NIPS paper's.
    const double ddtheta2 = (a + d2 / d1 * phi1 -
                             A::m2 * A::l1 * A::lc2 * dtheta1 * dtheta1 * std::sin(theta2) - phi2) /
                            (A::m2 * A::lc2 * A::lc2 + i2 - d2 * d2 / d1);
    const double ddtheta1 = -(d2 * ddtheta2 + phi1) / d1;
    return {dtheta1, dtheta2, ddtheta1, ddtheta2, 0.0};
}

/// Gym's wrap: x shifted by whole periods into [m, M].
double wrap(double x, double m, double big_m) {
    const double diff = big_m - m;
    while (x > big_m) x -= diff;
    while (x < m) x += diff;
    return x;
}

}  // namespace

std::vector<float> Acrobot::reset() {
    std::uniform_real_distribution<double> u(-0.1, 0.1);
    for (double& v : s_) v = u(rng_);
    t_ = 0;
    return obs();
}

void Acrobot::set_state(double theta1, double theta2, double dtheta1, double dtheta2) {
    s_[0] = theta1, s_[1] = theta2, s_[2] = dtheta1, s_[3] = dtheta2;
}

std::vector<float> Acrobot::obs() const {
    return {static_cast<float>(std::cos(s_[0])), static_cast<float>(std::sin(s_[0])),
            static_cast<float>(std::cos(s_[1])), static_cast<float>(std::sin(s_[1])),
            static_cast<float>(s_[2]),           static_cast<float>(s_[3])};
}

StepResult Acrobot::step(const std::vector<float>& action) {
    const int a = action.empty() ? -1 : static_cast<int>(action[0]);
    if (a < 0 || a > 2) throw std::invalid_argument("Acrobot: action must be 0, 1 or 2");
    const State5 y0 = {s_[0], s_[1], s_[2], s_[3], static_cast<double>(a - 1)};
    // One RK4 step over [0, dt], as Gym's rk4 with t = [0, dt].
    auto axpy = [](const State5& y, double h, const State5& k) {
        State5 r;
        for (int i = 0; i < 5; ++i) r[i] = y[i] + h * k[i];
        return r;
    };
    const double h2 = dt / 2.0;
    const State5 k1 = acrobot_dsdt(y0);
    const State5 k2 = acrobot_dsdt(axpy(y0, h2, k1));
    const State5 k3 = acrobot_dsdt(axpy(y0, h2, k2));
    const State5 k4 = acrobot_dsdt(axpy(y0, dt, k3));
    double ns[4];
    for (int i = 0; i < 4; ++i) ns[i] = y0[i] + dt / 6.0 * (k1[i] + 2 * k2[i] + 2 * k3[i] + k4[i]);
    s_[0] = wrap(ns[0], -pi, pi);
    s_[1] = wrap(ns[1], -pi, pi);
    s_[2] = std::clamp(ns[2], -max_vel_1, max_vel_1);
    s_[3] = std::clamp(ns[3], -max_vel_2, max_vel_2);
    ++t_;

    StepResult r;
    r.obs = obs();
    r.terminated = -std::cos(s_[0]) - std::cos(s_[1] + s_[0]) > 1.0;
    r.reward = r.terminated ? 0.0 : -1.0;
    r.truncated = !r.terminated && t_ >= max_episode_steps();
    return r;
}

// ---------------------------------------------------- MountainCarContinuous

std::vector<float> MountainCarContinuous::reset() {
    pos_ = std::uniform_real_distribution<double>(-0.6, -0.4)(rng_);
    vel_ = 0.0;
    t_ = 0;
    return {static_cast<float>(pos_), static_cast<float>(vel_)};
}

void MountainCarContinuous::set_state(double position, double velocity) {
    pos_ = position;
    vel_ = velocity;
}

StepResult MountainCarContinuous::step(const std::vector<float>& action) {
    const double a = action.empty() ? 0.0 : static_cast<double>(action[0]);
    const double force = std::clamp(a, -1.0, 1.0);
    double velocity = vel_ + force * power - 0.0025 * std::cos(3 * pos_);
    velocity = std::clamp(velocity, -max_speed, max_speed);
    double position = std::clamp(pos_ + velocity, min_position, max_position);
    if (position == min_position && velocity < 0) velocity = 0;
    ++t_;

    StepResult r;
    r.terminated = position >= goal_position && velocity >= 0.0;
    r.reward = (r.terminated ? 100.0 : 0.0) - a * a * 0.1;  // the unclipped action's cost
    r.truncated = !r.terminated && t_ >= max_episode_steps();
    // Gym keeps the state as float32 between steps.
    pos_ = static_cast<float>(position);
    vel_ = static_cast<float>(velocity);
    r.obs = {static_cast<float>(pos_), static_cast<float>(vel_)};
    return r;
}

// ------------------------------------------------------------------ factory

std::vector<std::string> env_names() {
    return {"CartPole-v1", "Pendulum-v1", "Acrobot-v1", "MountainCarContinuous-v0"};
}

std::unique_ptr<Env> make_env(const std::string& name) {
    if (name == "CartPole-v1") return std::make_unique<CartPole>();
    if (name == "Pendulum-v1") return std::make_unique<Pendulum>();
    if (name == "Acrobot-v1") return std::make_unique<Acrobot>();
    if (name == "MountainCarContinuous-v0") return std::make_unique<MountainCarContinuous>();
    std::string known;
    for (const auto& n : env_names()) known += (known.empty() ? "" : ", ") + n;
    throw std::invalid_argument("unknown environment '" + name + "' (known: " + known + ")");
}

}  // namespace ppo
