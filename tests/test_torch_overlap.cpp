// GradAverager with overlap under mpirun (MPI_THREAD_SERIALIZED): n ranks on
// 1/n of the batch each equal one process on the whole batch, and bit for bit
// the averaging after backward(), with a parameter no rank uses, one only
// rank 0 uses, a parameter used twice and registered twice, two dtypes and
// gradient accumulation under no_sync(), also on MPI's path (every element
// summed in rank order, with overlap and without, as on shared memory); the
// plan rebuilt from the backward order; failures on the communication thread
// surface at the call; overlap_stats() tells hidden averaging from waited;
// with gradient_as_bucket_view, the gradients stay in the buckets; on one
// node overlap averages at the call unless overlap_on_one_node.
#include <mpiml/mpiml.hpp>
#include <mpiml/torch.hpp>

#include "expect_error.hpp"

#include <gtest/gtest.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <set>
#include <unordered_set>
#include <vector>

namespace {

int rank() { return mpiml::proc_id(); }
int size() { return mpiml::num_procs(); }

// Wide enough for buckets of some 20 KB, where Open MPI's allreduce over 3
// ranks sums in another order than rank order.
constexpr int kWidth = 64;

struct NetImpl : torch::nn::Module {
    NetImpl() {
        l1 = register_module("l1", torch::nn::Linear(5, kWidth));
        tied = register_parameter("tied", torch::randn({kWidth, kWidth}) / 8);
        register_parameter("tied_again", tied);  // registered twice
        l2 = register_module("l2", torch::nn::Linear(kWidth, 2));
        only0 = register_module("only0", torch::nn::Linear(kWidth, 2));  // rank 0's shard only
        never = register_module("never", torch::nn::Linear(kWidth, 3));  // no rank uses it
        scale = register_parameter("scale", torch::ones({}, torch::kFloat64));
    }
    torch::Tensor forward(const torch::Tensor& x, bool use_only0) {
        auto h = torch::tanh(l1(x));
        h = torch::tanh(h.matmul(tied));
        h = torch::tanh(h.matmul(tied.t()));  // used twice
        auto out = l2(h);
        if (use_only0) out = out + only0(h);
        return out * scale.to(out.scalar_type());
    }
    torch::nn::Linear l1{nullptr}, l2{nullptr}, only0{nullptr}, never{nullptr};
    torch::Tensor tied, scale;
};
TORCH_MODULE(Net);

Net make_net() {
    torch::manual_seed(7);
    return Net();
}

std::vector<torch::Tensor> unique_params(const Net& net) {
    std::vector<torch::Tensor> out;
    std::unordered_set<const void*> seen;
    for (const auto& p : net->parameters())
        if (seen.insert(p.unsafeGetTensorImpl()).second) out.push_back(p);
    return out;
}

/// Every parameter and gradient equal bit for bit (undefined alike).
void expect_identical(const Net& a, const Net& b, int step) {
    const auto pa = unique_params(a), pb = unique_params(b);
    ASSERT_EQ(pa.size(), pb.size());
    for (std::size_t i = 0; i < pa.size(); ++i) {
        EXPECT_TRUE(pa[i].equal(pb[i])) << "parameter #" << i << " step " << step;
        ASSERT_EQ(pa[i].grad().defined(), pb[i].grad().defined()) << "#" << i << " step " << step;
        if (pa[i].grad().defined())
            EXPECT_TRUE(pa[i].grad().equal(pb[i].grad())) << "gradient #" << i << " step " << step;
    }
}

double max_abs_diff(const Net& a, const Net& b) {
    double m = 0;
    const auto pa = unique_params(a), pb = unique_params(b);
    for (std::size_t i = 0; i < pa.size(); ++i)
        m = std::max(m, (pa[i] - pb[i]).abs().max().item<double>());
    return m;
}

/// loss of one micro-batch, scaled so that the micro-batches of a step sum
/// to the mean over the rank's shard.
torch::Tensor micro_loss(Net& net, const torch::Tensor& x, const torch::Tensor& y, bool use_only0,
                         int micro) {
    return torch::nn::functional::mse_loss(net(x, use_only0), y) / micro;
}

/// While it lives (off = true): the shared-memory path off, so every
/// collective takes MPI's path, as with one rank a host.
struct ShmOff {
    mpiml::shm::Mode was = mpiml::shm::config().mode;
    explicit ShmOff(bool off = true) {
        if (off) mpiml::shm::set_mode(mpiml::shm::Mode::off);
    }
    ~ShmOff() { mpiml::shm::set_mode(was); }
};

/// Trains three copies of the net for a few steps: with overlap, with the
/// averaging after backward(), and one process on every shard. mpi_path:
/// every bucket takes MPI's path (as with one rank a host); quiet: the
/// overlap's waits (else MPI's own); views: gradient_as_bucket_view with
/// overlap (the gradients stay in the buckets from the second step on).
void train(std::size_t cap, int micro, bool mpi_path = false, bool quiet = true, bool views = false) {
    constexpr int batch = 24, steps = 6;
    const int n = size(), r = rank();
    const ShmOff mode(mpi_path);
    const int per = batch / n, part = per / micro;
    ASSERT_EQ(per % micro, 0);
    torch::manual_seed(99);
    const auto x = torch::randn({batch, 5}), y = torch::randn({batch, 2});

    Net over = make_net(), plain = make_net(), ref = make_net();
    mpiml::AvgGradsOptions o;
    o.bucket_cap_bytes = cap;
    mpiml::GradAverager plain_avg(plain, o);
    o.overlap = true;
    o.overlap_on_one_node = true;  // the overlapped path on one host too
    o.quiet_wait = quiet;
    o.gradient_as_bucket_view = views;
    mpiml::GradAverager over_avg(over, o);
    std::vector<const void*> homes;  // with views: where the gradients live after step 1
    EXPECT_EQ(over_avg.size(), plain_avg.size());
    torch::optim::Adam over_opt(unique_params(over), torch::optim::AdamOptions(1e-2));
    torch::optim::Adam plain_opt(unique_params(plain), torch::optim::AdamOptions(1e-2));
    torch::optim::Adam ref_opt(unique_params(ref), torch::optim::AdamOptions(1e-2));

    for (int step = 0; step < steps; ++step) {
        over_opt.zero_grad();
        plain_opt.zero_grad();
        for (int m = 0; m < micro; ++m) {
            const auto xs = x.narrow(0, r * per + m * part, part);
            const auto ys = y.narrow(0, r * per + m * part, part);
            if (m + 1 < micro) {
                auto guard = over_avg.no_sync();
                micro_loss(over, xs, ys, r == 0, micro).backward();
            } else {
                micro_loss(over, xs, ys, r == 0, micro).backward();
            }
            micro_loss(plain, xs, ys, r == 0, micro).backward();
        }
        over_avg();
        plain_avg();
        expect_identical(over, plain, step);
        if (views && step >= 1) {  // averaged in place, never packed or moved again
            std::vector<const void*> now;
            for (const auto& p : unique_params(over))
                now.push_back(p.grad().defined() ? p.grad().data_ptr() : nullptr);
            if (step == 1) homes = now;
            else EXPECT_EQ(now, homes) << "step " << step;
        }
        EXPECT_FALSE(over->never->weight.grad().defined()) << "no rank had a gradient";
        EXPECT_TRUE(over->only0->weight.grad().defined()) << "rank 0 had one";
        over_opt.step();
        plain_opt.step();

        ref_opt.zero_grad();
        for (int q = 0; q < n; ++q)
            for (int m = 0; m < micro; ++m) {
                const auto xs = x.narrow(0, q * per + m * part, part);
                const auto ys = y.narrow(0, q * per + m * part, part);
                (micro_loss(ref, xs, ys, q == 0, micro) / n).backward();
            }
        ref_opt.step();
    }
    expect_identical(over, plain, steps);
    const double diff = max_abs_diff(over, ref);
    EXPECT_LT(diff, 1e-5) << "ranks " << n;
    if (r == 0) std::printf("  max |overlap - one process| = %.3g\n", diff);
    EXPECT_GT(max_abs_diff(over, make_net()), 1e-3) << "training moved the weights";
}

TEST(TorchOverlap, EqualsOneProcessOneBucket) { train(25u << 20, 1); }
TEST(TorchOverlap, EqualsOneProcessBucketPerTensor) { train(64, 1); }
TEST(TorchOverlap, EqualsOneProcessSmallBuckets) { train(1024, 1); }
TEST(TorchOverlap, GradientAccumulationUnderNoSync) { train(1024, 2); }
TEST(TorchOverlap, MpiPathOneBucket) { train(25u << 20, 1, true); }
TEST(TorchOverlap, MpiPathBucketPerTensor) { train(64, 1, true); }  // some smaller than the ranks
TEST(TorchOverlap, MpiPathSmallBucketsAccumulated) { train(1024, 2, true); }
TEST(TorchOverlap, MpiPathMpisOwnWaits) { train(1024, 1, true, false); }
TEST(TorchOverlap, BucketViewsOneBucket) { train(25u << 20, 1, false, true, true); }
TEST(TorchOverlap, BucketViewsSmallBucketsAccumulated) { train(1024, 2, false, true, true); }
TEST(TorchOverlap, BucketViewsMpiPath) { train(1024, 2, true, true, true); }

/// Each rank's node, numbered by the node's lowest rank, as mpiml groups
/// them (MPIML_NODE_SPLIT=K: K ranks a simulated node).
std::vector<int> node_numbers() {
    MPI_Comm host = MPI_COMM_NULL, node = MPI_COMM_NULL;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank(), MPI_INFO_NULL, &host);
    const char* k = std::getenv("MPIML_NODE_SPLIT");
    MPI_Comm_split(host, k && std::atoi(k) > 0 ? rank() / std::atoi(k) : 0, rank(), &node);
    int lowest = rank();
    MPI_Allreduce(MPI_IN_PLACE, &lowest, 1, MPI_INT, MPI_MIN, node);
    MPI_Comm_free(&node);
    MPI_Comm_free(&host);
    std::vector<int> all(static_cast<std::size_t>(size()));
    MPI_Allgather(&lowest, 1, MPI_INT, all.data(), 1, MPI_INT, MPI_COMM_WORLD);
    std::vector<int> lows = all;
    std::sort(lows.begin(), lows.end());
    lows.erase(std::unique(lows.begin(), lows.end()), lows.end());
    for (int& a : all) a = static_cast<int>(std::find(lows.begin(), lows.end(), a) - lows.begin());
    return all;
}

