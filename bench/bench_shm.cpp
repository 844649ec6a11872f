// Shared-memory path vs MPI, measured side by side in one run.
//
//   mpirun -np 2 bench_shm [--rounds R] [--min-bytes B] [--max-mib M | --max-bytes B] [--no-bcast] [--no-grads]
//
// For each size: single-core memcpy time (calibration), MPI_Allreduce,
// mpiml::allreduce forced onto the shared-memory path, and mpiml::allreduce as
// dispatched by default (auto). Then the same for broadcast, and gradient
// averaging of a ResNet-50-sized parameter set (25.6 M float32 in 161
// tensors): packed into 25 MiB buckets and averaged through MPI_Allreduce
// (the fused plain mode), vs gradients living in a SharedBucket (bucket
// view), against the memory bound T = 1.25 * t_memcpy(n).
//
// Each figure is the best of R rounds; rounds interleave the methods so that
// load from other processes hits them alike. Times are the slowest rank's.
#include <mpiml/mpiml.hpp>
#ifdef MPIML_BENCH_TORCH
#include <mpiml/torch.hpp>
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
namespace shm = mpiml::shm;

int g_rank = 0, g_size = 1;

// Seconds per call of f, slowest rank, over iters calls.
double time_calls(int iters, const std::function<void()>& f) {
    MPI_Barrier(MPI_COMM_WORLD);
    const auto t0 = Clock::now();
    for (int i = 0; i < iters; ++i) f();
    double t = std::chrono::duration<double>(Clock::now() - t0).count() / iters;
    MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return t;
}

// Best of rounds for each method, methods interleaved within a round.
std::vector<double> best_of(int rounds, int iters, const std::vector<std::function<void()>>& fs) {
    std::vector<double> best(fs.size(), 1e30);
    for (auto& f : fs) f();  // warm up (first touch, contexts)
    for (int r = 0; r < rounds; ++r)
        for (std::size_t k = 0; k < fs.size(); ++k)
            best[k] = std::min(best[k], time_calls(iters, fs[k]));
    return best;
}

// Single-core memcpy of n bytes on rank 0 (the others idle), as one more
// method in best_of, so that it is measured under the same conditions.
struct MemcpyProbe {
    explicit MemcpyProbe(std::size_t n_)
        : n(n_), a(g_rank == 0 ? std::max<std::size_t>(n_, 1) : 1, 1),
          b(g_rank == 0 ? std::max<std::size_t>(n_, 1) : 1, 2) {}
    void operator()() {
        if (g_rank != 0) return;
        std::memcpy(b.data(), a.data(), n);
        asm volatile("" ::"r"(b.data()) : "memory");
    }
    std::size_t n;
    std::vector<char> a, b;
};

int iters_for(std::size_t bytes) {
    const std::size_t budget = std::size_t{48} << 20;  // bytes per timed block
    return static_cast<int>(std::clamp<std::size_t>(budget / std::max<std::size_t>(bytes, 1), 3, 2000));
}

std::string human(std::size_t b) {
    char s[32];
    if (b >= (1u << 20)) std::snprintf(s, sizeof s, "%zu MiB", b >> 20);
    else if (b >= 1024) std::snprintf(s, sizeof s, "%zu KiB", b >> 10);
    else std::snprintf(s, sizeof s, "%zu B", b);
    return s;
}

void bench_allreduce(std::size_t min_bytes, std::size_t max_bytes, int rounds) {
    if (g_rank == 0) {
        std::printf("\n## allreduce, float32 sum, out of place, %d ranks\n", g_size);
        std::printf("%-9s %9s %11s %11s %11s %9s %9s %10s\n", "size", "memcpy", "MPI us",
                    "shm us", "auto us", "shm/MPI", "auto/MPI", "shm busbw");
        std::printf("%-9s %9s %11s %11s %11s %9s %9s %10s\n", "", "GB/s r+w", "", "", "",
                    "speedup", "time", "GB/s");
    }
    for (std::size_t bytes = min_bytes; bytes <= max_bytes; bytes *= 2) {
        const std::size_t n = bytes / sizeof(float);
        std::vector<float> in(n, 1.0f + static_cast<float>(g_rank)), out(n, 0.0f);
        const int it = iters_for(bytes);
        MemcpyProbe probe(bytes);
        auto t = best_of(rounds, it,
                         {std::ref(probe),
                          [&] {
                              MPI_Allreduce(in.data(), out.data(), static_cast<int>(n), MPI_FLOAT,
                                            MPI_SUM, MPI_COMM_WORLD);
                          },
                          [&] {
                              shm::set_mode(shm::Mode::on);
                              mpiml::allreduce(in, out, mpiml::Op::sum);
                              shm::set_mode(shm::Mode::automatic);
                          },
                          [&] { mpiml::allreduce(in, out, mpiml::Op::sum); }});
        if (g_rank == 0) {
            const double busbw = 2.0 * (g_size - 1) / g_size * bytes / t[2] / 1e9;
            std::printf("%-9s %9.2f %11.2f %11.2f %11.2f %9.2f %9.3f %10.2f\n",
                        human(bytes).c_str(), 2.0 * bytes / t[0] / 1e9, t[1] * 1e6, t[2] * 1e6,
                        t[3] * 1e6, t[1] / t[2], t[3] / t[1], busbw);
            std::fflush(stdout);
        }
    }
}

