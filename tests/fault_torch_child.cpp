// Fault injection with GradAverager(overlap=true): fault_torch_child <mode>
// <faulty-rank>. Every rank trains a small MLP whose gradients fill several
// buckets; at step 2 the faulty rank fails during backward(), after its
// last layer's bucket went to the communication thread, so the other ranks'
// communication threads wait for it in a collective (GradAverager's own
// allreduce on MPI's path). Modes: exit (std::exit(3)), sigkill, throw
// (uncaught), throw_run (the same inside mpiml::run, which unwinds the
// averager), exit_inside
// (std::exit(3) while its own communication thread waits in its allreduce: the
// other ranks come 1 s late). free_exit and free_return: the free function
// mpi_avg_grads (its plans cached per thread, buckets in shared memory), and
// at step 2 the faulty rank calls std::exit(3) or returns from main while the
// others wait in the averaging. The job must end with a non-zero status and a
// message naming the rank, never hang. FAULT_BUCKET_VIEWS set: with
// gradient_as_bucket_view too. averager_return: a GradAverager (no overlap)
// that the faulty rank destroys as it returns from main at step 2, while the
// others wait in its allreduce (its buckets' release is collective).
#include <mpiml/mpiml.hpp>
#include <mpiml/torch.hpp>

#include "fault_mark.hpp"

#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace {

int free_function(const std::string& mode, int faulty) {
    const int rank = mpiml::proc_id();
    torch::manual_seed(1);
    torch::nn::Sequential net(torch::nn::Linear(64, 256), torch::nn::Linear(256, 8));
    mpiml::AvgGradsOptions o;
    o.gradient_as_bucket_view = std::getenv("FAULT_BUCKET_VIEWS") != nullptr;
    torch::optim::SGD opt(net->parameters(), 0.01);
    const auto x = torch::randn({32, 64}), y = torch::randn({32, 8});
    for (int step = 0; step < 5; ++step) {
        if (step == 2 && rank == faulty) {
            fault_mark();
            if (mode == "free_exit") std::exit(3);
            return 0;
        }
        opt.zero_grad();
        torch::nn::functional::mse_loss(net->forward(x), y).backward();
        mpiml::mpi_avg_grads(*net, o);
        opt.step();
    }
    return 0;
}

int averager_return(int faulty) {
    const int rank = mpiml::proc_id();
    torch::manual_seed(1);
    torch::nn::Sequential net(torch::nn::Linear(64, 256), torch::nn::Linear(256, 8));
    mpiml::GradAverager avg(net);
    const auto x = torch::randn({32, 64}), y = torch::randn({32, 8});
    for (int step = 0; step < 5; ++step) {
        if (step == 2 && rank == faulty) {
            fault_mark();
            return 0;
        }
        net->zero_grad();
        torch::nn::functional::mse_loss(net->forward(x), y).backward();
        avg();
    }
    return 0;
}

int body(const std::string& mode, int faulty) {
    if (mode.starts_with("free_")) return free_function(mode, faulty);
    if (mode == "averager_return") return averager_return(faulty);
    const int rank = mpiml::proc_id();
    torch::manual_seed(1);
    torch::nn::Sequential net(torch::nn::Linear(64, 256), torch::nn::Linear(256, 256),
                              torch::nn::Linear(256, 256), torch::nn::Linear(256, 8));
    mpiml::AvgGradsOptions o;
    o.overlap = true;
    o.overlap_on_one_node = true;  // the overlapped path on one host too
    o.bucket_cap_bytes = 64 << 10;  // one bucket per layer's weight
    o.gradient_as_bucket_view = std::getenv("FAULT_BUCKET_VIEWS") != nullptr;  // views from step 1
    mpiml::GradAverager avg(net, o);
    torch::optim::SGD opt(net->parameters(), 0.01);
    int step = 0;
    if (rank == faulty) {
        // The first layer's weight gets its gradient last: the later layers'
        // buckets are on their way when this rank fails.
        net[0]->as<torch::nn::Linear>()->weight.register_hook([&](const torch::Tensor& g) {
            if (step != 2) return g;
            fault_mark();
            if (mode == "exit_inside") {
                ::usleep(300 * 1000);  // the communication thread is in the first bucket's allreduce
                std::exit(3);
            }
            if (mode == "exit") std::exit(3);
            if (mode == "sigkill") ::kill(::getpid(), SIGKILL);
            throw std::runtime_error("injected failure during backward");
        });
    }
    const auto x = torch::randn({32, 64}), y = torch::randn({32, 8});
    for (step = 0; step < 5; ++step) {
        opt.zero_grad();
        if (mode == "exit_inside" && rank != faulty && step == 2) ::sleep(3);
        torch::nn::functional::mse_loss(net->forward(x), y).backward();
        avg();
        opt.step();
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 3) {
        std::fprintf(stderr, "usage: fault_torch_child <mode>[_run] <faulty-rank>\n");
        return 2;
    }
    std::string mode = argv[1];
    const int faulty = std::atoi(argv[2]);
    mpiml::SessionOptions so;
    so.thread_level = MPI_THREAD_SERIALIZED;
    mpiml::Session session(argc, argv, so);
    if (mode.ends_with("_run")) {
        mode.resize(mode.size() - 4);
        return mpiml::run(argc, argv, [&](int, char**) { return body(mode, faulty); });
    }
    return body(mode, faulty);
}
