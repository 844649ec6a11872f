// GradAverager with overlap against without, on a training step of a large
// model (LibTorch): zero_grad, forward, backward, the averager's call, SGD step.
//
//   mpirun -np 2 bench_overlap [--resnet50 1 [--image 96]] [--layers 8] [--width 2048]
//                              [--batch 64] [--steps 10] [--cap-mb 25] [--threads 1]
//
// The model: an MLP of --layers Linear layers --width wide (mean squared
// error), or with --resnet50 1 a ResNet-50 (25.6 M parameters; images of
// --image pixels a side, 1000 classes, cross entropy).
//
// Copies of the model take the same data, one with each averager (without
// overlap, with overlap, with overlap and MPI's polling waits, with overlap
// and gradient_as_bucket_view: no packing once the gradients live in the
// buckets); their steps
// alternate, so all see the same machine load. Also measured: the step
// without any averaging (compute only) and the averaging alone (the call
// without overlap, after backward) and what overlap leaves to the call after
// backward(), and overlap_stats(): the communication thread's time in the
// buckets and how much of it ran before the call (the rank with the least).
// The CPU time (user and system) a step with overlap takes from its process
// beyond the compute-only step's gives a second bound where the compute fills
// every core, as on a test bed whose hosts share cores: there a step cannot
// take less than the compute plus that CPU time.
// Each figure: the median over steps of the
// slowest rank's time. The last line says whether the copies' parameters
// are bit-identical after the run (they must be).
#include "bench_common.hpp"

#include <mpiml/mpiml.hpp>
#include <mpiml/torch.hpp>

#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/pooling.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include <sys/resource.h>

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

/// ResNet-50's bottleneck block: 1x1, 3x3 (stride), 1x1 convolutions with
/// batch norm, and a projection of the input where the shape changes.
struct BottleneckImpl : torch::nn::Module {
    BottleneckImpl(int in, int width, int stride) {
        namespace nn = torch::nn;
        const int out = width * 4;
        body = register_module(
            "body", nn::Sequential(nn::Conv2d(nn::Conv2dOptions(in, width, 1).bias(false)),
                                   nn::BatchNorm2d(width), nn::ReLU(),
                                   nn::Conv2d(nn::Conv2dOptions(width, width, 3).stride(stride).padding(1).bias(false)),
                                   nn::BatchNorm2d(width), nn::ReLU(),
                                   nn::Conv2d(nn::Conv2dOptions(width, out, 1).bias(false)),
                                   nn::BatchNorm2d(out)));
        if (stride != 1 || in != out)
            down = register_module(
                "down", nn::Sequential(nn::Conv2d(nn::Conv2dOptions(in, out, 1).stride(stride).bias(false)),
                                       nn::BatchNorm2d(out)));
    }
    torch::Tensor forward(const torch::Tensor& x) {
        return torch::relu(body->forward(x) + (down ? down->forward(x) : x));
    }
    torch::nn::Sequential body{nullptr}, down{nullptr};
};
TORCH_MODULE(Bottleneck);

torch::nn::Sequential resnet50() {
    namespace nn = torch::nn;
    torch::manual_seed(3);
    nn::Sequential s(nn::Conv2d(nn::Conv2dOptions(3, 64, 7).stride(2).padding(3).bias(false)),
                     nn::BatchNorm2d(64), nn::ReLU(), nn::MaxPool2d(nn::MaxPool2dOptions(3).stride(2).padding(1)));
    int in = 64;
    for (auto [width, blocks, stride] : {std::array{64, 3, 1}, {128, 4, 2}, {256, 6, 2}, {512, 3, 2}})
        for (int b = 0; b < blocks; ++b) {
            s->push_back(Bottleneck(in, width, b == 0 ? stride : 1));
            in = width * 4;
        }
    s->push_back(nn::AdaptiveAvgPool2d(1));
    s->push_back(nn::Flatten());
    s->push_back(nn::Linear(in, 1000));
    return s;
}