void bench_broadcast(std::size_t max_bytes, int rounds) {
    if (g_rank == 0) {
        std::printf("\n## broadcast, bytes, root 0, %d ranks\n", g_size);
        std::printf("%-9s %11s %11s %11s %9s %9s\n", "size", "MPI us", "shm us", "auto us",
                    "shm/MPI", "auto/MPI");
    }
    for (std::size_t bytes = 4; bytes <= max_bytes; bytes *= 4) {
        std::vector<unsigned char> buf(bytes, 7);
        const int it = iters_for(bytes);
        auto t = best_of(rounds, it,
                         {[&] {
                              MPI_Bcast(buf.data(), static_cast<int>(bytes), MPI_BYTE, 0,
                                        MPI_COMM_WORLD);
                          },
                          [&] {
                              shm::set_mode(shm::Mode::on);
                              mpiml::broadcast(buf, 0);
                              shm::set_mode(shm::Mode::automatic);
                          },
                          [&] { mpiml::broadcast(buf, 0); }});
        if (g_rank == 0) {
            std::printf("%-9s %11.2f %11.2f %11.2f %9.2f %9.3f\n", human(bytes).c_str(),
                        t[0] * 1e6, t[1] * 1e6, t[2] * 1e6, t[0] / t[1], t[2] / t[0]);
            std::fflush(stdout);
        }
    }
}

// torchvision's resnet50 parameters, in model order (161 tensors, 25,557,032 floats).
std::vector<std::size_t> resnet50_sizes() {
    std::vector<std::size_t> s = {64 * 3 * 7 * 7, 64, 64};
    std::size_t in = 64;
    const std::size_t widths[] = {64, 128, 256, 512};
    const int blocks[] = {3, 4, 6, 3};
    for (int l = 0; l < 4; ++l) {
        const std::size_t w = widths[l];
        for (int b = 0; b < blocks[l]; ++b) {
            s.insert(s.end(), {w * in, w, w, w * w * 9, w, w, 4 * w * w, 4 * w, 4 * w});
            if (b == 0) s.insert(s.end(), {4 * w * in, 4 * w, 4 * w});  // downsample
            in = 4 * w;
        }
    }
    s.insert(s.end(), {1000 * 2048, 1000});
    return s;
}

void bench_grads(int rounds) {
    const auto sizes = resnet50_sizes();
    std::size_t n = 0;
    for (auto k : sizes) n += k;
    const std::size_t bytes = n * sizeof(float);
    const float inv = 1.0f / static_cast<float>(g_size);

    // Plain mode: separate gradient tensors, packed into 25 MiB buckets in
    // order, one MPI_Allreduce per bucket, unpacked with the division.
    std::vector<std::vector<float>> grads;
    for (auto k : sizes) grads.emplace_back(k, 0.5f + static_cast<float>(g_rank));
    const std::size_t cap = (std::size_t{25} << 20) / sizeof(float);
    std::vector<float> pack(cap);
    auto plain = [&] {
        std::size_t t = 0;
        while (t < grads.size()) {
            std::size_t used = 0, first = t;
            while (t < grads.size() && (used == 0 || used + grads[t].size() <= cap)) {
                if (grads[t].size() > pack.size()) pack.resize(grads[t].size());
                std::memcpy(pack.data() + used, grads[t].data(), grads[t].size() * sizeof(float));
                used += grads[t].size();
                ++t;
            }
            MPI_Allreduce(MPI_IN_PLACE, pack.data(), static_cast<int>(used), MPI_FLOAT, MPI_SUM,
                          MPI_COMM_WORLD);
            used = 0;
            for (std::size_t k = first; k < t; ++k) {
                float* g = grads[k].data();
                const float* src = pack.data() + used;
                for (std::size_t i = 0; i < grads[k].size(); ++i) g[i] = src[i] * inv;
                used += grads[k].size();
            }
        }
    };
    // Bucket view: the gradients are views into one shared bucket.
    mpiml::SharedBucket bucket(bytes);
    for (auto& v : bucket.as_span<float>()) v = 0.5f + static_cast<float>(g_rank);
    auto view = [&] { bucket.average<float>(n); };
    // The same data as one flat ordinary buffer through mpiml::allreduce (auto).
    std::vector<float> flat(n, 0.5f + static_cast<float>(g_rank));
    auto flat_mpiml = [&] { mpiml::allreduce(flat, mpiml::Op::sum); };

    MemcpyProbe probe(bytes);
    auto all = best_of(rounds, 3, {std::ref(probe), plain, view, flat_mpiml});
    const double tm = all[0];
    const std::vector<double> t(all.begin() + 1, all.end());
    if (g_rank == 0) {
        const double bound = 1.25 * tm;
        std::printf("\n## gradient averaging, ResNet-50 sized: %zu tensors, %zu float32 (%.1f MB), %d ranks\n",
                    sizes.size(), n, bytes / 1e6, g_size);
        std::printf("memcpy of n bytes (1 core): %.2f ms (%.2f GB/s read+written); memory bound T = 1.25 x memcpy = %.2f ms\n",
                    tm * 1e3, 2.0 * bytes / tm / 1e9, bound * 1e3);
        std::printf("%-44s %9.2f ms\n", "plain: pack 25 MiB buckets + MPI_Allreduce", t[0] * 1e3);
        std::printf("%-44s %9.2f ms  speedup %.2fx  efficiency T/t = %.0f%%\n",
                    "bucket view: SharedBucket::average", t[1] * 1e3, t[0] / t[1],
                    100 * bound / t[1]);
        std::printf("%-44s %9.2f ms  speedup %.2fx\n", "flat buffer: mpiml::allreduce (auto)",
                    t[2] * 1e3, t[0] / t[2]);
    }
}

