// Cost of the collective history kept for the hang report: the record every
// collective makes (history_enter + history_leave: a mutex and a ~100-byte
// copy) timed alone, against the 4-byte allreduce it is part of, in the same
// run. Median of 7 trials. Run on 2 ranks:
//   mpirun -np 2 bench_history
#include "core/report.hpp"

#include <mpiml/mpiml.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

namespace {

template <class F>
double ns_per_op(F f, int n) {
    std::vector<double> t;
    for (int trial = 0; trial < 7; ++trial) {
        mpiml::barrier();
        const auto a = std::chrono::steady_clock::now();
        for (int i = 0; i < n; ++i) f();
        t.push_back(std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - a).count() / n);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
    mpiml::Session session(argc, argv);
    constexpr int n_record = 1'000'000, n_coll = 20'000;
    float x = 1.0f;
    const mpiml::detail::CallInfo info{mpiml::detail::Kind::allreduce, "mpiml::allreduce", 1, MPI_FLOAT,
                                       0, -1, MPI_COMM_WORLD};
    std::uint64_t seq = 0;
    auto record = [&] { mpiml::detail::history_leave(mpiml::detail::history_enter(info, ++seq)); };
    auto coll = [&] { mpiml::allreduce(x, mpiml::Op::sum); };
    coll();  // set-up (agent, shared memory) out of the timing
    const double rec = ns_per_op(record, n_record);
    const double all = ns_per_op(coll, n_coll);
    char text[512];
    std::snprintf(text, sizeof text,
                  "bench_history on %d rank(s), ns per operation (median of 7 trials)\n"
                  "  history record (enter + leave)  %8.1f\n"
                  "  allreduce(1 float)              %8.1f  (the record is %.1f%% of it)\n",
                  mpiml::num_procs(), rec, all, 100.0 * rec / all);
    mpiml::pprint(text, "");
    return 0;
}