/// Rank r's gradient is 1 at elements i with i % n == r, 2^-24 elsewhere.
/// In float a sum of 1 and two 2^-24 is 1 + 2^-23 when the two tiny ones are
/// added first, else 1: with 3 ranks every order but rank order gives other
/// bits at some element. The order expected: each node's ranks in rank
/// order, then the nodes' sums in node order, as on shared memory.
void expect_fixed_order(bool overlap, bool mpi_path, std::size_t cap) {
    const int n = size(), r = rank();
    const ShmOff mode(mpi_path);
    const float tiny = std::ldexp(1.0f, -24);
    auto value = [&](int q, std::int64_t i) { return i % n == q ? 1.0f : tiny; };
    const std::vector<int> node = node_numbers();
    auto expected = [&](std::int64_t i) {
        float total = 0;
        for (int k = 0; k <= *std::max_element(node.begin(), node.end()); ++k) {
            float sum = 0;
            bool first = true;
            for (int q = 0; q < n; ++q)
                if (node[q] == k) {
                    sum = first ? value(q, i) : sum + value(q, i);
                    first = false;
                }
            total = k == 0 ? sum : total + sum;
        }
        return total * (1.0f / static_cast<float>(n));
    };
    std::vector<torch::Tensor> ps;
    // 100003: between nodes a slice goes in several eager pieces, the last one short.
    for (std::int64_t len : {1, 2, 500, 7, 10000, 100003}) ps.push_back(torch::zeros({len}).requires_grad_());
    mpiml::AvgGradsOptions o;
    o.bucket_cap_bytes = cap;
    o.overlap = overlap;
    mpiml::GradAverager avg(ps, o);
    for (int step = 0; step < 2; ++step) {
        for (auto& p : ps) {
            p.mutable_grad() = torch::Tensor();
            auto c = torch::empty({p.numel()});
            float* cv = c.data_ptr<float>();
            for (std::int64_t i = 0; i < p.numel(); ++i) cv[i] = value(r, i);
            (p * c).sum().backward();
        }
        avg();
        std::size_t wrong = 0;
        for (auto& p : ps) {
            const auto g = p.grad().contiguous();
            const float* got = g.data_ptr<float>();
            for (std::int64_t i = 0; i < p.numel(); ++i) {
                const float want = expected(i);
                if (std::memcmp(&got[i], &want, sizeof want) != 0) ++wrong;
            }
        }
        EXPECT_EQ(wrong, 0u) << "elements not summed in the fixed order, step " << step;
    }
}

