// The update's kernels (apps/ppo/mlp.cpp, losses.cpp) against LibTorch:
// forward values and gradients against autograd, Adam against torch::optim::Adam.
#include "losses.hpp"
#include "mlp.hpp"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <vector>

namespace {

using torch::Tensor;

std::vector<float> to_vec(const Tensor& t) {
    const Tensor c = t.contiguous().to(torch::kFloat);
    return std::vector<float>(c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
}

void expect_close(const Tensor& want, const float* got, double tol, const char* what) {
    const auto w = to_vec(want);
    double scale = 0;
    for (float x : w) scale = std::max(scale, static_cast<double>(std::fabs(x)));
    for (std::size_t i = 0; i < w.size(); ++i)
        ASSERT_NEAR(got[i], w[i], tol * std::max(1.0, scale)) << what << " [" << i << "]";
}

/// A LibTorch MLP and the kernels over its parameters.
struct Pair {
    torch::nn::Sequential seq;
    ppo::Mlp mlp;
};

Pair make_pair(const std::vector<int>& sizes, ppo::Activation act) {
    torch::nn::Sequential seq;
    for (std::size_t j = 0; j + 1 < sizes.size(); ++j) {
        seq->push_back(torch::nn::Linear(sizes[j], sizes[j + 1]));
        if (j + 2 < sizes.size()) {
            if (act == ppo::Activation::tanh)
                seq->push_back(torch::nn::Tanh());
            else
                seq->push_back(torch::nn::ReLU());
        }
    }
    std::vector<ppo::LinearRef> layers;
    for (const auto& m : seq->children())
        if (auto* lin = m->as<torch::nn::Linear>()) {
            lin->weight.mutable_grad() = torch::zeros_like(lin->weight);
            lin->bias.mutable_grad() = torch::zeros_like(lin->bias);
            layers.push_back({static_cast<int>(lin->weight.size(1)),
                              static_cast<int>(lin->weight.size(0)),
                              lin->weight.data_ptr<float>(), lin->bias.data_ptr<float>(),
                              lin->weight.mutable_grad().data_ptr<float>(),
                              lin->bias.mutable_grad().data_ptr<float>()});
        }
    return {seq, ppo::Mlp(std::move(layers), act)};
}

/// Runs the kernels' forward and backward (dy), then autograd's, and compares
/// outputs and every parameter gradient.
void check_mlp(ppo::Activation act, int n) {
    torch::manual_seed(1);
    auto p = make_pair({5, 64, 32, 3}, act);
    const Tensor x = torch::randn({n, 5});
    const Tensor dy = torch::randn({n, 3});
    const float* y = p.mlp.forward(x.data_ptr<float>(), n);
    p.mlp.backward(dy.data_ptr<float>());
    std::vector<std::vector<float>> mine;
    for (const auto& t : p.seq->parameters()) mine.push_back(to_vec(t.grad()));

    for (auto& t : p.seq->parameters()) t.mutable_grad() = Tensor();
    const Tensor ref = p.seq->forward(x);
    expect_close(ref, y, 2e-6, "output");
    (ref * dy).sum().backward();
    std::size_t k = 0;
    for (const auto& t : p.seq->parameters())
        expect_close(t.grad(), mine[k++].data(), 2e-5, "grad");
}

TEST(Mlp, TanhMatchesAutograd) { check_mlp(ppo::Activation::tanh, 300); }
TEST(Mlp, ReluMatchesAutograd) { check_mlp(ppo::Activation::relu, 300); }
TEST(Mlp, OneRowMatchesAutograd) { check_mlp(ppo::Activation::tanh, 1); }

TEST(Mlp, TanhIsAccurate) {
    std::vector<float> x;
    for (float v = -12.0f; v <= 12.0f; v += 1e-3f) x.push_back(v);
    x.push_back(0.0f);
    x.push_back(1e-30f);
    std::vector<float> y = x;
    ppo::tanh_inplace(y.data(), y.size());
    for (std::size_t i = 0; i < x.size(); ++i)
        // The fit's worst error is 3.3e-7 (near x = -8.2, about 6 float ulps
        // of 1) with separate multiplies and adds, 2.5e-7 with FMA.
        ASSERT_NEAR(y[i], std::tanh(static_cast<double>(x[i])), 4e-7) << "x = " << x[i];
}

TEST(Mlp, LayerSizesMustChain) {
    float w[4] = {}, b[2] = {};
    EXPECT_THROW(ppo::Mlp({{2, 2, w, b, w, b}, {3, 1, w, b, w, b}}, ppo::Activation::tanh),
                 std::invalid_argument);
}

/// Spinning Up's compute_loss_pi with autograd, against ppo::loss_pi.
void check_loss_pi(bool discrete, bool vpg) {
    torch::manual_seed(2);
    const int n = 500, m = discrete ? 3 : 2;
    const Tensor y = torch::randn({n, m}).requires_grad_(true);
    const Tensor log_std = torch::full({m}, -0.5).requires_grad_(true);
    ppo::Batch b;
    b.n = n;
    Tensor act = discrete ? torch::randint(0, m, {n}) : torch::randn({n, m});
    b.act = to_vec(act);
    b.adv = to_vec(torch::randn({n}));
    Tensor logp, ent;
    if (discrete) {
        const Tensor lsm = torch::log_softmax(y, -1);
        logp = lsm.gather(-1, act.to(torch::kLong).unsqueeze(-1)).squeeze(-1);
        ent = -(lsm.exp() * lsm).sum(-1).mean();
    } else {
        const Tensor z = (act - y) * torch::exp(-log_std);
        logp = (-0.5 * z * z - log_std - ppo::half_log_2pi).sum(-1);
        ent = (0.5 + ppo::half_log_2pi + log_std).mean();
    }
    // Old log-probabilities a little off, so that some ratios leave the clip range.
    const Tensor logp_old = logp.detach() + 0.3 * torch::randn({n});
    b.logp = to_vec(logp_old);
    const Tensor adv = torch::tensor(b.adv);
    const double clip = 0.2;
    Tensor loss, cf;
    if (vpg) {
        loss = -(logp * adv).mean();
    } else {
        const Tensor ratio = torch::exp(logp - logp_old);
        const Tensor clip_adv = torch::clamp(ratio, 1 - clip, 1 + clip) * adv;
        loss = -torch::min(ratio * adv, clip_adv).mean();
        cf = ((ratio > 1 + clip) | (ratio < 1 - clip)).to(torch::kFloat).mean();
        ASSERT_GT(cf.item<double>(), 0.05);
    }
    loss.backward();

    std::vector<float> log_std_grad(m, 0.0f);
    const auto ls = to_vec(log_std.detach());
    ppo::PolicyHead head{discrete, m, ls.data(), log_std_grad.data()};
    std::vector<float> dy;
    const auto yv = to_vec(y.detach());
    const ppo::PiInfo info = vpg ? ppo::loss_pi_vpg(yv.data(), b, head, dy)
                                 : ppo::loss_pi(yv.data(), b, head, clip, dy);
    EXPECT_NEAR(info.loss, loss.item<double>(), 1e-5);
    EXPECT_NEAR(info.kl, (logp_old - logp).mean().item<double>(), 1e-5);
    EXPECT_NEAR(info.ent, ent.item<double>(), 1e-5);
    if (!vpg) EXPECT_NEAR(info.cf, cf.item<double>(), 1e-6);
    expect_close(y.grad(), dy.data(), 1e-6, "dLoss/dy");
    if (!discrete) expect_close(log_std.grad(), log_std_grad.data(), 1e-5, "dLoss/dlog_std");
}

TEST(Losses, PpoCategoricalMatchesAutograd) { check_loss_pi(true, false); }
TEST(Losses, PpoGaussianMatchesAutograd) { check_loss_pi(false, false); }
TEST(Losses, VpgCategoricalMatchesAutograd) { check_loss_pi(true, true); }
TEST(Losses, VpgGaussianMatchesAutograd) { check_loss_pi(false, true); }

TEST(Losses, ValueMatchesAutograd) {
    torch::manual_seed(3);
    const int n = 400;
    const Tensor v = torch::randn({n}).requires_grad_(true);
    ppo::Batch b;
    b.n = n;
    b.ret = to_vec(torch::randn({n}) * 10);
    const Tensor loss = (v - torch::tensor(b.ret)).pow(2).mean();
    loss.backward();
    std::vector<float> dv;
    const auto vv = to_vec(v.detach());
    EXPECT_NEAR(ppo::loss_v(vv.data(), b, dv), loss.item<double>(), 1e-4 * loss.item<double>());
    expect_close(v.grad(), dv.data(), 1e-6, "dLoss/dv");
}

TEST(Adam, MatchesLibTorch) {
    torch::manual_seed(4);
    Tensor a = torch::randn({7, 5}), b = a.clone();
    a.requires_grad_(true);
    torch::optim::Adam ref({a}, torch::optim::AdamOptions(3e-4));
    b.mutable_grad() = torch::zeros_like(b);
    ppo::Adam mine({{b.data_ptr<float>(), b.mutable_grad().data_ptr<float>(), 35}}, 3e-4);
    for (int step = 0; step < 20; ++step) {
        const Tensor g = torch::randn({7, 5});
        a.mutable_grad() = g.clone();
        b.mutable_grad().copy_(g);
        ref.step();
        mine.step();
    }
    expect_close(a.detach(), b.data_ptr<float>(), 1e-6, "parameters");
}

}  // namespace
