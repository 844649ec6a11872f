// Cost of mpiml's profiler: a Region with profiling off and on, and the record
// added to a small collective, each against the same loop without it, in the
// same run. Median of 7 trials. Run on 1 or more ranks:
//   mpirun -np 2 bench_profile [dir=/tmp/mpiml_bench_profile]
#include "bench_common.hpp"

#include <mpiml/mpiml.hpp>

#include <chrono>
#include <cstdio>
#include <string>

namespace {

volatile int sink;
__attribute__((noinline)) void work(int i) { sink = i; }

}  // namespace

int main(int argc, char** argv) {
    mpiml::Session session(argc, argv);
    const std::string dir = argc > 1 ? argv[1] : "/tmp/mpiml_bench_profile";
    constexpr int n_region = 1'000'000, n_coll = 20'000;
    double x = 1.0;
    auto loop = [](int i) { work(i); };
    auto region = [](int i) {
        mpiml::Region r("bench");
        work(i);
    };
    auto coll = [&](int) { mpiml::allreduce(x, mpiml::Op::sum); };

    const double base = bench::median_ns(loop, n_region);
    const double off = bench::median_ns(region, n_region);
    const double coll_off = bench::median_ns(coll, n_coll);
    mpiml::profile_start(dir);
    const double on = bench::median_ns(region, n_region);
    const double coll_on = bench::median_ns(coll, n_coll);
    const auto t = std::chrono::steady_clock::now();
    mpiml::profile_stop();
    const double stop_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();

    char text[1024];
    std::snprintf(text, sizeof text,
                  "bench_profile on %d rank(s), ns per operation (median of 7 trials)\n"
                  "  loop body alone                 %8.1f\n"
                  "  + Region, profiling off         %8.1f  (+%.1f)\n"
                  "  + Region, profiling on          %8.1f  (+%.1f)\n"
                  "  allreduce(1 double), off        %8.1f\n"
                  "  allreduce(1 double), on         %8.1f  (+%.1f)\n"
                  "  profile_stop for %d events per rank: %.3f s\n",
                  mpiml::num_procs(), base, off, off - base, on, on - base, coll_off, coll_on,
                  coll_on - coll_off, 7 * (n_region + n_coll), stop_s);
    mpiml::pprint(text, "");
    return 0;
}