double now() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/// CPU seconds of this process so far: user + system, and system alone.
std::pair<double, double> cpu() {
    rusage u{};
    ::getrusage(RUSAGE_SELF, &u);
    const auto sec = [](const timeval& t) { return static_cast<double>(t.tv_sec) + t.tv_usec * 1e-6; };
    return {sec(u.ru_utime) + sec(u.ru_stime), sec(u.ru_stime)};
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
    const bool resnet = arg(argc, argv, "--resnet50", 0) != 0;
    const int image = static_cast<int>(arg(argc, argv, "--image", 96));
    const int layers = static_cast<int>(arg(argc, argv, "--layers", 8));
    const int width = static_cast<int>(arg(argc, argv, "--width", 2048));
    const int batch = static_cast<int>(arg(argc, argv, "--batch", 64));
    const int steps = static_cast<int>(arg(argc, argv, "--steps", 10));
    const double cap_mb = static_cast<double>(arg(argc, argv, "--cap-mb", 25));
    torch::set_num_threads(static_cast<int>(arg(argc, argv, "--threads", 1)));
    const int rank = session.rank();

    auto model = [&] { return resnet ? resnet50() : mlp(layers, width); };
    auto plain = model(), over = model(), poll = model(), bare = model(), views = model();
    mpiml::AvgGradsOptions o;
    o.bucket_cap_bytes = static_cast<std::size_t>(cap_mb * (1 << 20));
    mpiml::GradAverager plain_avg(plain, o);
    o.overlap = true;
    mpiml::GradAverager over_avg(over, o);
    o.gradient_as_bucket_view = true;
    mpiml::GradAverager views_avg(views, o);
    o.gradient_as_bucket_view = false;
    o.quiet_wait = false;
    mpiml::GradAverager poll_avg(poll, o);
    torch::optim::SGD plain_opt(plain->parameters(), 1e-3), over_opt(over->parameters(), 1e-3),
        poll_opt(poll->parameters(), 1e-3), bare_opt(bare->parameters(), 1e-3),
        views_opt(views->parameters(), 1e-3);
    std::int64_t params = 0;
    for (const auto& p : plain->parameters()) params += p.numel();

    torch::manual_seed(100 + rank);
    std::vector<double> t_plain, t_over, t_poll, t_bare, t_back, t_avg, t_left, t_poll_left,
        t_comm, t_hidden, t_views, t_views_left, t_over_cpu, t_bare_cpu, t_over_sys, t_bare_sys;
    for (int step = -1; step < steps; ++step) {  // step -1: warm-up
        const auto x = resnet ? torch::randn({batch, 3, image, image}) : torch::randn({batch, width});
        const auto y = resnet ? torch::randint(1000, {batch}) : torch::randn({batch, width});
        auto loss = [&](const torch::Tensor& out) {
            return resnet ? torch::nn::functional::cross_entropy(out, y)
                          : torch::nn::functional::mse_loss(out, y);
        };
        auto run = [&](torch::nn::Sequential& m, torch::optim::SGD& opt, mpiml::GradAverager* avg,
                       std::vector<double>& out, std::vector<double>* avg_only) {
            MPI_Barrier(MPI_COMM_WORLD);
            const double t0 = now();
            const auto [c0, s0] = cpu();
            opt.zero_grad();
            const auto l = loss(m->forward(x));
            const double tf = now();
            l.backward();
            const double t1 = now();
            if (!avg && step >= 0) t_back.push_back(bench::max_over_ranks(t1 - tf));
            if (avg) (*avg)();
            const double t2 = now();
            opt.step();
            const double t3 = now();
            const auto [c3, s3] = cpu();
            const double total = bench::max_over_ranks(t3 - t0), avg_t = bench::max_over_ranks(t2 - t1);
            if (step >= 0) {
                out.push_back(total);
                if (avg_only) avg_only->push_back(avg_t);
                if (avg == &over_avg) {
                    t_over_cpu.push_back(bench::max_over_ranks(c3 - c0));
                    t_over_sys.push_back(bench::max_over_ranks(s3 - s0));
                }
                if (!avg) {
                    t_bare_cpu.push_back(bench::max_over_ranks(c3 - c0));
                    t_bare_sys.push_back(bench::max_over_ranks(s3 - s0));
                }
            }
        };
        run(plain, plain_opt, &plain_avg, t_plain, &t_avg);
        run(over, over_opt, &over_avg, t_over, &t_left);
        if (step >= 0) {
            const auto st = over_avg.overlap_stats();
            t_comm.push_back(bench::max_over_ranks(st.averaging));
            t_hidden.push_back(-bench::max_over_ranks(-st.hidden));  // the least hidden
        }
        run(poll, poll_opt, &poll_avg, t_poll, &t_poll_left);
        run(views, views_opt, &views_avg, t_views, &t_views_left);
        run(bare, bare_opt, nullptr, t_bare, nullptr);
    }
    bool same = true;
    const auto pp = plain->parameters(), po = over->parameters(), pq = poll->parameters(),
               pv = views->parameters();
    for (std::size_t i = 0; i < pp.size(); ++i)
        same = same && pp[i].equal(po[i]) && pp[i].equal(pq[i]) && pp[i].equal(pv[i]);
    int all_same = same ? 1 : 0;
    MPI_Allreduce(MPI_IN_PLACE, &all_same, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (rank == 0) {
        const double p = median(t_plain), v = median(t_over);
        const std::string what = resnet ? "ResNet-50, images " + std::to_string(image) + " x " + std::to_string(image)
                                        : "MLP " + std::to_string(layers) + " x (" + std::to_string(width) + " x " +
                                              std::to_string(width) + ")";
        std::printf("# bench_overlap: %d ranks, %s, %.1f M float32 (%.0f MiB), batch %d/rank, "
                    "%d steps, cap %.0f MiB, %d intra-op threads\n",
                    session.size(), what.c_str(), params / 1e6, params * 4.0 / (1 << 20), batch,
                    steps, cap_mb, torch::get_num_threads());
        std::printf("step without averaging (compute only)   %8.1f ms\n", median(t_bare) * 1e3);
        std::printf("  of which backward()                   %8.1f ms\n", median(t_back) * 1e3);
        std::printf("averaging alone (call after backward)   %8.1f ms\n", median(t_avg) * 1e3);
        std::printf("left at the call with overlap           %8.1f ms\n", median(t_left) * 1e3);
        std::printf("step, GradAverager without overlap      %8.1f ms\n", p * 1e3);
        std::printf("step, GradAverager with overlap         %8.1f ms\n", v * 1e3);
        std::printf("  averaging on its thread (hidden)       %8.1f ms (%.1f ms)\n", median(t_comm) * 1e3,
                    median(t_hidden) * 1e3);
        std::printf("speed-up with overlap                   %8.2fx\n", p / v);
        const double extra = std::max(median(t_over_cpu) - median(t_bare_cpu), 0.0);
        std::printf("  CPU time of a step (user + system)    %8.1f ms (system %.1f), compute only %.1f (%.1f)\n",
                    median(t_over_cpu) * 1e3, median(t_over_sys) * 1e3, median(t_bare_cpu) * 1e3,
                    median(t_bare_sys) * 1e3);
        std::printf("  bound: idle cores %.2fx, busy cores %.2fx (compute + %.0f ms)\n", p / median(t_bare),
                    p / (median(t_bare) + extra), extra * 1e3);
        std::printf("left at the call, overlap polling       %8.1f ms\n", median(t_poll_left) * 1e3);
        std::printf("step, overlap with MPI's polling waits  %8.1f ms (%.2fx)\n", median(t_poll) * 1e3,
                    p / median(t_poll));
        std::printf("left at the call, overlap bucket views  %8.1f ms\n", median(t_views_left) * 1e3);
        std::printf("step, overlap with gradient_as_bucket_view %5.1f ms (%.2fx)\n", median(t_views) * 1e3,
                    p / median(t_views));
        std::printf("parameters bit-identical after the run: %s\n", all_same ? "yes" : "NO");
    }
    return all_same ? 0 : 1;
}