#ifdef MPIML_BENCH_TORCH
// The same parameter set as LibTorch tensors through mpiml::mpi_avg_grads:
// packed mode (MPI_Allreduce, i.e. MPIML_SHM=off), packed mode as dispatched
// by default, and gradient_as_bucket_view.
void bench_torch_grads(int rounds) {
    const auto sizes = resnet50_sizes();
    std::size_t n = 0;
    std::vector<torch::Tensor> params;
    for (auto k : sizes) {
        n += k;
        auto p = torch::zeros({static_cast<std::int64_t>(k)}, torch::requires_grad());
        p.mutable_grad() = torch::full_like(p, 0.5 + g_rank);
        params.push_back(p);
    }
    const std::size_t bytes = n * sizeof(float);
    mpiml::AvgGradsOptions packed, views;
    views.gradient_as_bucket_view = true;
    MemcpyProbe probe(bytes);
    auto t = best_of(rounds, 3,
                     {std::ref(probe),
                      [&] {
                          shm::set_mode(shm::Mode::off);
                          mpiml::mpi_avg_grads(params, packed);
                          shm::set_mode(shm::Mode::automatic);
                      },
                      [&] { mpiml::mpi_avg_grads(params, packed); },
                      [&] { mpiml::mpi_avg_grads(params, views); }});
    if (g_rank == 0) {
        const double bound = 1.25 * t[0];
        std::printf("\n## mpiml::mpi_avg_grads (LibTorch), ResNet-50 sized: %zu tensors, %zu float32, %d ranks\n",
                    sizes.size(), n, g_size);
        std::printf("memcpy of n bytes (1 core): %.2f ms; T = 1.25 x memcpy = %.2f ms\n", t[0] * 1e3,
                    bound * 1e3);
        std::printf("%-44s %9.2f ms\n", "packed, MPI_Allreduce (MPIML_SHM=off)", t[1] * 1e3);
        std::printf("%-44s %9.2f ms  speedup %.2fx\n", "packed, default dispatch (auto)", t[2] * 1e3,
                    t[1] / t[2]);
        std::printf("%-44s %9.2f ms  speedup %.2fx  efficiency T/t = %.0f%%\n",
                    "gradient_as_bucket_view (25 MiB buckets)", t[3] * 1e3, t[1] / t[3],
                    100 * bound / t[3]);
    }
}
#endif

}  // namespace

int main(int argc, char** argv) {
    mpiml::Session session(argc, argv);
    g_rank = session.rank();
    g_size = session.size();
    int rounds = 5;
    std::size_t max_mib = 128, min_bytes = 4, max_bytes = 0;
    bool bcast = true, grads = true;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--rounds" && i + 1 < argc) rounds = std::atoi(argv[++i]);
        else if (a == "--max-mib" && i + 1 < argc) max_mib = std::strtoul(argv[++i], nullptr, 10);
        else if (a == "--min-bytes" && i + 1 < argc) min_bytes = std::strtoul(argv[++i], nullptr, 10);
        else if (a == "--max-bytes" && i + 1 < argc) max_bytes = std::strtoul(argv[++i], nullptr, 10);
        else if (a == "--no-bcast") bcast = false;
        else if (a == "--no-grads") grads = false;
        else {
            if (g_rank == 0) std::fprintf(stderr, "unknown argument %s\n", a.c_str());
            return 2;
        }
    }
    if (g_rank == 0) {
        char version[MPI_MAX_LIBRARY_VERSION_STRING];
        int len = 0;
        MPI_Get_library_version(version, &len);
        const auto c = shm::config();
        std::printf("# bench_shm: %d ranks; %.*s\n", g_size,
                    static_cast<int>(std::strcspn(version, ",\n")), version);
        std::printf("# shm chunk %zu KiB, auto allreduce threshold %zu B, mode %s\n",
                    c.chunk >> 10, c.allreduce_threshold,
                    c.mode == shm::Mode::on ? "on" : c.mode == shm::Mode::off ? "off" : "auto");
    }
    bench_allreduce(min_bytes, max_bytes ? max_bytes : max_mib << 20, rounds);
    if (bcast) bench_broadcast(max_mib << 20, rounds);
    if (grads) bench_grads(rounds);
#ifdef MPIML_BENCH_TORCH
    if (grads) bench_torch_grads(rounds);
#endif
    return 0;
}
