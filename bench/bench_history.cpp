// Cost of the collective history kept for the hang report: the record every
// collective makes (history_enter + history_leave: an entry into a lock-free
// ring, two coarse clock reads) timed alone, against the 4-byte allreduce it
// is part of, in the same run. Median of 7 trials. Run on 2 ranks:
//   mpirun -np 2 bench_history
#include "bench_common.hpp"
#include "core/report.hpp"

#include <mpiml/mpiml.hpp>

#include <cstdio>

int main(int argc, char** argv) {
    mpiml::Session session(argc, argv);
    constexpr int n_record = 1'000'000, n_coll = 20'000;
    float x = 1.0f;
    const mpiml::detail::CallInfo info{mpiml::detail::Kind::allreduce, "mpiml::allreduce", 1, MPI_FLOAT,
                                       0, -1, MPI_COMM_WORLD};
    std::uint64_t seq = 0;
    auto record = [&](int) { mpiml::detail::history_leave(mpiml::detail::history_enter(info, ++seq)); };
    auto coll = [&](int) { mpiml::allreduce(x, mpiml::Op::sum); };
    coll(0);  // set-up (agent, shared memory) out of the timing
    const double rec = bench::median_ns(record, n_record);
    const double all = bench::median_ns(coll, n_coll);
    char text[512];
    std::snprintf(text, sizeof text,
                  "bench_history on %d rank(s), ns per operation (median of 7 trials)\n"
                  "  history record (enter + leave)  %8.1f\n"
                  "  allreduce(1 float)              %8.1f  (the record is %.1f%% of it)\n",
                  mpiml::num_procs(), rec, all, 100.0 * rec / all);
    mpiml::pprint(text, "");
    return 0;
}
