// mpiml-ppo's environments against Gym's definitions (no MPI, no LibTorch).
#include "envs.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

using namespace ppo;

namespace {
constexpr double deg = std::numbers::pi / 180.0;
const std::vector<float> left{0.0f}, right{1.0f};
}  // namespace

TEST(CartPole, ResetIsUniformInPlusMinus005) {
    CartPole env;
    env.seed(3);
    for (int i = 0; i < 100; ++i) {
        const auto o = env.reset();
        ASSERT_EQ(o.size(), 4u);
        for (float v : o) {
            EXPECT_GE(v, -0.05f);
            EXPECT_LE(v, 0.05f);
        }
    }
}

// The environment's stream is its own: seeded with s it is not the stream of
// an engine seeded with s (the action sampler's), and it is reproducible.
TEST(Env, SeedGivesAStreamOfItsOwn) {
    CartPole a, b;
    a.seed(7);
    b.seed(7);
    EXPECT_TRUE(a.snapshot().rng == b.snapshot().rng);
    EXPECT_FALSE(a.snapshot().rng == std::mt19937_64(7));
    EXPECT_EQ(a.reset(), b.reset());
    b.seed(10007);
    EXPECT_NE(a.reset(), b.reset());
}

TEST(CartPole, OneStepMatchesGymEuler) {
    CartPole env;
    env.reset();
    env.set_state(0.1, -0.2, 0.05, 0.3);
    const auto r = env.step(right);
    // Gym's formulas, evaluated by hand for force = +10.
    const double th = 0.05, thd = 0.3, ct = std::cos(th), st = std::sin(th);
    const double temp = (10.0 + 0.05 * thd * thd * st) / 1.1;
    const double thacc = (9.8 * st - ct * temp) / (0.5 * (4.0 / 3.0 - 0.1 * ct * ct / 1.1));
    const double xacc = temp - 0.05 * thacc * ct / 1.1;
    EXPECT_DOUBLE_EQ(env.state()[0], 0.1 + 0.02 * -0.2);
    EXPECT_DOUBLE_EQ(env.state()[1], -0.2 + 0.02 * xacc);
    EXPECT_DOUBLE_EQ(env.state()[2], 0.05 + 0.02 * 0.3);
    EXPECT_DOUBLE_EQ(env.state()[3], 0.3 + 0.02 * thacc);
    EXPECT_FLOAT_EQ(r.obs[3], static_cast<float>(0.3 + 0.02 * thacc));
    EXPECT_EQ(r.reward, 1.0);
    EXPECT_FALSE(r.terminated);
    EXPECT_FALSE(r.truncated);
}

TEST(CartPole, TerminatesPast12Degrees) {
    CartPole env;
    env.reset();
    // theta after the step = theta + 0.02 * theta_dot: land just inside, then just outside.
    env.set_state(0, 0, 11.9 * deg, 0.0);
    EXPECT_FALSE(env.step(left).terminated);
    env.set_state(0, 0, 12.0 * deg - 1e-6, 1.0);  // + 0.02 rad > 12 deg
    auto r = env.step(left);
    EXPECT_TRUE(r.terminated);
    EXPECT_EQ(r.reward, 1.0);
    env.set_state(0, 0, -12.0 * deg + 1e-6, -1.0);
    EXPECT_TRUE(env.step(right).terminated);
}

TEST(CartPole, TerminatesPast2Point4) {
    CartPole env;
    env.reset();
    env.set_state(2.39, 0.0, 0.0, 0.0);
    EXPECT_FALSE(env.step(right).terminated);
    env.set_state(2.399, 1.0, 0.0, 0.0);  // x -> 2.419
    EXPECT_TRUE(env.step(right).terminated);
    env.set_state(-2.399, -1.0, 0.0, 0.0);
    EXPECT_TRUE(env.step(left).terminated);
}

