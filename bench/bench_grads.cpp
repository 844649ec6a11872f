// Gradient averaging and parameter sync on Spinning Up's actor-critic
// (observation 17, action 6, hidden (64,64) and (256,256)) and on ResNet-50's
// parameter set: mpiml vs a per-parameter raw MPI loop vs one raw MPI call on
// a flat buffer of the same bytes.
//
//   mpirun -np 2 bench_grads [--models=ac64,ac256,resnet50] [--rounds=7]
//       [--round-ms=20]
//
// Rank 0 prints JSON lines (see bench_common.hpp for the timing protocol).
#include "bench_common.hpp"

#include <mpiml/mpiml.hpp>
#include <mpiml/torch.hpp>

#include <torch/torch.h>

#include <cstdint>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace {

// ------------------------------------------------------------------ models
// Spinning Up's MLPActorCritic (Gaussian policy), as in
// spinup/algos/pytorch/ppo/core.py: same layers, same parameter order.

torch::nn::Sequential mlp(const std::vector<int64_t>& sizes) {
    torch::nn::Sequential s;
    for (std::size_t j = 0; j + 1 < sizes.size(); ++j) {
        s->push_back(torch::nn::Linear(sizes[j], sizes[j + 1]));
        if (j + 2 < sizes.size())
            s->push_back(torch::nn::Tanh());
        else
            s->push_back(torch::nn::Identity());
    }
    return s;
}

struct ActorImpl : torch::nn::Module {
    ActorImpl(int64_t obs, int64_t act, std::vector<int64_t> hidden) {
        log_std = register_parameter("log_std", torch::full({act}, -0.5));
        std::vector<int64_t> sizes{obs};
        sizes.insert(sizes.end(), hidden.begin(), hidden.end());
        sizes.push_back(act);
        mu_net = register_module("mu_net", mlp(sizes));
    }
    torch::Tensor log_std;
    torch::nn::Sequential mu_net{nullptr};
};
TORCH_MODULE(Actor);

struct CriticImpl : torch::nn::Module {
    CriticImpl(int64_t obs, std::vector<int64_t> hidden) {
        std::vector<int64_t> sizes{obs};
        sizes.insert(sizes.end(), hidden.begin(), hidden.end());
        sizes.push_back(1);
        v_net = register_module("v_net", mlp(sizes));
    }
    torch::nn::Sequential v_net{nullptr};
};
TORCH_MODULE(Critic);

struct ActorCritic : torch::nn::Module {
    ActorCritic(int64_t obs, int64_t act, std::vector<int64_t> hidden) {
        pi = register_module("pi", Actor(obs, act, hidden));
        v = register_module("v", Critic(obs, hidden));
    }
    Actor pi{nullptr};
    Critic v{nullptr};
};

/// torchvision's resnet50() parameter shapes in named_parameters() order:
/// 161 tensors, 25,557,032 values (bench/peers/common.py has the same list).
std::vector<std::pair<std::string, std::vector<int64_t>>> resnet50_shapes() {
    std::vector<std::pair<std::string, std::vector<int64_t>>> s = {
        {"conv1.weight", {64, 3, 7, 7}}, {"bn1.weight", {64}}, {"bn1.bias", {64}}};
    int64_t inplanes = 64;
    const std::pair<int64_t, int> layers[] = {{64, 3}, {128, 4}, {256, 6}, {512, 3}};
    for (int li = 0; li < 4; ++li) {
        const auto [planes, blocks] = layers[li];
        for (int b = 0; b < blocks; ++b) {
            const std::string pre = "layer" + std::to_string(li + 1) + "." + std::to_string(b) + ".";
            s.push_back({pre + "conv1.weight", {planes, inplanes, 1, 1}});
            s.push_back({pre + "bn1.weight", {planes}});
            s.push_back({pre + "bn1.bias", {planes}});
            s.push_back({pre + "conv2.weight", {planes, planes, 3, 3}});
            s.push_back({pre + "bn2.weight", {planes}});
            s.push_back({pre + "bn2.bias", {planes}});
            s.push_back({pre + "conv3.weight", {planes * 4, planes, 1, 1}});
            s.push_back({pre + "bn3.weight", {planes * 4}});
            s.push_back({pre + "bn3.bias", {planes * 4}});
            if (b == 0) {
                s.push_back({pre + "downsample.0.weight", {planes * 4, inplanes, 1, 1}});
                s.push_back({pre + "downsample.1.weight", {planes * 4}});
                s.push_back({pre + "downsample.1.bias", {planes * 4}});
            }
            inplanes = planes * 4;
        }
    }
    s.push_back({"fc.weight", {1000, 2048}});
    s.push_back({"fc.bias", {1000}});
    return s;
}