TEST(TorchOverlap, FixedOrderSharedMemory) {
    expect_fixed_order(false, false, 25u << 20);
    expect_fixed_order(false, false, 1024);
    expect_fixed_order(true, false, 25u << 20);
    expect_fixed_order(true, false, 64);
}
TEST(TorchOverlap, FixedOrderMpiPath) {
    expect_fixed_order(false, true, 25u << 20);
    expect_fixed_order(false, true, 1024);
    expect_fixed_order(true, true, 25u << 20);
    expect_fixed_order(true, true, 64);
}

/// Layers registered in the opposite order of their use: backward() finishes
/// their gradients in parameter order, not in the reverse order planned.
struct BackwardsImpl : torch::nn::Module {
    BackwardsImpl() {
        l3 = register_module("l3", torch::nn::Linear(16, 2));   // parameters #0, #1
        l2 = register_module("l2", torch::nn::Linear(16, 16));  // #2, #3
        l1 = register_module("l1", torch::nn::Linear(5, 16));   // #4, #5
    }
    torch::Tensor forward(const torch::Tensor& x, bool use_l3) {
        auto h = torch::tanh(l2(torch::tanh(l1(x))));
        return use_l3 ? l3(h) : h;
    }
    torch::nn::Linear l1{nullptr}, l2{nullptr}, l3{nullptr};
};
TORCH_MODULE(Backwards);