TEST(CartPole, TruncatesAt500Steps) {
    CartPole env;
    env.reset();
    for (int t = 1; t <= 500; ++t) {
        env.set_state(0, 0, 0, 0);  // keep it upright; the step count goes on
        const auto r = env.step(t % 2 ? left : right);
        ASSERT_FALSE(r.terminated) << "step " << t;
        ASSERT_EQ(r.truncated, t == 500) << "step " << t;
    }
    env.reset();
    env.set_state(0, 0, 0, 0);
    EXPECT_FALSE(env.step(left).truncated);  // reset starts a new count
}

TEST(CartPole, RejectsBadAction) {
    CartPole env;
    env.reset();
    EXPECT_THROW(env.step({2.0f}), std::invalid_argument);
}

TEST(Pendulum, AngleNormalizeLikePythonModulo) {
    EXPECT_NEAR(angle_normalize(0.0), 0.0, 1e-15);
    EXPECT_NEAR(angle_normalize(3 * std::numbers::pi / 2), -std::numbers::pi / 2, 1e-12);
    EXPECT_NEAR(angle_normalize(-3 * std::numbers::pi / 2), std::numbers::pi / 2, 1e-12);
    EXPECT_NEAR(angle_normalize(7.0), 7.0 - 2 * std::numbers::pi, 1e-12);
}

TEST(Pendulum, OneStepMatchesHandComputation) {
    Pendulum env;
    env.reset();
    env.set_state(1.0, 0.5);
    const auto r = env.step({1.5f});
    // newthdot = 0.5 + (3*10/2 * sin(1) + 3 * 1.5) * 0.05; newth = 1 + newthdot * 0.05
    const double newthdot = 0.5 + (15.0 * std::sin(1.0) + 4.5) * 0.05;
    EXPECT_DOUBLE_EQ(env.theta_dot(), newthdot);
    EXPECT_DOUBLE_EQ(env.theta(), 1.0 + newthdot * 0.05);
    EXPECT_DOUBLE_EQ(r.reward, -(1.0 + 0.1 * 0.25 + 0.001 * 2.25));
    ASSERT_EQ(r.obs.size(), 3u);
    EXPECT_FLOAT_EQ(r.obs[0], static_cast<float>(std::cos(1.0 + newthdot * 0.05)));
    EXPECT_FLOAT_EQ(r.obs[1], static_cast<float>(std::sin(1.0 + newthdot * 0.05)));
    EXPECT_FLOAT_EQ(r.obs[2], static_cast<float>(newthdot));
    EXPECT_FALSE(r.terminated);
}

TEST(Pendulum, ClipsTorqueAndSpeed) {
    Pendulum env;
    env.reset();
    env.set_state(-3.0, 7.9);  // angle_normalize(-3) = -3
    const auto r = env.step({10.0f});  // torque clipped to 2
    EXPECT_DOUBLE_EQ(r.reward, -(9.0 + 0.1 * 7.9 * 7.9 + 0.001 * 4.0));
    EXPECT_DOUBLE_EQ(env.theta_dot(), 8.0);  // 7.9 + (15 sin(-3) + 6) * 0.05 = 8.09.. -> 8
    EXPECT_DOUBLE_EQ(env.theta(), -3.0 + 8.0 * 0.05);
}

TEST(Pendulum, TruncatesAt200Steps) {
    Pendulum env;
    env.seed(1);
    env.reset();
    for (int t = 1; t <= 200; ++t) {
        const auto r = env.step({0.0f});
        ASSERT_FALSE(r.terminated);
        ASSERT_EQ(r.truncated, t == 200) << "step " << t;
    }
}

// Acrobot-v1 and MountainCarContinuous-v0: expected values are Gym's step()
// (its equations in numpy, float64) from the same states.

namespace {
void expect_acrobot(Acrobot& env, const double (&want)[4]) {
    for (int i = 0; i < 4; ++i) EXPECT_NEAR(env.state()[i], want[i], 1e-12) << "state " << i;
}
}  // namespace

