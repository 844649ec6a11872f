// mpiml::torch under mpirun: data-parallel training equals one process on the
// whole batch, plus every edge case of sync_params / mpi_avg_grads / mpi_avg.
#include <mpiml/mpiml.hpp>
#include <mpiml/torch.hpp>

#include "expect_error.hpp"

#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>

#include <cstdio>
#include <string>
#include <thread>
#include <vector>

namespace {

int rank() { return mpiml::proc_id(); }
int size() { return mpiml::num_procs(); }

/// Small net with a 0-d parameter.
struct NetImpl : torch::nn::Module {
    NetImpl() {
        l1 = register_module("l1", torch::nn::Linear(5, 8));
        l2 = register_module("l2", torch::nn::Linear(8, 2));
        scale = register_parameter("scale", torch::ones({}));
    }
    torch::Tensor forward(const torch::Tensor& x) { return scale * l2(torch::tanh(l1(x))); }
    torch::nn::Linear l1{nullptr}, l2{nullptr};
    torch::Tensor scale;
};
TORCH_MODULE(Net);

Net make_net(int seed, torch::Dtype dtype) {
    torch::manual_seed(seed);
    Net net;
    net->to(dtype);
    return net;
}

double max_abs_diff(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
    EXPECT_EQ(a.size(), b.size());
    double m = 0;
    for (std::size_t i = 0; i < a.size() && i < b.size(); ++i)
        m = std::max(m, (a[i] - b[i]).abs().max().item<double>());
    return m;
}

using mpiml_test::expect_error;

// ------------------------------------------------ the key equivalence test

void train_and_compare(torch::Dtype dtype, double tol, const mpiml::AvgGradsOptions& plan = {}) {
    constexpr int batch = 12, steps = 20;
    const int n = size(), r = rank();
    ASSERT_EQ(batch % n, 0);
    torch::manual_seed(99);
    const auto x = torch::randn({batch, 5}).to(dtype);
    const auto y = torch::randn({batch, 2}).to(dtype);

    Net net = make_net(1000 + r, dtype);  // different initial weights per rank
    Net ref = make_net(1000, dtype);      // one process: rank 0's initial weights
    if (n > 1 && r != 0) EXPECT_GT(max_abs_diff(net->parameters(), ref->parameters()), 0.0);
    mpiml::sync_params(net);
    EXPECT_EQ(max_abs_diff(net->parameters(), ref->parameters()), 0.0);

    const int per = batch / n;
    const auto xs = x.narrow(0, r * per, per), ys = y.narrow(0, r * per, per);
    torch::optim::Adam opt(net->parameters(), torch::optim::AdamOptions(1e-2));
    torch::optim::Adam ref_opt(ref->parameters(), torch::optim::AdamOptions(1e-2));
    for (int step = 0; step < steps; ++step) {
        opt.zero_grad();
        torch::nn::functional::mse_loss(net(xs), ys).backward();
        mpiml::mpi_avg_grads(net, plan);
        opt.step();

        ref_opt.zero_grad();
        torch::nn::functional::mse_loss(ref(x), y).backward();
        ref_opt.step();
    }
    for (const auto& p : net->parameters()) EXPECT_EQ(p.scalar_type(), dtype);
    const double diff = max_abs_diff(net->parameters(), ref->parameters());
    EXPECT_LT(diff, tol) << "ranks " << n;
    if (r == 0) std::printf("  max |data-parallel - one process| = %.3g\n", diff);
    // Training moved the weights, so the comparison means something.
    EXPECT_GT(max_abs_diff(net->parameters(), make_net(1000, dtype)->parameters()), 1e-3);
}

TEST(TorchTraining, EqualsOneProcessFloat64) { train_and_compare(torch::kFloat64, 1e-10); }
TEST(TorchTraining, EqualsOneProcessFloat32) { train_and_compare(torch::kFloat32, 1e-5); }
TEST(TorchTraining, EqualsOneProcessDirectBuckets) {
    train_and_compare(torch::kFloat32, 1e-5, {0});  // every gradient direct
}
TEST(TorchTraining, EqualsOneProcessWithBucketViews) {
    train_and_compare(torch::kFloat64, 1e-10, {25u << 20, true});
}

// ------------------------------------------------------------ sync_params

TEST(TorchSync, ModuleMismatchShapeThrowsEverywhere) {
    if (size() == 1) GTEST_SKIP() << "needs 2+ ranks";
    const bool odd = rank() == size() - 1;
    torch::nn::Sequential m(torch::nn::Linear(4, 3), torch::nn::Linear(3, odd ? 1 : 2));
    const std::string odd_rank = "rank " + std::to_string(size() - 1);
    expect_error([&] { mpiml::sync_params(m); },
                 {"mpiml::sync_params", "'1.weight'", odd_rank, "float32[1, 3]", "float32[2, 3]"});
    // Still in step: the next collective works on every rank.
    torch::nn::Linear ok(2, 2);
    EXPECT_NO_THROW(mpiml::sync_params(ok));
}

TEST(TorchSync, ModuleMismatchCountAndDtypeThrowEverywhere) {
    if (size() == 1) GTEST_SKIP() << "needs 2+ ranks";
    const bool odd = rank() == 1;
    torch::nn::Sequential a(torch::nn::Linear(2, 2));
    if (odd) a->push_back(torch::nn::Linear(2, 2));
    expect_error([&] { mpiml::sync_params(a); }, {"'1.weight'", "rank 1", "nothing"});

    torch::nn::Linear b(3, 3);
    if (odd) b->to(torch::kFloat64);
    expect_error([&] { mpiml::sync_params(b); }, {"'weight'", "rank 1", "float64[3, 3]"});

    torch::nn::Linear c(3, 3);
    expect_error([&] { mpiml::sync_params(c, /*root=*/rank() % 2); }, {"root"});
    EXPECT_NO_THROW(mpiml::sync_params(c));
}

TEST(TorchSync, BuffersAndRootRank) {
    torch::nn::BatchNorm1d bn(3);
    torch::NoGradGuard no_grad;
    bn->running_mean.fill_(rank() + 1);
    bn->running_var.fill_(10 * (rank() + 1));
    bn->num_batches_tracked.fill_(rank() + 7);
    bn->weight.fill_(-rank());
    const int root = size() - 1;
    mpiml::sync_params(bn, root);
    EXPECT_TRUE(bn->running_mean.equal(torch::full({3}, root + 1.0)));
    EXPECT_TRUE(bn->running_var.equal(torch::full({3}, 10.0 * (root + 1))));
    EXPECT_EQ(bn->num_batches_tracked.item<std::int64_t>(), root + 7);
    EXPECT_TRUE(bn->weight.equal(torch::full({3}, -double(root))));
}

TEST(TorchSync, TensorAndListOverloads) {
    auto t = torch::full({2, 2}, double(rank()), torch::kFloat64);
    mpiml::sync_params(t);
    EXPECT_TRUE(t.equal(torch::zeros({2, 2}, torch::kFloat64)));

    // Mixed dtypes, a non-contiguous view, float16 and bfloat16 bit copies.
    auto base = torch::full({3, 2}, rank() + 0.5);
    std::vector<torch::Tensor> list = {
        base.t(), torch::full({4}, rank(), torch::kInt64), torch::full({3}, rank() + 0.25, torch::kHalf),
        torch::full({3}, rank() + 0.5, torch::kBFloat16), torch::full({}, rank() * 2.0)};
    mpiml::sync_params(list);
    EXPECT_TRUE(base.equal(torch::full({3, 2}, 0.5)));
    EXPECT_TRUE(list[1].equal(torch::zeros({4}, torch::kInt64)));
    EXPECT_TRUE(list[2].equal(torch::full({3}, 0.25, torch::kHalf)));
    EXPECT_TRUE(list[3].equal(torch::full({3}, 0.5, torch::kBFloat16)));
    EXPECT_EQ(list[4].item<float>(), 0.0f);
}

// Large tensors go on their own (in place when contiguous), small ones in
// buckets of a few MiB: a mix exercising both, with distinct values per element.
TEST(TorchSync, LargeTensorsAndManyBuckets) {
    const int root = size() - 1;
    auto values = [](torch::Tensor t, int r) {
        torch::NoGradGuard no_grad;
        t.copy_(torch::arange(t.numel(), torch::kFloat64).reshape(t.sizes()) * 0.5 + 1000.0 * r);
    };
    std::vector<torch::Tensor> list;
    auto big = torch::empty({512, 600});                        // 1.2 MB, in place
    auto big_t = torch::empty({700, 500}, torch::kFloat64).t();  // 2.8 MB, not contiguous
    list.push_back(big);
    list.push_back(big_t);
    for (int i = 0; i < 90; ++i) list.push_back(torch::empty({200, 250}));  // 200 KB each: 18 MB
    list.push_back(torch::empty({3}, torch::kInt32));
    std::vector<torch::Tensor> want;
    for (auto& t : list) {
        values(t, root);
        want.push_back(t.clone());
        values(t, rank());
    }
    mpiml::sync_params(list, root);
    for (std::size_t i = 0; i < list.size(); ++i)
        ASSERT_TRUE(list[i].equal(want[i])) << "tensor " << i << " differs from rank " << root << "'s";
    EXPECT_FALSE(big_t.is_contiguous());
}

// --------------------------------------------------------- mpi_avg_grads

double mean_of_ranks(double per_rank_scale) {  // mean over r of scale * (r + 1)
    return per_rank_scale * (size() + 1) / 2.0;
}

TEST(TorchAvgGrads, Float64KeepsPrecision) {
    auto p = torch::zeros({5}, torch::kFloat64).requires_grad_();
    p.mutable_grad() = torch::full({5}, 1.0 + 1e-12 * rank(), torch::kFloat64);
    mpiml::mpi_avg_grads(std::vector<torch::Tensor>{p});
    EXPECT_EQ(p.grad().scalar_type(), torch::kFloat64);
    const double want = 1.0 + 1e-12 * (size() - 1) / 2.0;
    EXPECT_NEAR((p.grad() - want).abs().max().item<double>(), 0.0, 1e-15);
}

TEST(TorchAvgGrads, HalfAndBFloat16ReduceInFloat32) {
    for (auto dtype : {torch::kHalf, torch::kBFloat16}) {
        auto p = torch::zeros({7}, dtype).requires_grad_();
        p.mutable_grad() = torch::full({7}, rank() + 1.0, dtype);
        auto q = torch::zeros({3}, torch::kFloat32).requires_grad_();
        q.mutable_grad() = torch::full({3}, 2.0 * (rank() + 1));
        mpiml::mpi_avg_grads(std::vector<torch::Tensor>{p, q});
        EXPECT_EQ(p.grad().scalar_type(), dtype);
        EXPECT_TRUE(p.grad().equal(torch::full({7}, mean_of_ranks(1), dtype)));
        EXPECT_TRUE(q.grad().equal(torch::full({3}, mean_of_ranks(2))));
    }
}

TEST(TorchAvgGrads, ZeroDimParameter) {
    auto p = torch::tensor(2.0).requires_grad_();
    (p * p * (rank() + 1)).backward();  // d/dp = 4 (rank + 1)
    mpiml::mpi_avg_grads(std::vector<torch::Tensor>{p});
    EXPECT_EQ(p.grad().dim(), 0);
    EXPECT_DOUBLE_EQ(p.grad().item<double>(), mean_of_ranks(4));
}

/// Bucket plans worth covering: defaults (all fused), cap 0 (every gradient
/// direct, reduced in place), caps that mix direct and fused buckets, and
/// gradients as views of shared buckets.
std::vector<mpiml::AvgGradsOptions> plans() {
    return {{}, {0}, {8}, {20}, {40}, {25u << 20, true}};
}

std::string plan_name(const mpiml::AvgGradsOptions& o) {
    return "cap " + std::to_string(o.bucket_cap_bytes) +
           (o.gradient_as_bucket_view ? " views" : "");
}

TEST(TorchAvgGrads, UndefinedOnOneRankCountsAsZero) {
  for (const auto& plan : plans()) {
    SCOPED_TRACE(plan_name(plan));
    auto a = torch::zeros({4}).requires_grad_();
    auto b = torch::zeros({2}).requires_grad_();
    auto never = torch::zeros({3}).requires_grad_();
    if (rank() != 0) a.mutable_grad() = torch::full({4}, double(rank()));
    b.mutable_grad() = torch::full({2}, rank() + 1.0);
    mpiml::mpi_avg_grads(std::vector<torch::Tensor>{a, never, b}, plan);
    if (size() == 1) {
        EXPECT_FALSE(a.grad().defined());  // one rank: nothing to do
    } else {
        ASSERT_TRUE(a.grad().defined());
        const double want = (size() - 1) * size() / 2.0 / size();  // sum of 1..n-1, over n
        EXPECT_TRUE(a.grad().allclose(torch::full({4}, want)));
    }
    EXPECT_FALSE(never.grad().defined());  // undefined everywhere: stays undefined
    EXPECT_TRUE(b.grad().equal(torch::full({2}, mean_of_ranks(1))));
  }
}

TEST(TorchAvgGrads, FrozenParametersAreSkipped) {
    auto frozen = torch::zeros({3});  // requires_grad false
    frozen.mutable_grad() = torch::full({3}, rank() + 1.0);
    auto p = torch::zeros({2}).requires_grad_();
    p.mutable_grad() = torch::full({2}, rank() + 1.0);
    mpiml::mpi_avg_grads(std::vector<torch::Tensor>{frozen, p});
    EXPECT_TRUE(frozen.grad().equal(torch::full({3}, rank() + 1.0)));
    EXPECT_TRUE(p.grad().equal(torch::full({2}, mean_of_ranks(1))));
}

TEST(TorchAvgGrads, NonContiguousGradientKeepsItsLayout) {
  for (const auto& plan : plans()) {
    SCOPED_TRACE(plan_name(plan));
    auto p = torch::zeros({2, 3}).requires_grad_();
    const auto pattern = torch::arange(6, torch::kFloat32).reshape({3, 2}).t();
    p.mutable_grad() = pattern * (rank() + 1);
    ASSERT_FALSE(p.grad().is_contiguous());
    auto q = torch::zeros({3}, torch::kFloat64).requires_grad_();  // contiguous, in place
    q.mutable_grad() = torch::full({3}, rank() + 1.0, torch::kFloat64);
    const void* data = p.grad().data_ptr();
    const void* qdata = q.grad().data_ptr();
    mpiml::mpi_avg_grads(std::vector<torch::Tensor>{p, q}, plan);
    if (!plan.gradient_as_bucket_view || size() == 1) {  // in place, layout kept
        EXPECT_EQ(p.grad().data_ptr(), data);
        EXPECT_EQ(q.grad().data_ptr(), qdata);
        EXPECT_FALSE(p.grad().is_contiguous());
    }
    EXPECT_TRUE(p.grad().allclose(pattern * mean_of_ranks(1)));
    EXPECT_TRUE(q.grad().allclose(torch::full({3}, mean_of_ranks(1), torch::kFloat64)));
  }
}

TEST(TorchAvgGrads, BucketCapSmallerThanTensors) {
    for (const auto& plan : plans()) {
        torch::nn::Sequential m(torch::nn::Linear(4, 6), torch::nn::Linear(6, 2));
        m[1]->to(torch::kFloat64);  // two wire dtypes interleaved with buckets
        auto params = m->parameters();
        for (std::size_t i = 0; i < params.size(); ++i)
            params[i].mutable_grad() = torch::full_like(params[i], (i + 1.0) * (rank() + 1));
        mpiml::mpi_avg_grads(m, plan);
        for (std::size_t i = 0; i < params.size(); ++i)
            EXPECT_TRUE(params[i].grad().allclose(torch::full_like(params[i], mean_of_ranks(i + 1.0))))
                << plan_name(plan) << " param " << i;
    }
}

TEST(TorchAvgGrads, GradientViewsSurviveEveryZeroGrad) {
    if (size() == 1) GTEST_SKIP() << "one rank: no-op";
    Net net = make_net(7, torch::kFloat32);
    torch::optim::Adam opt(net->parameters(), torch::optim::AdamOptions(1e-3));
    mpiml::AvgGradsOptions views;
    views.gradient_as_bucket_view = true;
    const auto x = torch::full({4, 5}, rank() + 1.0);
    auto step = [&](int zero_mode) {
        if (zero_mode == 0) opt.zero_grad();          // in place
        else if (zero_mode == 1) net->zero_grad();    // detach + zero
        else net->zero_grad(/*set_to_none=*/true);    // fresh gradients
        net(x).sum().backward();
        // Expected: the mean of every rank's own gradient.
        std::vector<torch::Tensor> own;
        for (const auto& p : net->parameters()) own.push_back(p.grad().clone());
        std::vector<torch::Tensor> want;
        for (const auto& g : own) want.push_back(mpiml::mpi_avg(g));
        mpiml::mpi_avg_grads(net, views);
        const auto params = net->parameters();
        for (std::size_t i = 0; i < params.size(); ++i)
            EXPECT_TRUE(params[i].grad().allclose(want[i], 1e-6, 1e-6)) << "param " << i;
    };
    step(0);  // gradients move into the bucket
    std::vector<const void*> where;
    for (const auto& p : net->parameters()) where.push_back(p.grad().data_ptr());
    for (int mode : {0, 1, 0}) {
        step(mode);  // backward accumulated into the bucket: same memory
        const auto params = net->parameters();
        for (std::size_t i = 0; i < params.size(); ++i)
            EXPECT_EQ(params[i].grad().data_ptr(), where[i]) << "mode " << mode << " param " << i;
    }
    step(2);  // set_to_none: new gradients, still averaged
    step(0);
}

// A sparse gradient stays sparse (SparseAdam), over the rows any rank had.
TEST(TorchAvgGrads, SparseGradientStaysSparse) {
    torch::nn::Embedding emb(torch::nn::EmbeddingOptions(4, 2).sparse(true));
  for (const auto& plan : {mpiml::AvgGradsOptions{}, mpiml::AvgGradsOptions{0}}) {
    SCOPED_TRACE(plan_name(plan));
    emb->weight.mutable_grad().reset();
    emb(torch::tensor({int64_t(rank() % 4)})).sum().backward();
    ASSERT_TRUE(emb->weight.grad().is_sparse());
    mpiml::mpi_avg_grads(emb, plan);
    const auto g = emb->weight.grad();
    ASSERT_TRUE(g.is_sparse());
    EXPECT_EQ(g.sparse_dim(), 1);
    auto want = torch::zeros({4, 2});
    for (int r = 0; r < size(); ++r) want[r % 4] += 1.0 / size();
    EXPECT_TRUE(g.to_dense().allclose(want));
  }
}

TEST(TorchAvgGrads, OneRankIsANoOp) {
    if (size() != 1) GTEST_SKIP() << "one rank only";
    auto p = torch::zeros({2, 3}).requires_grad_();
    p.mutable_grad() = torch::arange(6, torch::kFloat32).reshape({3, 2}).t();
    const auto before = p.grad().clone();
    const void* data = p.grad().data_ptr();
    mpiml::mpi_avg_grads(std::vector<torch::Tensor>{p});
    EXPECT_EQ(p.grad().data_ptr(), data);
    EXPECT_TRUE(p.grad().equal(before));
}

TEST(TorchAvgGrads, LocalBadGradientThrowsOnlyThereWithoutHang) {
    auto p = torch::zeros({4}).requires_grad_();
    p.mutable_grad() = rank() == 0 ? torch::ones({5}) : torch::ones({4});
    if (size() == 1) GTEST_SKIP() << "needs 2+ ranks (one rank: a no-op, nothing is read)";
    if (rank() == 0)
        expect_error([&] { mpiml::mpi_avg_grads(std::vector<torch::Tensor>{p}); },
                     {"mpiml::mpi_avg_grads", "5 elements"});
    else
        EXPECT_NO_THROW(mpiml::mpi_avg_grads(std::vector<torch::Tensor>{p}));
    mpiml::barrier();
}

TEST(TorchAvgGrads, OverlapNeedsSerializedThreads) {
    // This program starts MPI at the Session default, MPI_THREAD_FUNNELED.
    if (size() == 1) GTEST_SKIP() << "one rank: no communication thread";
    torch::nn::Linear m(3, 3);
    mpiml::AvgGradsOptions o;
    o.overlap = true;
    expect_error([&] { mpiml::GradAverager avg(m, o); },
                 {"mpiml::GradAverager", "MPI_THREAD_SERIALIZED", "MPI_THREAD_FUNNELED"});
}

// GradAverager's buckets are planned for the parameters it was made with: a
// model changed since is an error at the call, after its collectives (no rank
// left waiting), never a gradient packed at another width or left out.
TEST(TorchAvgGrads, GradAveragerOfAChangedModelThrowsAtTheCall) {
    if (size() == 1) GTEST_SKIP() << "one rank: nothing is averaged";
    const auto fill = [](torch::nn::Module& m) {
        for (auto& p : m.parameters()) p.mutable_grad() = torch::ones_like(p);
    };
    for (const bool views : {false, true}) {
        SCOPED_TRACE(views ? "gradient_as_bucket_view" : "packed");
        mpiml::AvgGradsOptions o;
        o.gradient_as_bucket_view = views;
        torch::nn::Sequential m(torch::nn::Linear(3, 4), torch::nn::Linear(4, 2));
        {
            mpiml::GradAverager avg(m, o);
            m->to(torch::kFloat64);
            fill(*m);
            expect_error([&] { avg(); }, {"mpiml::GradAverager", "rank", "parameter #0 '0.weight'",
                                          "float64 of", "but was float32 of"});
            m->to(torch::kFloat32);
        }
        {
            mpiml::GradAverager avg(m, o);
            m->push_back(torch::nn::Linear(2, 2));
            fill(*m);
            expect_error([&] { avg(); }, {"mpiml::GradAverager", "parameter #4 '2.weight'", "(added since)"});
        }
        {
            auto bias = m[0]->as<torch::nn::Linear>()->bias;
            bias.requires_grad_(false);
            mpiml::GradAverager avg(m, o);
            bias.requires_grad_(true);
            fill(*m);
            expect_error([&] { avg(); },
                         {"mpiml::GradAverager", "parameter #1 '0.bias'", "did not require grad"});
            // Made again, it averages the model as it is now.
            mpiml::GradAverager again(m, o);
            for (auto& p : m->parameters()) p.mutable_grad() = torch::full_like(p, rank());
            again();
            for (auto& p : m->parameters())
                EXPECT_TRUE(p.grad().equal(torch::full_like(p, (size() - 1) / 2.0)));
        }
    }
}

// mpiml::set_check(true) while it lives; rank 1's Linear has another shape.
struct MismatchedModule {
    const bool was = mpiml::check_enabled();
    torch::nn::Linear m{3, rank() == 1 ? 4 : 3};
    MismatchedModule() {
        mpiml::set_check(true);
        for (auto& p : m->parameters()) p.mutable_grad() = torch::ones_like(p);
    }
    ~MismatchedModule() { mpiml::set_check(was); }
};

TEST(TorchAvgGrads, MismatchIsCaughtWhenChecksAreOn) {
    if (size() == 1) GTEST_SKIP() << "needs 2+ ranks";
    MismatchedModule mm;
    expect_error([&] { mpiml::mpi_avg_grads(mm.m); }, {"mpiml::mpi_avg_grads", "'weight'", "rank 1"});
}

// A module mismatch names each rank's call site: the line that called the
// helper (a defaulted std::source_location), as the collectives do.
TEST(TorchAvgGrads, MismatchNamesTheCallSite) {
    if (size() == 1) GTEST_SKIP() << "needs 2+ ranks";
    MismatchedModule mm;
    auto& m = mm.m;
    const auto at = [](int line) { return "called at " + std::string(__FILE__) + ":" + std::to_string(line); };
    const int avg_line = __LINE__ + 1;
    expect_error([&] { mpiml::mpi_avg_grads(m); }, {"mpiml::mpi_avg_grads", "'weight'", at(avg_line)});
    const int sync_line = __LINE__ + 1;
    expect_error([&] { mpiml::sync_params(m); }, {"mpiml::sync_params", at(sync_line)});
    const int make_line = __LINE__ + 1;
    expect_error([&] { mpiml::GradAverager avg(m); }, {"mpiml::GradAverager", at(make_line)});
}

// A GradAverager compares its parameters' names, shapes and dtypes across
// ranks at construction, checks on or off: models of the same total size but
// other shapes would be averaged element by element without an error.
TEST(GradAverager, ShapesThatDifferAreAnErrorWithChecksOff) {
    if (size() == 1) GTEST_SKIP() << "needs 2+ ranks";
    const bool was = mpiml::check_enabled();
    mpiml::set_check(false);
    const bool last = rank() == size() - 1;
    torch::nn::Linear m(torch::nn::LinearOptions(last ? 3 : 2, last ? 4 : 6).bias(false));  // 12 each
    const int line = __LINE__ + 1;
    expect_error([&] { mpiml::GradAverager avg(m); },
                 {"mpiml::GradAverager on rank " + std::to_string(rank()) + "/", "'weight'", "[4, 3]",
                  "rank " + std::to_string(size() - 1),
                  "called at " + std::string(__FILE__) + ":" + std::to_string(line)});
    auto p = torch::ones(last ? std::vector<std::int64_t>{3, 4} : std::vector<std::int64_t>{2, 6},
                         last ? torch::kFloat64 : torch::kFloat32).requires_grad_();
    expect_error([&] { mpiml::GradAverager avg(std::vector<torch::Tensor>{p}); },
                 {"mpiml::GradAverager on rank ", "tensor '0'", "float64"});
    // Nothing was left half-built: alike, it averages everywhere.
    auto q = torch::ones({2, 6}).requires_grad_();
    mpiml::GradAverager avg(std::vector<torch::Tensor>{q});
    (q * static_cast<double>(rank())).sum().backward();
    avg();
    EXPECT_TRUE(q.grad().allclose(torch::full({2, 6}, (size() - 1) / 2.0)));
    mpiml::set_check(was);
}

// The collectives of the helpers are in the history with the caller's line.
TEST(TorchAvgGrads, HistoryNamesTheCallSite) {
    if (size() == 1) GTEST_SKIP() << "one rank: the helpers run no collective";
    torch::nn::Linear m(3, 3);
    for (auto& p : m->parameters()) p.mutable_grad() = torch::ones_like(p);
    mpiml::GradAverager avg(m);
    const int avg_line = __LINE__ + 1;
    mpiml::mpi_avg_grads(m);
    const int call_line = __LINE__ + 1;
    avg();
    const int sync_line = __LINE__ + 1;
    mpiml::sync_params(m);
    mpiml::barrier();  // every rank's history is complete before anyone asks
    const std::string text = mpiml::report("TorchAvgGrads.HistoryNamesTheCallSite");
    for (int line : {avg_line, call_line, sync_line}) {
        const std::string at = "at " + std::string(__FILE__) + ":" + std::to_string(line);
        EXPECT_NE(text.find(at), std::string::npos) << at << " not in the report:\n" << text;
    }
    mpiml::barrier();  // no rank goes on to other collectives while the report is made
}

// ---------------------------------------------------------- mpi_avg, setup

TEST(TorchAvg, NewTensorSameShapeAndDtype) {
    const auto x = torch::full({2, 3}, double(rank()), torch::kFloat32);
    const auto avg = mpiml::mpi_avg(x);
    EXPECT_EQ(avg.scalar_type(), torch::kFloat32);
    EXPECT_EQ(avg.sizes(), x.sizes());
    EXPECT_TRUE(avg.allclose(torch::full({2, 3}, (size() - 1) / 2.0)));
    EXPECT_TRUE(x.equal(torch::full({2, 3}, double(rank()), torch::kFloat32)));  // untouched

    const auto kl = mpiml::mpi_avg(torch::tensor(0.01 * (rank() + 1), torch::kFloat64));
    EXPECT_EQ(kl.dim(), 0);
    EXPECT_DOUBLE_EQ(kl.item<double>(), mean_of_ranks(0.01));

    const auto ints = mpiml::mpi_avg(torch::full({2}, rank(), torch::kInt64));
    EXPECT_EQ(ints.scalar_type(), torch::kFloat64);  // integers average to float64
    EXPECT_DOUBLE_EQ(ints[0].item<double>(), (size() - 1) / 2.0);

    const auto t = torch::arange(6, torch::kFloat32).reshape({2, 3}).t() * (rank() + 1);
    EXPECT_TRUE(mpiml::mpi_avg(t).equal(torch::arange(6, torch::kFloat32).reshape({2, 3}).t() *
                                        float(mean_of_ranks(1))));
}

TEST(TorchSetup, FairShareOfThreads) {
    const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    at::set_num_threads(hw);
    mpiml::setup_pytorch_for_mpi();
    EXPECT_GE(at::get_num_threads(), 1);
    EXPECT_LE(at::get_num_threads(), std::max(1, hw / size()));  // all ranks on this node
    at::set_num_threads(1);
    mpiml::setup_pytorch_for_mpi();
    EXPECT_EQ(at::get_num_threads(), 1);
}

}  // namespace