TEST(TorchOverlap, PlanRebuiltFromRankZerosBackwardOrder) {
    torch::manual_seed(5);
    Backwards over;
    torch::manual_seed(5);
    Backwards plain;
    mpiml::AvgGradsOptions o;
    o.bucket_cap_bytes = 8;  // a bucket a tensor
    mpiml::GradAverager plain_avg(plain, o);
    o.overlap = true;
    o.overlap_on_one_node = true;  // the overlapped path on one host too
    mpiml::GradAverager over_avg(over, o);
    using Plan = std::vector<std::vector<std::size_t>>;
    EXPECT_EQ(over_avg.bucket_plan(), (Plan{{5}, {4}, {3}, {2}, {1}, {0}})) << "reverse parameter order";
    torch::optim::Adam over_opt(over->parameters(), torch::optim::AdamOptions(1e-2));
    torch::optim::Adam plain_opt(plain->parameters(), torch::optim::AdamOptions(1e-2));
    torch::manual_seed(40 + rank());
    for (int step = 0; step < 4; ++step) {
        const auto x = torch::randn({4, 5});
        // Only rank 0 uses l3: the others see another order, rank 0's is taken.
        over_opt.zero_grad();
        plain_opt.zero_grad();
        over(x, rank() == 0).square().sum().backward();
        plain(x, rank() == 0).square().sum().backward();
        over_avg();
        plain_avg();
        const auto po = over->parameters(), pp = plain->parameters();
        for (std::size_t i = 0; i < po.size(); ++i)
            EXPECT_TRUE(po[i].grad().equal(pp[i].grad())) << "gradient #" << i << " step " << step;
        over_opt.step();
        plain_opt.step();
    }
    const Plan plan = over_avg.bucket_plan();
    ASSERT_EQ(plan.size(), 6u);
    std::vector<std::int64_t> flat, root;
    for (const auto& b : plan) {
        ASSERT_EQ(b.size(), 1u);
        flat.push_back(static_cast<std::int64_t>(b[0]));
    }
    root = flat;
    mpiml::broadcast(root);
    EXPECT_EQ(flat, root) << "the same plan on every rank";
    EXPECT_LE(plan.front()[0], 1u) << "l3's gradients come first in backward()";
    EXPECT_GE(plan.back()[0], 4u) << "l1's come last";
    std::sort(flat.begin(), flat.end());
    EXPECT_EQ(flat, (std::vector<std::int64_t>{0, 1, 2, 3, 4, 5}));
}

// Two layers' weights exceed the cap: each layer (bias, weight) gets a bucket
// of its own, started when that layer is done, not when the next one is.
TEST(TorchOverlap, BucketsDoNotWaitForALayerTheyHaveNoRoomFor) {
    torch::manual_seed(6);
    torch::nn::Sequential over(torch::nn::Linear(64, 64), torch::nn::Linear(64, 64),
                               torch::nn::Linear(64, 64), torch::nn::Linear(64, 64));
    torch::manual_seed(6);
    torch::nn::Sequential plain(torch::nn::Linear(64, 64), torch::nn::Linear(64, 64),
                                torch::nn::Linear(64, 64), torch::nn::Linear(64, 64));
    mpiml::AvgGradsOptions o;
    o.bucket_cap_bytes = 24 * 1024;  // 1.5 weights of 16 KiB
    mpiml::GradAverager plain_avg(plain, o);
    o.overlap = true;
    o.overlap_on_one_node = true;  // the overlapped path on one host too
    mpiml::GradAverager over_avg(over, o);
    using Plan = std::vector<std::vector<std::size_t>>;
    // Parameters: weight 0, bias 1 of the first layer ... weight 6, bias 7 of the last.
    EXPECT_EQ(over_avg.bucket_plan(), (Plan{{7, 6}, {5, 4}, {3, 2}, {1, 0}}));
    torch::manual_seed(50 + rank());
    const auto x = torch::randn({8, 64});
    over->forward(x).square().sum().backward();
    plain->forward(x).square().sum().backward();
    over_avg();
    plain_avg();
    const auto po = over->parameters(), pp = plain->parameters();
    for (std::size_t i = 0; i < po.size(); ++i)
        EXPECT_TRUE(po[i].grad().equal(pp[i].grad())) << "gradient #" << i;
}