TEST(Acrobot, OneStepMatchesGymRk4ForEachTorque) {
    const double want[3][4] = {
        {0.07554717015953656, -0.0945375159211389, 0.14812655958803767, -0.42998597715981185},
        {0.06229716776017948, -0.060277457483501294, 0.019654948489197577, -0.0958665640656959},
        {0.04903870635826079, -0.02600004511990665, -0.10899607843931322, 0.2386115189039908}};
    for (int a = 0; a < 3; ++a) {
        Acrobot env;
        env.reset();
        env.set_state(0.05, -0.03, 0.1, -0.2);
        const auto r = env.step({static_cast<float>(a)});
        expect_acrobot(env, want[a]);
        EXPECT_EQ(r.reward, -1.0);
        EXPECT_FALSE(r.terminated);
        ASSERT_EQ(r.obs.size(), 6u);
        EXPECT_FLOAT_EQ(r.obs[0], static_cast<float>(std::cos(want[a][0])));
        EXPECT_FLOAT_EQ(r.obs[3], static_cast<float>(std::sin(want[a][1])));
        EXPECT_FLOAT_EQ(r.obs[5], static_cast<float>(want[a][3]));
    }
}

TEST(Acrobot, FiftyStepsMatchGym) {
    Acrobot env;
    env.reset();
    env.set_state(0.05, -0.03, 0.1, -0.2);
    for (int i = 0; i < 50; ++i) env.step({(i / 10) % 2 == 0 ? 2.0f : 0.0f});
    expect_acrobot(env, {0.10019885349756019, 0.7646842394123019, -0.31757912324692916,
                         -1.4225331366301965});
}

TEST(Acrobot, WrapsAnglesAndTerminatesAboveTheLine) {
    Acrobot env;
    env.reset();
    env.set_state(3.1, 3.1, 12.5, 28.0);
    auto r = env.step({2.0f});
    expect_acrobot(env, {2.8871929559629104, 0.1458109968868282, 10.292316627071989,
                         18.38963025382496});
    EXPECT_TRUE(r.terminated);
    EXPECT_EQ(r.reward, 0.0);
    env.set_state(3.0, 0.0, 0.0, 0.0);
    r = env.step({1.0f});
    expect_acrobot(env, {2.982057837208604, 0.014002670518313741, -0.1834372653956761,
                         0.14511760679397961});
    EXPECT_TRUE(r.terminated);
}

TEST(Acrobot, ResetInPlusMinus01AndTruncatesAt500) {
    Acrobot env;
    env.seed(3);
    env.reset();
    for (int i = 0; i < 4; ++i) EXPECT_LE(std::fabs(env.state()[i]), 0.1);
    StepResult r;
    int steps = 0;
    do {
        env.set_state(0.0, 0.0, 0.0, 0.0);  // hangs down: never terminates
        r = env.step({1.0f});
        ++steps;
    } while (!r.truncated && !r.terminated && steps < 1000);
    EXPECT_TRUE(r.truncated);
    EXPECT_EQ(steps, 500);
    EXPECT_THROW(env.step({3.0f}), std::invalid_argument);
}

TEST(MountainCarContinuous, StepsMatchGym) {
    struct Case {
        double pos, vel, action, want_pos, want_vel, reward;
        bool terminated;
    };
    const Case cases[] = {
        {-0.5, 0.0, 1.0, -0.4986768364906311, 0.0013231569901108742, -0.1, false},
        {-1.19, -0.05, -1.0, -1.2000000476837158, 0.0, -0.1, false},  // left wall stops it
        {0.44, 0.02, 0.5, 0.4601295590400696, 0.02012956142425537, 99.975, true},
        {-0.3, 0.01, 2.0, -0.2900540232658386, 0.009945974685251713, -0.4, false},  // clipped force, unclipped cost
    };
    for (const auto& c : cases) {
        MountainCarContinuous env;
        env.reset();
        env.set_state(c.pos, c.vel);
        const auto r = env.step({static_cast<float>(c.action)});
        EXPECT_EQ(r.obs[0], static_cast<float>(c.want_pos)) << c.pos;
        EXPECT_EQ(r.obs[1], static_cast<float>(c.want_vel)) << c.pos;
        EXPECT_NEAR(r.reward, c.reward, 1e-12) << c.pos;
        EXPECT_EQ(r.terminated, c.terminated) << c.pos;
    }
}

