// cluster_hash: a hash of the results of several allreduces, printed by rank 0.
// Run once with simulated nodes (MPIML_NODE_SPLIT) on one host and once on real
// hosts with the same layout: the hierarchical path promises the same
// reduction order, so the two hashes must be equal bit for bit.
// Prints "cluster_hash: <hex> nodes=<real nodes> hosts=<names>"; exits
// non-zero if the ranks disagree.
#include <mpiml/mpiml.hpp>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <set>
#include <string>
#include <vector>

namespace {

std::uint64_t h = 1469598103934665603ULL;  // FNV-1a 64
void feed(const void* p, std::size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    for (std::size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ULL;
}
template <class T>
void feed(const std::vector<T>& v) {
    feed(v.data(), v.size() * sizeof(T));
}

template <class T>
void reduce_all(int rank, std::size_t n, bool exact) {
    for (auto op : {mpiml::Op::sum, mpiml::Op::max, mpiml::Op::prod}) {
        std::vector<T> x(n);
        for (std::size_t i = 0; i < n; ++i) {
            if (op == mpiml::Op::prod)
                x[i] = exact ? T(1 + (i + rank) % 2) : T(1.0 + 0.1 * ((i * 7 + rank) % 5));
            else
                x[i] = exact ? T(static_cast<int>((i * 31 + rank * 17) % 1024) - 512)
                             : T(0.1 * static_cast<double>(i % 1000) + rank / 3.0 - 1e-3 * i);
        }
        mpiml::allreduce(x, op);
        feed(x);
    }
}

}  // namespace

int main(int argc, char** argv) {
    mpiml::Session session(argc, argv);
    const int rank = mpiml::proc_id(), size = mpiml::num_procs();
    // Sizes below and above every shared-memory threshold and pipeline chunk.
    for (auto mode : {mpiml::shm::Mode::automatic, mpiml::shm::Mode::on}) {
        mpiml::shm::set_mode(mode);
        for (std::size_t n : {1ul, 7ul, 1000ul, 16384ul, 100000ul, 1ul << 20, (3ul << 20) + 5})
            for (bool exact : {true, false}) {
                reduce_all<float>(rank, n, exact);
                reduce_all<double>(rank, n, exact);
            }
        std::vector<double> samples(static_cast<std::size_t>(1000 + 37 * rank));
        for (std::size_t i = 0; i < samples.size(); ++i) samples[i] = 0.1 * i - rank / 7.0;
        const auto st = mpiml::mpi_statistics_scalar(samples, true);
        feed(&st.mean, sizeof st.mean);
        feed(&st.std, sizeof st.std);
        const double avg = mpiml::mpi_avg(0.1 * (rank + 1));
        feed(&avg, sizeof avg);
    }
    mpiml::shm::set_mode(mpiml::shm::Mode::automatic);

    // Every rank must hold the same hash.
    std::uint64_t mine = h, lo = h, hi = h;
    mpiml::allreduce(lo, mpiml::Op::min);
    mpiml::allreduce(hi, mpiml::Op::max);

    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
    int node_rank = 0;
    MPI_Comm_rank(node, &node_rank);
    MPI_Comm_free(&node);
    const int nodes = mpiml::mpi_sum(node_rank == 0 ? 1 : 0);
    char name[MPI_MAX_PROCESSOR_NAME] = {};
    int len = 0;
    MPI_Get_processor_name(name, &len);
    std::vector<char> names(static_cast<std::size_t>(size) * MPI_MAX_PROCESSOR_NAME);
    MPI_Gather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, names.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR, 0,
               MPI_COMM_WORLD);
    if (rank == 0) {
        std::string hosts;
        for (int r = 0; r < size; ++r) hosts += std::string(r ? "," : "") + (names.data() + r * MPI_MAX_PROCESSOR_NAME);
        std::printf("cluster_hash: %016llx nodes=%d hosts=%s\n", static_cast<unsigned long long>(mine), nodes,
                    hosts.c_str());
        if (lo != hi) std::printf("cluster_hash: ranks disagree (%016llx .. %016llx)\n",
                                  static_cast<unsigned long long>(lo), static_cast<unsigned long long>(hi));
    }
    return lo == hi ? 0 : 1;
}