// Towards the end of backward() the buckets halve (limit: half of what is
// left, at least 1 MiB): the last one, started only when backward() is done,
// is small. 24 tensors of 256 KiB under the default 25 MiB cap.
TEST(TorchOverlap, BucketsShrinkTowardsTheEnd) {
    std::vector<torch::Tensor> ps, qs;
    for (int i = 0; i < 24; ++i) {
        ps.push_back(torch::full({64, 1024}, 1.0 + i).requires_grad_());
        qs.push_back(ps.back().detach().clone().requires_grad_());
    }
    mpiml::AvgGradsOptions o;
    mpiml::GradAverager plain_avg(qs, o);
    o.overlap = true;
    o.overlap_on_one_node = true;  // the overlapped path on one host too
    mpiml::GradAverager over_avg(ps, o);
    std::vector<std::size_t> sizes;
    std::size_t expect = 24;
    for (const auto& b : over_avg.bucket_plan()) {
        sizes.push_back(b.size());
        for (const std::size_t i : b) EXPECT_EQ(i, --expect) << "reverse parameter order";
    }
    // 1 MiB first, then of the 5 MiB left 2.5, of 2.5 1.25, then 1 and the rest
    EXPECT_EQ(sizes, (std::vector<std::size_t>{4, 10, 5, 4, 1}));
    torch::manual_seed(60 + rank());
    const auto x = torch::randn({64, 1024});
    for (auto* v : {&ps, &qs}) {
        torch::Tensor loss = torch::zeros({});
        for (const auto& p : *v) loss = loss + (p * x).square().sum();
        loss.backward();
    }
    over_avg();
    plain_avg();
    for (std::size_t i = 0; i < ps.size(); ++i) EXPECT_TRUE(ps[i].grad().equal(qs[i].grad())) << "gradient #" << i;
}

// overlap_stats(): a call long after backward() finds the averaging done
// (hidden behind it); a call with no backward() before it runs every bucket
// itself (nothing hidden).
TEST(TorchOverlap, StatsShowWhereTheAveragingWent) {
    torch::manual_seed(8);
    torch::nn::Sequential net(torch::nn::Linear(64, 64), torch::nn::Linear(64, 64),
                              torch::nn::Linear(64, 64));
    mpiml::AvgGradsOptions o;
    o.bucket_cap_bytes = 8 * 1024;  // a bucket a tensor
    mpiml::GradAverager plain(net, o);
    EXPECT_EQ(plain.overlap_stats().steps, 0u) << "without overlap: none";
    o.overlap = true;
    o.overlap_on_one_node = true;  // the overlapped path on one host too
    mpiml::GradAverager avg(net, o);
    const auto none = avg.overlap_stats();
    EXPECT_EQ(none.steps, 0u);
    EXPECT_EQ(none.buckets, 0u);
    EXPECT_EQ(none.averaging, 0.0);
    const std::size_t buckets = avg.bucket_plan().size();
    ASSERT_EQ(buckets, 6u);
    mpiml::barrier();
    net->forward(torch::randn({8, 64})).square().sum().backward();
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    avg();
    const auto after = avg.overlap_stats();
    EXPECT_EQ(after.steps, 1u);
    EXPECT_EQ(after.buckets, buckets);
    EXPECT_GT(after.averaging, 0.0);
    EXPECT_GT(after.hidden, 0.0) << "buckets ran during the sleep, before the call";
    EXPECT_LE(after.hidden, after.averaging);
    EXPECT_GE(after.left, 0.0);
    avg();  // no backward(): the call runs every bucket
    const auto at_call = avg.overlap_stats();
    EXPECT_EQ(at_call.steps, 2u);
    EXPECT_EQ(at_call.buckets, buckets);
    EXPECT_GT(at_call.averaging, 0.0);
    EXPECT_EQ(at_call.hidden, 0.0);
    EXPECT_GE(at_call.left, at_call.averaging) << "the call waited for all of it";
}

