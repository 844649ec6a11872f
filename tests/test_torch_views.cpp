// mpi_avg_grads with gradient_as_bucket_view: same training as the packed
// mode, gradients become views of node-shared buckets and stay views.
#include <mpiml/mpiml.hpp>
#include <mpiml/shm.hpp>
#include <mpiml/torch.hpp>

#include <gtest/gtest.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>

#include <cstdint>
#include <optional>
#include <vector>

namespace {

int rank() { return mpiml::proc_id(); }
int size() { return mpiml::num_procs(); }

struct NetImpl : torch::nn::Module {
    explicit NetImpl(torch::Dtype dtype) {
        l1 = register_module("l1", torch::nn::Linear(7, 33));
        l2 = register_module("l2", torch::nn::Linear(33, 3));
        scale = register_parameter("scale", torch::ones({}));
        frozen = register_parameter("frozen", torch::ones({5}), /*requires_grad=*/false);
        half = register_parameter("half", torch::ones({4}, torch::kHalf));  // packed path
        to(dtype);
        half.set_data(half.to(torch::kHalf));
    }
    torch::Tensor forward(const torch::Tensor& x) {
        return scale * l2(torch::tanh(l1(x))) + half.to(x.scalar_type()).sum();
    }
    torch::nn::Linear l1{nullptr}, l2{nullptr};
    torch::Tensor scale, frozen, half;
};
TORCH_MODULE(Net);

// A few SGD-with-momentum steps on rank-dependent data; returns the parameters.
// With `object`, through one mpiml::GradAverager instead of mpi_avg_grads.
std::vector<torch::Tensor> train(bool views, torch::Dtype dtype, bool set_to_none,
                                 bool object = false) {
    torch::manual_seed(1);
    Net net(dtype);
    mpiml::sync_params(net);
    torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    mpiml::AvgGradsOptions o;
    o.gradient_as_bucket_view = views;
    o.bucket_cap_bytes = 1024;  // several buckets
    std::optional<mpiml::GradAverager> avg;
    if (object) avg.emplace(net, o);
    for (int step = 0; step < 6; ++step) {
        torch::manual_seed(100 * step + rank());
        const auto x = torch::randn({16, 7}, dtype);
        const auto y = torch::randn({16, 3}, dtype);
        if (set_to_none && step % 2 == 1) {
            for (auto& p : net->parameters()) p.mutable_grad() = torch::Tensor();
        } else {
            opt.zero_grad();
        }
        torch::mse_loss(net->forward(x), y).backward();
        if (avg) (*avg)();
        else mpiml::mpi_avg_grads(net, o);
        opt.step();
    }
    std::vector<torch::Tensor> out;
    for (auto& p : net->parameters()) out.push_back(p.detach().clone());
    EXPECT_FALSE(net->frozen.grad().defined()) << "a parameter without gradients got one";
    return out;
}

void compare(torch::Dtype dtype, bool set_to_none, bool object = false) {
    const auto plain = train(false, dtype, set_to_none);
    const auto view = train(true, dtype, set_to_none, object);
    ASSERT_EQ(plain.size(), view.size());
    for (std::size_t i = 0; i < plain.size(); ++i) {
        if (size() <= 2)  // a sum of two does not depend on order: bit for bit
            EXPECT_TRUE(torch::equal(plain[i], view[i])) << "parameter " << i;
        else
            EXPECT_TRUE(torch::allclose(plain[i], view[i], 1e-5, 1e-6)) << "parameter " << i;
    }
}

TEST(TorchGradViews, TrainingEqualsPackedFloat32) { compare(torch::kFloat32, false); }
TEST(TorchGradViews, TrainingEqualsPackedFloat64) { compare(torch::kFloat64, false); }
TEST(TorchGradViews, GradientsSetToNoneAreRepacked) { compare(torch::kFloat32, true); }
TEST(GradAverager, ViewsEqualPackedFreeFunction) { compare(torch::kFloat32, true, true); }

TEST(GradAverager, PackedEqualsFreeFunctionBitForBit) {
    const auto free_fn = train(false, torch::kFloat64, false);
    const auto object = train(false, torch::kFloat64, false, true);
    ASSERT_EQ(free_fn.size(), object.size());
    for (std::size_t i = 0; i < free_fn.size(); ++i)
        EXPECT_TRUE(torch::equal(free_fn[i], object[i])) << "parameter " << i;
}

// Two models averaged in turn (a policy and a value net): each keeps its plan,
// so its gradients stay views of its own buckets, with the free function and
// with one GradAverager per model.
TEST(GradAverager, TwoModelsInTurnKeepTheirBuckets) {
    for (const bool object : {false, true}) {
        torch::manual_seed(4);
        auto a = torch::nn::Sequential(torch::nn::Linear(6, 9), torch::nn::Linear(9, 2));
        auto b = torch::nn::Sequential(torch::nn::Linear(5, 3));
        mpiml::sync_params(a);
        mpiml::sync_params(b);
        mpiml::AvgGradsOptions o;
        o.gradient_as_bucket_view = true;
        std::optional<mpiml::GradAverager> avg_a, avg_b;
        if (object) {
            avg_a.emplace(a, o);
            avg_b.emplace(b, o);
        }
        std::vector<const void*> first;
        for (int step = 0; step < 4; ++step) {
            for (auto* m : {&a, &b}) {
                for (auto& p : (*m)->parameters())
                    if (p.grad().defined()) p.grad().zero_();
            }
            a->forward(torch::full({2, 6}, 1.0 + rank())).sum().backward();
            b->forward(torch::full({3, 5}, 1.0 + rank())).sum().backward();
            if (object) {
                (*avg_a)();
                (*avg_b)();
            } else {
                mpiml::mpi_avg_grads(a, o);
                mpiml::mpi_avg_grads(b, o);
            }
            std::vector<const void*> now;
            for (auto* m : {&a, &b})
                for (auto& p : (*m)->parameters()) now.push_back(p.grad().data_ptr());
            if (step == 0) first = now;
            EXPECT_EQ(now, first) << "gradients moved (re-planned) at step " << step
                                  << (object ? " (GradAverager)" : " (mpi_avg_grads)");
            // Bias of b's layer: 3 rows, mean over ranks -> 3.
            EXPECT_FLOAT_EQ(b->parameters().back().grad()[0].item<float>(), 3.0f);
            EXPECT_FLOAT_EQ(a->parameters().back().grad()[0].item<float>(), 2.0f);
        }
    }
}

// A gradient still viewing a destroyed averager's bucket keeps the bucket;
// the next averager made on the same ranks frees it once no rank views it.
TEST(GradAverager, BucketsKeptForAViewAreFreedByTheNextAverager) {
    if (size() == 1) GTEST_SKIP() << "one rank makes no shared buckets";
    auto net = torch::nn::Sequential(torch::nn::Linear(6, 9), torch::nn::Linear(9, 2));
    mpiml::AvgGradsOptions o;
    o.gradient_as_bucket_view = true;
    const auto fill = [&] {
        for (auto& p : net->parameters()) p.mutable_grad() = torch::full_like(p, rank());
    };
    { mpiml::GradAverager first(net, o); }  // frees what earlier tests kept
    const std::size_t before = mpiml::detail::shared_bucket_count();
    at::Tensor held;
    {
        mpiml::GradAverager avg(net, o);
        fill();
        avg();
        held = net->parameters().front().grad();  // a view of its bucket
    }
    const std::size_t kept = mpiml::detail::shared_bucket_count();
    if (kept == before) GTEST_SKIP() << "no node-shared buckets on this path";
    {
        mpiml::GradAverager again(net, o);  // still viewed on every rank: kept
        fill();
        again();
    }
    EXPECT_EQ(mpiml::detail::shared_bucket_count(), kept);
    EXPECT_TRUE(held.equal(torch::full_like(held, (size() - 1) / 2.0)));
    held = at::Tensor();
    { mpiml::GradAverager third(net, o); }
    EXPECT_EQ(mpiml::detail::shared_bucket_count(), before);
}

TEST(GradAverager, ParameterListAndMove) {
    std::vector<torch::Tensor> ps = {torch::zeros({10}, torch::requires_grad()),
                                     torch::zeros({3}, torch::dtype(torch::kFloat64).requires_grad(true)),
                                     torch::zeros({2}, torch::requires_grad(false))};
    mpiml::GradAverager avg(ps);
    EXPECT_EQ(avg.size(), 2u);
    mpiml::GradAverager moved(std::move(avg));
    for (int step = 0; step < 3; ++step) {
        for (auto& p : ps)
            if (p.requires_grad()) p.mutable_grad() = torch::full_like(p, rank() + step);
        moved();
        EXPECT_TRUE(torch::allclose(ps[0].grad(), torch::full_like(ps[0], (size() - 1) / 2.0 + step)));
        EXPECT_TRUE(torch::allclose(ps[1].grad(), torch::full_like(ps[1], (size() - 1) / 2.0 + step)));
    }
    EXPECT_FALSE(ps[2].grad().defined());
}

TEST(TorchGradViews, GradientsStayViewsAcrossSteps) {
    torch::manual_seed(3);
    auto net = torch::nn::Sequential(torch::nn::Linear(10, 20), torch::nn::Linear(20, 1));
    mpiml::sync_params(net);
    mpiml::AvgGradsOptions o;
    o.gradient_as_bucket_view = true;
    std::vector<const void*> first;
    for (int step = 0; step < 3; ++step) {
        for (auto& p : net->parameters())
            if (p.grad().defined()) p.grad().zero_();
        net->forward(torch::full({4, 10}, 1.0 + rank())).sum().backward();
        mpiml::mpi_avg_grads(net, o);
        std::vector<const void*> now;
        for (auto& p : net->parameters()) now.push_back(p.grad().data_ptr());
        if (step == 0) first = now;
        EXPECT_EQ(now, first) << "gradients moved at step " << step;
        // The averaged bias gradient of the last layer: mean over ranks of 4.
        EXPECT_FLOAT_EQ(net->parameters().back().grad().item<float>(), 4.0f);
    }
}

TEST(TorchGradViews, NewParameterListReplans) {
    for (int k = 1; k <= 3; ++k) {
        std::vector<torch::Tensor> ps = {torch::zeros({k * 100}, torch::requires_grad()),
                                         torch::zeros({7, k}, torch::requires_grad())};
        for (auto& p : ps) p.mutable_grad() = torch::full_like(p, static_cast<double>(rank()));
        mpiml::AvgGradsOptions o;
        o.gradient_as_bucket_view = true;
        mpiml::mpi_avg_grads(ps, o);
        for (auto& p : ps)
            EXPECT_TRUE(torch::allclose(p.grad(), torch::full_like(p, (size() - 1) / 2.0)));
    }
}

}  // namespace
