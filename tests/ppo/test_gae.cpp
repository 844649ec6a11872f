// GAE-lambda and rewards-to-go against a direct evaluation of their sums.
#include "gae.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

TEST(Gae, MatchesTheDefinition) {
    const std::vector<double> rew{1.0, 0.5, -2.0, 3.0, 0.0};
    const std::vector<double> val{0.2, -0.1, 0.7, 1.5, -0.4};
    const double gamma = 0.99, lam = 0.97, last = 2.5;
    const std::size_t n = rew.size();
    std::vector<double> adv(n), ret(n);
    ppo::gae_lambda(rew.data(), val.data(), n, last, gamma, lam, adv.data(), ret.data());

    auto v = [&](std::size_t t) { return t < n ? val[t] : last; };
    for (std::size_t t = 0; t < n; ++t) {
        double a = 0, r = 0;
        for (std::size_t k = t; k < n; ++k) {
            a += std::pow(gamma * lam, k - t) * (rew[k] + gamma * v(k + 1) - v(k));
            r += std::pow(gamma, k - t) * rew[k];
        }
        r += std::pow(gamma, n - t) * last;
        EXPECT_NEAR(adv[t], a, 1e-12) << "t=" << t;
        EXPECT_NEAR(ret[t], r, 1e-12) << "t=" << t;
    }
}

TEST(Gae, TerminalPathWithLambdaOneIsReturnMinusValue) {
    const std::vector<double> rew{1, 1, 1}, val{0.5, 0.25, 0.125};
    std::vector<double> adv(3), ret(3);
    ppo::gae_lambda(rew.data(), val.data(), 3, 0.0, 0.9, 1.0, adv.data(), ret.data());
    EXPECT_NEAR(ret[0], 1 + 0.9 + 0.81, 1e-12);
    EXPECT_NEAR(ret[2], 1.0, 1e-12);
    for (int t = 0; t < 3; ++t) EXPECT_NEAR(adv[t], ret[t] - val[t], 1e-12);
}