// Every rank on one node: overlap averages at the call (no plan, no bucket on
// the thread), the same bits as overlap_on_one_node, which overlaps there too.
// Across nodes (the cluster runs) both overlap.
TEST(TorchOverlap, OneNodeAveragesAtTheCall) {
    if (size() == 1) GTEST_SKIP() << "one rank: nothing to average";
    MPI_Comm node = MPI_COMM_NULL;
    ASSERT_EQ(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node), MPI_SUCCESS);
    int node_size = 0;
    MPI_Comm_size(node, &node_size);
    MPI_Comm_free(&node);
    const char* split = std::getenv("MPIML_NODE_SPLIT");  // simulated nodes of this many ranks
    const int per_node = split != nullptr && std::atoi(split) > 0 ? std::min(std::atoi(split), node_size) : node_size;
    const bool one_node = per_node == size();
    auto make = [] {
        torch::manual_seed(3);
        return torch::nn::Sequential(torch::nn::Linear(16, 16), torch::nn::Linear(16, 16));
    };
    auto a = make(), b = make();
    mpiml::AvgGradsOptions o;
    o.overlap = true;
    o.bucket_cap_bytes = 1024;  // a bucket a tensor
    mpiml::GradAverager at_call(a, o);
    o.overlap_on_one_node = true;
    mpiml::GradAverager overlapped(b, o);
    EXPECT_EQ(at_call.bucket_plan().empty(), one_node);
    EXPECT_FALSE(overlapped.bucket_plan().empty());
    torch::manual_seed(10 + rank());
    const auto x = torch::randn({4, 16});
    a->forward(x).square().sum().backward();
    at_call();
    b->forward(x).square().sum().backward();
    overlapped();
    EXPECT_EQ(at_call.overlap_stats().steps, one_node ? 0u : 1u);
    EXPECT_EQ(overlapped.overlap_stats().steps, 1u);
    const auto pa = a->parameters(), pb = b->parameters();
    ASSERT_EQ(pa.size(), pb.size());
    for (std::size_t i = 0; i < pa.size(); ++i)
        EXPECT_TRUE(torch::equal(pa[i].grad(), pb[i].grad())) << "parameter " << i;
}

using mpiml_test::expect_error;

TEST(TorchOverlap, LocalBadGradientThrowsThereAtTheCall) {
    Net net = make_net();
    mpiml::AvgGradsOptions o;
    o.overlap = true;
    o.overlap_on_one_node = true;  // the overlapped path on one host too
    o.bucket_cap_bytes = 256;
    mpiml::GradAverager avg(net, o);
    const auto x = torch::randn({4, 5}), y = torch::randn({4, 2});
    // "never" gets no gradient from backward(): averaged at the call, where
    // rank 0's (wrong-sized) one fails to pack on the communication thread.
    if (rank() == 0) net->never->bias.mutable_grad() = torch::ones({7});
    torch::nn::functional::mse_loss(net(x, true), y).backward();
    if (rank() == 0)
        expect_error([&] { avg(); }, {"mpiml::GradAverager", "rank 0/", "7 elements"});
    else
        EXPECT_NO_THROW(avg());
    // The next step works everywhere.
    net->zero_grad();
    net->never->bias.mutable_grad() = torch::full({3}, static_cast<double>(rank()));
    torch::nn::functional::mse_loss(net(x, true), y).backward();
    EXPECT_NO_THROW(avg());
    const double mean = (size() - 1) / 2.0;
    EXPECT_TRUE(net->never->bias.grad().allclose(torch::full({3}, mean)));
}

// A failure on the communication thread is rethrown at the call, naming the
// rank: rank 0's bucket meets another collective on the other ranks (a
// mismatch the checks catch), whose own call fails alike.
TEST(TorchOverlap, FailedCollectiveThrowsEverywhereAtTheCall) {
    if (size() == 1) GTEST_SKIP() << "needs 2+ ranks";
    const bool was = mpiml::check_enabled();
    mpiml::set_check(true);
    auto p = torch::ones({4}).requires_grad_();
    mpiml::AvgGradsOptions o;
    o.overlap = true;
    o.overlap_on_one_node = true;  // the overlapped path on one host too
    mpiml::GradAverager avg(std::vector<torch::Tensor>{p}, o);
    (p * 2).sum().backward();
    avg();  // the first step, everywhere: the plan is set
    if (rank() == 0) {
        (p * 2).sum().backward();
        expect_error([&] { avg(); }, {"on rank 0/", "mismatched"});
    } else {
        std::vector<int> v(3, 1);
        expect_error([&] { mpiml::allreduce(v, mpiml::Op::sum); }, {"mismatched"});
    }
    EXPECT_EQ(mpiml::mpi_sum(1), size());  // the communicator is still usable
    mpiml::set_check(was);
}

