// GradAverager with overlap against without, on a training step of a large
// MLP (LibTorch): zero_grad, forward, backward, the averager's call, SGD step.
//
//   mpirun -np 2 bench_overlap [--layers 8] [--width 2048] [--batch 64]
//                              [--steps 10] [--cap-mb 25] [--threads 1]
//
// Copies of the model take the same data, one with each averager (without
// overlap, with overlap, with overlap and MPI's polling waits); their steps
// alternate, so all see the same machine load. Also measured: the step
// without any averaging (compute only) and the averaging alone (the call
// without overlap, after backward) and what overlap leaves to the call after
// backward(). Each figure: the median over steps of the
// slowest rank's time. The last line says whether the copies' parameters
// are bit-identical after the run (they must be).
#include "bench_common.hpp"

#include <mpiml/mpiml.hpp>
#include <mpiml/torch.hpp>

#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

long arg(int argc, char** argv, const char* name, long def) {
    for (int i = 1; i + 1 < argc; ++i)
        if (std::strcmp(argv[i], name) == 0) return std::atol(argv[i + 1]);
    return def;
}

torch::nn::Sequential mlp(int layers, int width) {
    torch::manual_seed(3);
    torch::nn::Sequential s;
    for (int i = 0; i < layers; ++i) {
        s->push_back(torch::nn::Linear(width, width));
        if (i + 1 < layers) s->push_back(torch::nn::ReLU());
    }
    return s;
}

double now() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
    mpiml::SessionOptions so;
    so.thread_level = MPI_THREAD_SERIALIZED;  // overlap's communication thread
    mpiml::Session session(argc, argv, so);
    const int layers = static_cast<int>(arg(argc, argv, "--layers", 8));
    const int width = static_cast<int>(arg(argc, argv, "--width", 2048));
    const int batch = static_cast<int>(arg(argc, argv, "--batch", 64));
    const int steps = static_cast<int>(arg(argc, argv, "--steps", 10));
    const double cap_mb = static_cast<double>(arg(argc, argv, "--cap-mb", 25));
    torch::set_num_threads(static_cast<int>(arg(argc, argv, "--threads", 1)));
    const int rank = session.rank();

    auto plain = mlp(layers, width), over = mlp(layers, width), poll = mlp(layers, width),
         bare = mlp(layers, width);
    mpiml::AvgGradsOptions o;
    o.bucket_cap_bytes = static_cast<std::size_t>(cap_mb * (1 << 20));
    mpiml::GradAverager plain_avg(plain, o);
    o.overlap = true;
    mpiml::GradAverager over_avg(over, o);
    o.quiet_wait = false;
    mpiml::GradAverager poll_avg(poll, o);
    torch::optim::SGD plain_opt(plain->parameters(), 1e-3), over_opt(over->parameters(), 1e-3),
        poll_opt(poll->parameters(), 1e-3), bare_opt(bare->parameters(), 1e-3);
    std::int64_t params = 0;
    for (const auto& p : plain->parameters()) params += p.numel();

    torch::manual_seed(100 + rank);
    std::vector<double> t_plain, t_over, t_poll, t_bare, t_avg, t_left, t_poll_left;
    for (int step = -1; step < steps; ++step) {  // step -1: warm-up
        const auto x = torch::randn({batch, width}), y = torch::randn({batch, width});
        auto run = [&](torch::nn::Sequential& m, torch::optim::SGD& opt, mpiml::GradAverager* avg,
                       std::vector<double>& out, std::vector<double>* avg_only) {
            MPI_Barrier(MPI_COMM_WORLD);
            const double t0 = now();
            opt.zero_grad();
            torch::nn::functional::mse_loss(m->forward(x), y).backward();
            const double t1 = now();
            if (avg) (*avg)();
            const double t2 = now();
            opt.step();
            const double t3 = now();
            const double total = bench::max_over_ranks(t3 - t0), avg_t = bench::max_over_ranks(t2 - t1);
            if (step >= 0) {
                out.push_back(total);
                if (avg_only) avg_only->push_back(avg_t);
            }
        };
        run(plain, plain_opt, &plain_avg, t_plain, &t_avg);
        run(over, over_opt, &over_avg, t_over, &t_left);
        run(poll, poll_opt, &poll_avg, t_poll, &t_poll_left);
        run(bare, bare_opt, nullptr, t_bare, nullptr);
    }
    bool same = true;
    const auto pp = plain->parameters(), po = over->parameters(), pq = poll->parameters();
    for (std::size_t i = 0; i < pp.size(); ++i) same = same && pp[i].equal(po[i]) && pp[i].equal(pq[i]);
    int all_same = same ? 1 : 0;
    MPI_Allreduce(MPI_IN_PLACE, &all_same, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (rank == 0) {
        const double p = median(t_plain), v = median(t_over);
        std::printf("# bench_overlap: %d ranks, MLP %d x (%d x %d), %.1f M float32 (%.0f MiB), batch %d/rank, "
                    "%d steps, cap %.0f MiB, %d intra-op threads\n",
                    session.size(), layers, width, width, params / 1e6, params * 4.0 / (1 << 20), batch,
                    steps, cap_mb, torch::get_num_threads());
        std::printf("step without averaging (compute only)   %8.1f ms\n", median(t_bare) * 1e3);
        std::printf("averaging alone (call after backward)   %8.1f ms\n", median(t_avg) * 1e3);
        std::printf("left at the call with overlap           %8.1f ms\n", median(t_left) * 1e3);
        std::printf("step, GradAverager without overlap      %8.1f ms\n", p * 1e3);
        std::printf("step, GradAverager with overlap         %8.1f ms\n", v * 1e3);
        std::printf("speed-up with overlap                   %8.2fx\n", p / v);
        std::printf("left at the call, overlap polling       %8.1f ms\n", median(t_poll_left) * 1e3);
        std::printf("step, overlap with MPI's polling waits  %8.1f ms (%.2fx)\n", median(t_poll) * 1e3,
                    p / median(t_poll));
        std::printf("parameters bit-identical after the run: %s\n", all_same ? "yes" : "NO");
    }
    return all_same ? 0 : 1;
}
