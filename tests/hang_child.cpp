// Rank 2 of 3 (or L) is late in a function of its own while the others wait in a
// collective: the report (tests/run_report_test.sh) names both places.
//   hang_child hang [L]  the others wait past MPIML_TIMEOUT: report, abort (L late)
//   hang_child demand S  rank 2 is late S seconds; the job ends with 0
//   hang_child mismatch  rank 1 passes another count (MPIML_CHECK=1)
#include <mpiml/mpiml.hpp>

#include "fault_mark.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

namespace {

[[gnu::noinline]] void sleepy_rank_work(double s) {
    std::this_thread::sleep_for(std::chrono::duration<double>(s));  // LATE-LINE
    asm volatile("");  // not a tail call: the frame stays on the stack
}

}  // namespace

int main(int argc, char** argv) {
    const std::string mode = argc > 1 ? argv[1] : "hang";
    return mpiml::run(argc, argv, [&](int, char**) {
        const int rank = mpiml::proc_id();
        double x = rank;
        x = mpiml::mpi_avg(x);  // FIRST-LINE
        if (rank == 0) {
            std::printf("hang_child: ready\n");  // every rank is set up
            std::fflush(stdout);
        }
        if (mode == "mismatch") {
            std::vector<double> v(rank == 1 ? 3 : 4, 1.0);
            try {
                if (rank == 1)
                    mpiml::allreduce(v, mpiml::Op::sum);  // MISMATCH-ONE
                else
                    mpiml::allreduce(v, mpiml::Op::sum);  // MISMATCH-OTHERS
            } catch (const mpiml::Error& e) {
                std::printf("rank %d caught: %s\n", rank, e.what());
            }
            return 0;
        }
        const double late = mode == "demand" && argc > 2 ? std::atof(argv[2]) : 60.0;
        if (rank == (mode == "hang" && argc > 2 ? std::atoi(argv[2]) : 2)) {
            fault_mark();
            sleepy_rank_work(late);
        }
        mpiml::barrier();  // WAIT-LINE
        if (rank == 0) std::printf("hang_child: %s done\n", mode.c_str());
        return 0;
    });
}