// With the checks off, ranks on different nodes whose parameters differ in
// size: construction compares the parameters, and every rank fails there,
// before any bucket's pieces go out on MPI's path.
TEST(TorchOverlap, MpiPathCountsThatDifferFailAcrossNodesChecksOff) {
    const std::vector<int> node = node_numbers();
    if (size() < 2 || std::set<int>(node.begin(), node.end()).size() != node.size())
        GTEST_SKIP() << "needs 2 ranks or more, a rank a node (MPIML_NODE_SPLIT=1)";
    const bool was = mpiml::check_enabled();
    mpiml::set_check(false);
    const ShmOff mode;
    // Slices of several eager pieces, a different size on every rank.
    auto p = torch::ones({100003 + 1000 * rank()}).requires_grad_();
    mpiml::AvgGradsOptions o;
    o.overlap = true;
    expect_error([&] { mpiml::GradAverager avg(std::vector<torch::Tensor>{p}, o); },
                 {"on rank " + std::to_string(rank()) + "/", "tensor '0' float32[10"});
    mpiml::set_check(was);
}

// close() frees the buckets now, as the destructor would; a call after it is
// an error naming it; a new averager works everywhere.
TEST(TorchOverlap, CloseReleasesAndEndsTheAverager) {
    auto p = torch::ones({40}).requires_grad_();
    for (bool overlap : {false, true}) {
        mpiml::AvgGradsOptions o;
        o.overlap = overlap;
        o.overlap_on_one_node = true;
        mpiml::GradAverager avg(std::vector<torch::Tensor>{p}, o);
        (p * static_cast<double>(rank())).sum().backward();
        avg();
        avg.close();
        avg.close();  // twice: nothing more
        EXPECT_EQ(avg.size(), 0u);
        expect_error([&] { avg(); }, {"mpiml::GradAverager", "close()"});
        p.mutable_grad() = torch::Tensor();
    }
    mpiml::GradAverager again(std::vector<torch::Tensor>{p});
    (p * static_cast<double>(rank())).sum().backward();
    again();
    EXPECT_TRUE(p.grad().allclose(torch::full({40}, (size() - 1) / 2.0)));
}

TEST(TorchOverlap, SecondBackwardWithoutNoSyncIsAnError) {
    auto p = torch::ones({4}).requires_grad_();
    mpiml::AvgGradsOptions o;
    o.overlap = true;
    o.overlap_on_one_node = true;  // the overlapped path on one host too
    mpiml::GradAverager avg(std::vector<torch::Tensor>{p}, o);
    (p * 2).sum().backward();
    avg();  // waits for the first pass's bucket before the second pass
    (p * 3).sum().backward();
    (p * 3).sum().backward();
    expect_error([&] { avg(); }, {"mpiml::GradAverager", "parameter #0", "no_sync"});
    // Then a clean step.
    p.mutable_grad().zero_();
    (p * static_cast<double>(rank())).sum().backward();
    avg();
    EXPECT_TRUE(p.grad().allclose(torch::full({4}, (size() - 1) / 2.0)));
}

TEST(TorchOverlap, NotWithTheFreeFunction) {
    Net net = make_net();
    mpiml::AvgGradsOptions o;
    o.overlap = true;
    o.overlap_on_one_node = true;  // the overlapped path on one host too
    expect_error([&] { mpiml::mpi_avg_grads(net, o); }, {"mpiml::mpi_avg_grads", "GradAverager"});
}

// With gradient_as_bucket_view the gradients live in the averager's buckets;
// destroying it gives them their own memory, with the same values.
TEST(TorchOverlap, BucketViewsOutliveTheAverager) {
    Net net = make_net();
    std::vector<torch::Tensor> kept;
    {
        mpiml::AvgGradsOptions o;
        o.overlap = true;
        o.overlap_on_one_node = true;  // the overlapped path on one host too
        o.gradient_as_bucket_view = true;
        mpiml::GradAverager avg(net, o);
        for (int step = 0; step < 2; ++step) {  // views from the second step
            for (const auto& p : unique_params(net))
                if (p.grad().defined()) p.mutable_grad().zero_();
            net(torch::ones({2, 5}) * (rank() + 1), true).sum().backward();
            avg();
        }
        for (const auto& p : unique_params(net))
            if (p.grad().defined()) kept.push_back(p.grad().clone());
    }
    std::size_t k = 0;
    for (const auto& p : unique_params(net))
        if (p.grad().defined()) {
            ASSERT_LT(k, kept.size());
            EXPECT_TRUE(p.grad().equal(kept[k++]));
            p.mutable_grad().add_(1);  // its own memory: writable after the buckets are gone
        }
    EXPECT_EQ(k, kept.size());
}

