// Across hosts (scripts/cluster.sh, scripts/bench_cluster.sh): mpiml's
// hierarchical allreduce vs plain MPI_Allreduce on the same communicator, side
// by side in one run, then where the hierarchical path's time goes.
//
//   cluster.sh run -np 4 --host h1:2,h2:2 bench_cluster [--rounds R] [--max-mib M]
//
// Allreduce, float32 sum, out of place, sizes 4 B to M MiB (x4 steps):
// MPI_Allreduce, mpiml::allreduce as dispatched by default (auto), and forced
// onto the shared-memory/hierarchical path (shm on). Best of R rounds,
// methods interleaved; times are the slowest rank's.
// Phases (the same three steps run on their own, each a profiler region, so
// MPIML_PROFILE=DIR shows them on the timeline): intra-host reduce
// (mpiml::allreduce on the node's communicator, shared memory), inter-host
// exchange (MPI_Allreduce of a 1/node-size slice among the ranks of equal
// node rank, all pairs at once over TCP, as the hierarchical path exchanges),
// back to the node (mpiml::broadcast from node rank 0 on the node's
// communicator: the same bytes per rank as the node's final copy).
#include <mpiml/mpiml.hpp>

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

double time_calls(int iters, const std::function<void()>& f) {
    MPI_Barrier(MPI_COMM_WORLD);
    const auto t0 = Clock::now();
    for (int i = 0; i < iters; ++i) f();
    double t = std::chrono::duration<double>(Clock::now() - t0).count() / iters;
    MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return t;
}

std::vector<double> best_of(int rounds, int iters, const std::vector<std::function<void()>>& fs) {
    std::vector<double> best(fs.size(), 1e30);
    for (auto& f : fs) f();
    for (int r = 0; r < rounds; ++r)
        for (std::size_t k = 0; k < fs.size(); ++k) best[k] = std::min(best[k], time_calls(iters, fs[k]));
    return best;
}

int iters_for(std::size_t bytes) {
    return static_cast<int>(std::clamp<std::size_t>((std::size_t{8} << 20) / std::max<std::size_t>(bytes, 1), 2, 50));
}

std::string human(std::size_t b) {
    char s[32];
    if (b >= (1u << 20)) std::snprintf(s, sizeof s, "%zu MiB", b >> 20);
    else if (b >= 1024) std::snprintf(s, sizeof s, "%zu KiB", b >> 10);
    else std::snprintf(s, sizeof s, "%zu B", b);
    return s;
}

}  // namespace

int main(int argc, char** argv) {
    mpiml::Session session(argc, argv);
    g_rank = session.rank();
    g_size = session.size();
    int rounds = 3;
    std::size_t max_mib = 64;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--rounds" && i + 1 < argc) rounds = std::atoi(argv[++i]);
        else if (a == "--max-mib" && i + 1 < argc) max_mib = std::strtoul(argv[++i], nullptr, 10);
        else {
            if (g_rank == 0) std::fprintf(stderr, "unknown argument %s\n", a.c_str());
            return 2;
        }
    }
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, g_rank, MPI_INFO_NULL, &node);
    int node_rank = 0, node_size = 0;
    MPI_Comm_rank(node, &node_rank);
    MPI_Comm_size(node, &node_size);
    MPI_Comm peers;  // node rank r of every node
    MPI_Comm_split(MPI_COMM_WORLD, node_rank, g_rank, &peers);
    const int nodes = mpiml::mpi_sum(node_rank == 0 ? 1 : 0);
    if (g_rank == 0) {
        char version[MPI_MAX_LIBRARY_VERSION_STRING];
        int len = 0;
        MPI_Get_library_version(version, &len);
        std::printf("# bench_cluster: %d ranks on %d nodes (%d per node); %.*s\n", g_size, nodes, node_size,
                    static_cast<int>(std::strcspn(version, ",\n")), version);
        std::printf("\n## allreduce, float32 sum, out of place\n");
        std::printf("%-9s %11s %11s %11s %9s %9s\n", "size", "MPI us", "auto us", "shm on us", "auto", "shm on");
        std::printf("%-9s %11s %11s %11s %9s %9s\n", "", "", "", "", "speedup", "speedup");
    }
    const std::size_t max_bytes = max_mib << 20;
    for (std::size_t bytes = 4; bytes <= max_bytes; bytes *= 4) {
        const std::size_t n = bytes / sizeof(float);
        std::vector<float> in(n, 1.0f + static_cast<float>(g_rank)), out(n, 0.0f);
        auto t = best_of(rounds, iters_for(bytes),
                         {[&] {
                              MPI_Allreduce(in.data(), out.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM,
                                            MPI_COMM_WORLD);
                          },
                          [&] { mpiml::allreduce(in, out, mpiml::Op::sum); },
                          [&] {
                              shm::set_mode(shm::Mode::on);
                              mpiml::allreduce(in, out, mpiml::Op::sum);
                              shm::set_mode(shm::Mode::automatic);
                          }});
        if (g_rank == 0) {
            std::printf("%-9s %11.1f %11.1f %11.1f %9.2f %9.2f\n", human(bytes).c_str(), t[0] * 1e6, t[1] * 1e6,
                        t[2] * 1e6, t[0] / t[1], t[0] / t[2]);
            std::fflush(stdout);
        }
    }

    // Phases of the hierarchical path, each on its own.
    if (g_rank == 0) {
        std::printf("\n## hierarchical allreduce by phase (the steps run on their own), ms\n");
        std::printf("%-9s %11s %11s %11s %11s %11s\n", "size", "intra-host", "inter-host", "back to", "sum", "whole");
        std::printf("%-9s %11s %11s %11s %11s %11s\n", "", "reduce", "exchange", "node", "of phases", "(shm on)");
    }
    shm::set_mode(shm::Mode::on);
    for (std::size_t mib : {std::size_t{1}, std::size_t{16}, max_mib}) {
        const std::size_t n = (mib << 20) / sizeof(float);
        std::vector<float> x(n, 1.0f + static_cast<float>(g_rank)), y(n);
        const int it = iters_for(mib << 20);
        auto t = best_of(rounds, it,
                         {[&] {
                              mpiml::Region r("intra-host reduce");
                              mpiml::allreduce(x, y, mpiml::Op::sum, node);
                          },
                          [&] {
                              mpiml::Region r("inter-host exchange");
                              MPI_Allreduce(MPI_IN_PLACE, y.data(), static_cast<int>(n / node_size), MPI_FLOAT,
                                            MPI_SUM, peers);
                          },
                          [&] {
                              mpiml::Region r("back to node");
                              mpiml::broadcast(y, 0, node);
                          },
                          [&] { mpiml::allreduce(x, y, mpiml::Op::sum); }});
        if (g_rank == 0)
            std::printf("%-9s %11.2f %11.2f %11.2f %11.2f %11.2f\n", human(mib << 20).c_str(), t[0] * 1e3,
                        t[1] * 1e3, t[2] * 1e3, (t[0] + t[1] + t[2]) * 1e3, t[3] * 1e3);
    }
    shm::set_mode(shm::Mode::automatic);
    MPI_Comm_free(&peers);
    MPI_Comm_free(&node);
    return 0;
}
