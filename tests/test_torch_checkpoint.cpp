// Checkpoints of LibTorch state: a training run saved, killed and resumed
// continues exactly as the uninterrupted run (module, Adam state, random
// generators); tensors of every kind round-trip.
#include <mpiml/mpiml.hpp>
#include <mpiml/torch.hpp>

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>

#include <stdlib.h>

#include <filesystem>
#include <random>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

int rank() { return mpiml::proc_id(); }

struct NetImpl : torch::nn::Module {
    NetImpl() {
        l1 = register_module("l1", torch::nn::Linear(6, 16));
        bn = register_module("bn", torch::nn::BatchNorm1d(16));
        l2 = register_module("l2", torch::nn::Linear(16, 3));
    }
    torch::Tensor forward(const torch::Tensor& x) { return l2(torch::relu(bn(l1(x)))); }
    torch::nn::Linear l1{nullptr}, l2{nullptr};
    torch::nn::BatchNorm1d bn{nullptr};
};
TORCH_MODULE(Net);

fs::path shared_dir() {
    std::string p;
    if (rank() == 0) {
        char templ[] = "/tmp/mpiml-torch-ckpt-XXXXXX";
        if (!mkdtemp(templ)) std::abort();
        p = templ;
    }
    mpiml::broadcast(p);
    return p;
}

/// One data-parallel step: a batch drawn from torch's generator and dropout
/// noise, per rank, and an index from the rank's mt19937.
void train_step(Net& net, torch::optim::Adam& opt, std::mt19937& g) {
    const auto x = torch::randn({8, 6}) * static_cast<double>(1 + g() % 3);
    const auto y = torch::randn({8, 3});
    opt.zero_grad();
    auto loss = torch::mse_loss(torch::dropout(net->forward(x), 0.2, true), y);
    loss.backward();
    mpiml::mpi_avg_grads(net);
    opt.step();
    mpiml::sync_params(net);  // BatchNorm's running stats: rank 0's, as DDP's broadcast_buffers
}

std::vector<torch::Tensor> snapshot(Net& net) {
    std::vector<torch::Tensor> out;
    for (const auto& t : net->parameters()) out.push_back(t.detach().clone());
    for (const auto& t : net->buffers()) out.push_back(t.detach().clone());
    return out;
}

TEST(TorchCheckpoint, ResumedTrainingEqualsTheUninterruptedRun) {
    const fs::path dir = shared_dir();
    mpiml::Checkpointer ck(dir, {.keep = 2});

    torch::manual_seed(1);
    Net net;
    mpiml::sync_params(net);
    torch::optim::Adam opt(net->parameters(), torch::optim::AdamOptions(1e-2));
    torch::manual_seed(100 + static_cast<std::uint64_t>(rank()));
    std::mt19937 g(7u + static_cast<unsigned>(rank()));
    for (int i = 0; i < 5; ++i) train_step(net, opt, g);

    mpiml::CheckpointState st;
    st.shared.put("model", net).put("optimizer", opt).put("epoch", 5);
    st.per_rank.put("torch_rng", at::detail::getDefaultCPUGenerator()).put("mt", g);
    ck.save(5, st);

    for (int i = 0; i < 4; ++i) train_step(net, opt, g);
    const auto uninterrupted = snapshot(net);

    // A new process: other initial weights, a fresh optimizer, other seeds.
    torch::manual_seed(999);
    Net net2;
    torch::optim::Adam opt2(net2->parameters(), torch::optim::AdamOptions(1e-2));
    std::mt19937 g2(12345);
    torch::manual_seed(4242);
    mpiml::CheckpointState in;
    auto r = ck.load_latest(in);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->step, 5);
    EXPECT_EQ(in.shared.get<int>("epoch"), 5);
    in.shared.get("model", net2);
    in.shared.get("optimizer", opt2);
    auto gen = at::detail::getDefaultCPUGenerator();
    in.per_rank.get("torch_rng", gen);
    in.per_rank.get("mt", g2);
    for (int i = 0; i < 4; ++i) train_step(net2, opt2, g2);
    const auto resumed = snapshot(net2);
    ASSERT_EQ(resumed.size(), uninterrupted.size());
    for (std::size_t i = 0; i < resumed.size(); ++i)
        EXPECT_TRUE(torch::equal(resumed[i], uninterrupted[i])) << "tensor " << i;

    // Without the optimizer's state the run would differ (the check above sees Adam's moments).
    torch::manual_seed(999);
    Net net3;
    torch::optim::Adam opt3(net3->parameters(), torch::optim::AdamOptions(1e-2));
    std::mt19937 g3;
    in.shared.get("model", net3);
    in.per_rank.get("torch_rng", gen);
    in.per_rank.get("mt", g3);
    for (int i = 0; i < 4; ++i) train_step(net3, opt3, g3);
    bool all_equal = true;
    const auto fresh = snapshot(net3);
    for (std::size_t i = 0; i < fresh.size(); ++i) all_equal &= torch::equal(fresh[i], uninterrupted[i]);
    EXPECT_FALSE(all_equal);

    mpiml::Checkpointer::wait_for_removals();
    mpiml::barrier();
    if (rank() == 0) fs::remove_all(dir);
}