TEST(TorchOverlap, DestroyedWithoutTheCallEndsTheStep) {
    auto p = torch::ones({4}).requires_grad_();
    {
        mpiml::AvgGradsOptions o;
        o.overlap = true;
        o.overlap_on_one_node = true;  // the overlapped path on one host too
        mpiml::GradAverager avg(std::vector<torch::Tensor>{p}, o);
        (p * static_cast<double>(rank())).sum().backward();
    }  // every rank ends the step: the bucket is averaged
    EXPECT_TRUE(p.grad().allclose(torch::full({4}, (size() - 1) / 2.0)));
    mpiml::barrier();
    // The hooks are gone: another backward() is plain accumulation.
    (p * 1.0).sum().backward();
    EXPECT_TRUE(p.grad().allclose(torch::full({4}, (size() - 1) / 2.0 + 1.0)));
}

// Options that change which collectives run (or their sizes) must be alike on
// every rank: construction compares them and every rank throws, naming the
// option, each rank's value and call site, on the shared-memory path and on
// MPI's (where GradAverager's own allreduce would otherwise leave ranks in
// different collectives).
void expect_options_disagree(const mpiml::AvgGradsOptions& mine, const std::string& option,
                             const std::string& last_has) {
    auto p = torch::ones({300}).requires_grad_();
    const int line = __LINE__ + 1;
    const auto make = [&] { mpiml::GradAverager avg(std::vector<torch::Tensor>{p}, mine); };
    const std::string odd = "rank " + std::to_string(size() - 1) + " has " + last_has;
    expect_error(make, {"mpiml::GradAverager on rank " + std::to_string(rank()) + "/",
                        "ranks disagree on AvgGradsOptions." + option + ": ", odd,
                        "called at " + std::string(__FILE__) + ":" + std::to_string(line)});
}

void options_disagree(bool mpi_path) {
    const ShmOff mode(mpi_path);
    const bool last = rank() == size() - 1;
    mpiml::AvgGradsOptions o;
    o.overlap = !last;
    expect_options_disagree(o, "overlap", "false");
    o.overlap = true;
    o.overlap_on_one_node = true;  // the overlapped path on one host too
    o.quiet_wait = !last;
    expect_options_disagree(o, "quiet_wait", "false");
    o.quiet_wait = true;
    o.bucket_cap_bytes = last ? SIZE_MAX : 1024;  // shown unsigned
    expect_options_disagree(o, "bucket_cap_bytes", "18446744073709551615");
    o.bucket_cap_bytes = 1024;
    o.overlap = false;
    o.gradient_as_bucket_view = last;
    expect_options_disagree(o, "gradient_as_bucket_view", "true");
    // Two at once: both named.
    o = {};
    o.overlap = last;
    o.bucket_cap_bytes = last ? 512 : 1024;
    expect_error([&] { mpiml::GradAverager avg(std::vector<torch::Tensor>{torch::ones({3}).requires_grad_()}, o); },
                 {"AvgGradsOptions.overlap: ", "AvgGradsOptions.bucket_cap_bytes: "});
    // quiet_wait does not matter without overlap; and nothing was left
    // half-built: an averager with the same options works everywhere.
    o = {};
    o.quiet_wait = last;
    auto p = torch::ones({4}).requires_grad_();
    mpiml::GradAverager plain(std::vector<torch::Tensor>{p}, o);
    o.overlap = true;
    o.overlap_on_one_node = true;  // the overlapped path on one host too
    o.quiet_wait = true;
    mpiml::GradAverager over(std::vector<torch::Tensor>{p}, o);
    (p * static_cast<double>(rank())).sum().backward();
    over();
    EXPECT_TRUE(p.grad().allclose(torch::full({4}, (size() - 1) / 2.0)));
}

TEST(TorchOverlap, OptionsThatDisagreeThrowEverywhere) { options_disagree(false); }
TEST(TorchOverlap, OptionsThatDisagreeThrowEverywhereOnMpiPath) { options_disagree(true); }

// mpi_avg_grads compares them only under MPIML_CHECK (each call is its own).
TEST(TorchOverlap, FreeFunctionComparesOptionsUnderChecks) {
    const bool was = mpiml::check_enabled();
    mpiml::set_check(true);
    auto p = torch::ones({300}).requires_grad_();
    (p * 1.0).sum().backward();
    mpiml::AvgGradsOptions o;
    o.bucket_cap_bytes = rank() == size() - 1 ? 512 : 1024;
    expect_error([&] { mpiml::mpi_avg_grads(std::vector<torch::Tensor>{p}, o); },
                 {"mpiml::mpi_avg_grads", "AvgGradsOptions.bucket_cap_bytes: ",
                  "rank " + std::to_string(size() - 1) + " has 512"});
    mpiml::set_check(was);
}

}  // namespace