TEST(MountainCarContinuous, HundredStepsMatchGym) {
    MountainCarContinuous env;
    env.reset();
    env.set_state(-0.5, 0.0);
    StepResult r;
    for (int i = 0; i < 100; ++i) r = env.step({(i / 20) % 2 == 0 ? 1.0f : -1.0f});
    EXPECT_EQ(r.obs[0], -0.3195765018463135f);
    EXPECT_EQ(r.obs[1], 0.009499246254563332f);
}

TEST(MountainCarContinuous, ResetAndTruncatesAt999) {
    MountainCarContinuous env;
    env.seed(5);
    const auto o = env.reset();
    EXPECT_GE(o[0], -0.6f);
    EXPECT_LE(o[0], -0.4f);
    EXPECT_EQ(o[1], 0.0f);
    StepResult r;
    int steps = 0;
    do {
        r = env.step({0.0f});
        ++steps;
    } while (!r.truncated && !r.terminated && steps < 2000);
    EXPECT_TRUE(r.truncated);
    EXPECT_EQ(steps, 999);
}

TEST(Envs, FactoryAndSpaces) {
    auto c = make_env("CartPole-v1");
    EXPECT_EQ(c->obs_dim(), 4);
    EXPECT_TRUE(c->action_space().discrete);
    EXPECT_EQ(c->action_space().n, 2);
    auto p = make_env("Pendulum-v1");
    EXPECT_EQ(p->obs_dim(), 3);
    EXPECT_FALSE(p->action_space().discrete);
    EXPECT_EQ(p->action_space().dim, 1);
    auto ac = make_env("Acrobot-v1");
    EXPECT_EQ(ac->obs_dim(), 6);
    EXPECT_EQ(ac->action_space().n, 3);
    auto mc = make_env("MountainCarContinuous-v0");
    EXPECT_EQ(mc->obs_dim(), 2);
    EXPECT_FALSE(mc->action_space().discrete);
    EXPECT_EQ(mc->action_space().dim, 1);
    EXPECT_THROW(make_env("MountainCar-v0"), std::invalid_argument);
}

TEST(Envs, SameSeedSameEpisode) {
    auto a = make_env("Pendulum-v1"), b = make_env("Pendulum-v1");
    a->seed(42);
    b->seed(42);
    EXPECT_EQ(a->reset(), b->reset());
    b->seed(43);
    EXPECT_NE(a->reset(), b->reset());
}

// A snapshot restored into a fresh environment continues exactly: the same
// observations, rewards and ends, through resets (the random engine carries over).
TEST(Envs, SnapshotContinuesExactly) {
    for (const auto& name : env_names()) {
        SCOPED_TRACE(name);
        auto a = make_env(name);
        a->seed(7);
        a->reset();
        const auto space = a->action_space();
        auto action = [&](int t) {
            return space.discrete ? std::vector<float>{static_cast<float>(t % space.n)}
                                  : std::vector<float>{static_cast<float>(0.3 * ((t % 3) - 1))};
        };
        for (int t = 0; t < 37; ++t) a->step(action(t));
        const Env::Snapshot snap = a->snapshot();
        auto b = make_env(name);  // unseeded: everything must come from the snapshot
        b->set_snapshot(snap);
        for (int t = 0; t < 1500; ++t) {
            const auto ra = a->step(action(t));
            const auto rb = b->step(action(t));
            ASSERT_EQ(ra.obs, rb.obs) << "step " << t;
            ASSERT_EQ(ra.reward, rb.reward);
            ASSERT_EQ(ra.terminated, rb.terminated);
            ASSERT_EQ(ra.truncated, rb.truncated);
            if (ra.terminated || ra.truncated) ASSERT_EQ(a->reset(), b->reset());
        }
    }
    auto cart = make_env("CartPole-v1");
    Env::Snapshot wrong;
    wrong.vars = {1.0, 2.0};
    EXPECT_THROW(cart->set_snapshot(wrong), std::invalid_argument);
}