/// A module holding only parameters (LibTorch names cannot contain dots).
struct ParameterSet : torch::nn::Module {
    explicit ParameterSet(const std::vector<std::pair<std::string, std::vector<int64_t>>>& shapes) {
        for (const auto& [name, shape] : shapes) {
            std::string n = name;
            for (auto& c : n)
                if (c == '.') c = '_';
            register_parameter(n, torch::zeros(shape));
        }
    }
};

std::shared_ptr<torch::nn::Module> make_model(const std::string& name) {
    if (name == "ac64") return std::make_shared<ActorCritic>(17, 6, std::vector<int64_t>{64, 64});
    if (name == "ac256")
        return std::make_shared<ActorCritic>(17, 6, std::vector<int64_t>{256, 256});
    if (name == "resnet50") return std::make_shared<ParameterSet>(resnet50_shapes());
    throw std::invalid_argument("unknown model " + name);
}

// ------------------------------------------------------------------ bench

void run_model(const std::string& name, const bench::Protocol& proto) {
    const int rank = bench::rank(), size = bench::size();
    auto model = make_model(name);
    auto params = model->parameters();
    torch::manual_seed(1000 + rank);
    torch::NoGradGuard no_grad;
    std::size_t values = 0;
    for (auto& p : params) {
        p.copy_(torch::randn(p.sizes()));
        p.mutable_grad() = torch::randn(p.sizes());
        values += static_cast<std::size_t>(p.numel());
    }
    std::vector<float> flat(values, 1.0f);
    const int n = static_cast<int>(values);

    const std::vector<bench::Variant> grads = {
        {"mpiml", [&] { mpiml::mpi_avg_grads(*model); }},
        {"mpi_allreduce_per_param",
         [&] {
             for (auto& p : params) {
                 auto& g = p.mutable_grad();
                 MPI_Allreduce(MPI_IN_PLACE, g.data_ptr<float>(), static_cast<int>(g.numel()),
                               MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
                 g.div_(size);
             }
         }},
        {"mpi_allreduce_flat",
         [&] { MPI_Allreduce(MPI_IN_PLACE, flat.data(), n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); }},
    };
    const std::vector<bench::Variant> sync = {
        {"mpiml", [&] { mpiml::sync_params(*model); }, false, true},
        {"mpi_bcast_per_param",
         [&] {
             for (auto& p : params)
                 MPI_Bcast(p.data_ptr<float>(), static_cast<int>(p.numel()), MPI_FLOAT, 0,
                           MPI_COMM_WORLD);
         },
         false, true},
        {"mpi_bcast_flat", [&] { MPI_Bcast(flat.data(), n, MPI_FLOAT, 0, MPI_COMM_WORLD); }, false,
         true},
    };
    for (const auto& [bench_name, variants] : {std::pair{"avg_grads", &grads}, {"sync_params", &sync}}) {
        const auto t = bench::measure(*variants, proto);
        if (rank != 0) continue;
        for (const auto& x : t)
            bench::timing_json("grads", bench_name, x)
                .add("model", name)
                .add("tensors", params.size())
                .add("values", values)
                .add("bytes", values * sizeof(float))
                .print();
    }
}

}  // namespace

int main(int argc, char** argv) {
    mpiml::Session session(argc, argv);
    mpiml::setup_pytorch_for_mpi();  // as the seed's users do
    bench::Protocol proto;
    proto.rounds = std::stoi(bench::arg(argc, argv, "rounds", "7"));
    proto.round_seconds = std::stod(bench::arg(argc, argv, "round-ms", "20")) * 1e-3;
    std::stringstream models(bench::arg(argc, argv, "models", "ac64,ac256,resnet50"));
    for (std::string m; std::getline(models, m, ',');)
        if (!m.empty()) run_model(m, proto);
    return 0;
}