TEST(TorchCheckpoint, TensorsRoundTrip) {
    const fs::path dir = shared_dir();
    mpiml::Checkpointer ck(dir);
    torch::manual_seed(3);
    const auto f64 = torch::randn({3, 4}, torch::kFloat64);
    const auto i64 = torch::arange(10, torch::kInt64) * (rank() + 1);
    const auto bf16 = torch::randn({7}).to(torch::kBFloat16);
    const auto strided = torch::randn({4, 6}).t();  // not contiguous
    const auto scalar = torch::tensor(2.5f);
    const std::vector<torch::Tensor> list = {f64, torch::ones({2}, torch::kBool), torch::empty({0})};

    mpiml::CheckpointState st;
    st.shared.put("f64", f64).put("bf16", bf16).put("strided", strided).put("scalar", scalar).put("list", list);
    st.per_rank.put("i64", i64);
    ck.save(1, st);

    mpiml::CheckpointState in;
    ASSERT_TRUE(ck.load_latest(in));
    for (const char* n : {"f64", "bf16", "strided", "scalar"}) {
        const auto t = in.shared.get<torch::Tensor>(n);
        const auto& want = std::string(n) == "f64" ? f64 : std::string(n) == "bf16" ? bf16
                           : std::string(n) == "strided" ? strided : scalar;
        EXPECT_EQ(t.dtype(), want.dtype()) << n;
        EXPECT_EQ(t.sizes(), want.sizes()) << n;
        EXPECT_TRUE(torch::equal(t, want)) << n;
    }
    EXPECT_TRUE(torch::equal(in.per_rank.get<torch::Tensor>("i64"), i64));
    const auto l = in.shared.get<std::vector<torch::Tensor>>("list");
    ASSERT_EQ(l.size(), 3u);
    EXPECT_TRUE(torch::equal(l[0], f64));
    EXPECT_TRUE(torch::equal(l[1], list[1]));
    EXPECT_EQ(l[2].numel(), 0);

    // A module entry is not a tensor; a module of another shape does not load.
    torch::manual_seed(1);
    Net net;
    mpiml::StateMap m;
    m.put("model", net);
    try {
        m.get<torch::Tensor>("model");
        ADD_FAILURE() << "expected mpiml::Error";
    } catch (const mpiml::Error& e) {
        EXPECT_NE(std::string(e.what()).find("'model' holds torch.module, not torch.tensor"), std::string::npos)
            << e.what();
    }
    torch::nn::Linear other(2, 2);
    try {
        m.get("model", other);
        ADD_FAILURE() << "expected mpiml::Error";
    } catch (const mpiml::Error& e) {
        EXPECT_NE(std::string(e.what()).find("entry 'model' (torch.module) does not decode"), std::string::npos)
            << e.what();
    }

    mpiml::Checkpointer::wait_for_removals();
    mpiml::barrier();
    if (rank() == 0) fs::remove_all(dir);
}

}  // namespace
