// A tour of mpiml's core: run as `mpiml-demo [N]` (forks N ranks, default 2).
#include <mpiml/mpiml.hpp>

#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <string>
#include <vector>

int main(int argc, char** argv) {
    const int n = argc > 1 ? std::atoi(argv[1]) : 2;
    mpiml::mpi_fork(n);  // re-launches this program on n ranks; returns in them

    const int rank = mpiml::proc_id();
    const int size = mpiml::num_procs();
    mpiml::pprint("mpiml demo on " + std::to_string(size) + " ranks");
    mpiml::msg("hello", "demo");

    // Scalars keep their type; integers average to double.
    const long total = mpiml::mpi_sum(static_cast<long>(rank + 1));
    const double mean_rank = mpiml::mpi_avg(rank);
    const int max_rank = mpiml::mpi_op(rank, mpiml::Op::max);

    // Ranges: a new vector, element type preserved.
    std::vector<double> v = {1.0 * rank, 2.0, 3.5};
    const auto vsum = mpiml::mpi_sum(v);

    // In-place allreduce and broadcast.
    std::vector<int> counts = {rank, 1};
    mpiml::allreduce(counts, mpiml::Op::sum);
    std::string greeting = rank == 0 ? "parameters from rank 0" : "";
    mpiml::broadcast(greeting);

    // Statistics pooled over ranks with different numbers of samples.
    std::vector<double> samples(static_cast<std::size_t>(3 + rank));
    std::iota(samples.begin(), samples.end(), 10.0 * rank);
    const auto st = mpiml::mpi_statistics_scalar(samples, true);

    mpiml::pprint("sum(rank+1) = " + std::to_string(total) + ", avg(rank) = " +
                  std::to_string(mean_rank) + ", max(rank) = " + std::to_string(max_rank));
    mpiml::pprint("sum of {rank, 2, 3.5} = {" + std::to_string(vsum[0]) + ", " +
                  std::to_string(vsum[1]) + ", " + std::to_string(vsum[2]) + "}");
    mpiml::pprint("allreduce in place {rank, 1} -> {" + std::to_string(counts[0]) + ", " +
                  std::to_string(counts[1]) + "}; broadcast: \"" + greeting + "\"");
    char line[200];
    std::snprintf(line, sizeof line,
                  "statistics over %llu samples: mean %.4f std %.4f min %.1f max %.1f",
                  static_cast<unsigned long long>(st.count), st.mean, st.std, st.min, st.max);
    mpiml::pprint(line);
    return 0;
}
