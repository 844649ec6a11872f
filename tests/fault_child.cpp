// Fault injection: fault_child <mode> <faulty-rank>. Every rank runs a few
// collectives; the faulty rank misbehaves as <mode> says. The job must end
// with a non-zero status and a message naming the rank, never hang.
#include <mpiml/mpiml.hpp>
#include <mpiml/shm.hpp>

#include "fault_mark.hpp"

#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

volatile int* null_ptr = nullptr;

struct Handled {};  // an exception the program catches itself

void step(int i) {
    std::vector<double> v(1000, 1.0 * i);
    mpiml::allreduce(v, mpiml::Op::sum);
}

int body(const std::string& mode, int faulty) {
    const int rank = mpiml::proc_id();
    const bool me = rank == faulty;
    if (me && (mode == "throw_before" || mode.ends_with("_before") || mode == "return_before_late"))
        fault_mark();
    if (mode == "throw_before" && me) throw std::runtime_error("injected failure before any collective");
    // Ends before the first collective while the others wait in it (late:
    // the others come to it 5 s later).
    if ((mode == "return_before" || mode == "return_before_late") && me) return 0;
    if (mode == "exit_before" && me) std::exit(3);
    if (mode == "return_before_late") ::sleep(5);
    step(0);
    if (me) fault_mark();  // every other fault of this rank comes after this point
    if (mode == "throw_between" && me) throw std::runtime_error("injected failure between collectives");
    if (mode == "abort" && me) std::abort();
    if (mode == "segv" && me) *null_ptr = 1;
    if (mode == "sigkill" && me) ::kill(::getpid(), SIGKILL);
    if (mode == "stall" && me) ::sleep(600);
    if (mode == "late" && me)  // not a failure: the others wait, then all end
        std::this_thread::sleep_for(std::chrono::seconds(6));  // resumed after the report's signal
    if (mode == "loop") {  // every rank: large allreduces for 120 s (faults come from outside)
        std::vector<double> v(1 << 20, 1.0);
        for (int i = 0; i < 12000; ++i) {
            mpiml::allreduce(v, mpiml::Op::max);
            ::usleep(10000);
        }
    }
    if (mode == "count" ) {
        std::vector<float> v(me ? 7 : 5, 1.0f);
        mpiml::allreduce(v, mpiml::Op::sum);
    }
    // The faulty rank passes 999 floats, the others 1000, and nobody catches:
    // on the shared-memory path (the default on one node) every rank throws
    // before the call; with the path off, after it (MPIML_CHECK off).
    if (mode == "shm_count" || mode == "shm_count_off") {
        if (mode == "shm_count_off") mpiml::shm::set_mode(mpiml::shm::Mode::off);
        std::vector<float> v(me ? 999 : 1000, 1.0f);
        mpiml::allreduce(v, mpiml::Op::sum);
    }
    // On MPI's path without the check: a broadcast whose faulty rank passes
    // more (as a receiver MPI would give it a partial result), an allgather.
    if (mode == "bcast_count_off") {
        mpiml::shm::set_mode(mpiml::shm::Mode::off);
        std::vector<int> v(me ? 1200 : 1000, rank);
        mpiml::broadcast(v, 0);
    }
    if (mode == "allgather_count_off") {
        std::vector<double> v(me ? 4 : 3, 1.0), all(4 * static_cast<std::size_t>(mpiml::num_procs()));
        mpiml::detail::allgather(v.data(), all.data(), v.size(), MPI_DOUBLE, MPI_COMM_WORLD, "mpiml::allgather");
    }
    if (mode == "type") {
        if (me) mpiml::mpi_sum(1.0f);
        else mpiml::mpi_sum(1.0);
    }
    if (mode == "op") mpiml::mpi_op(1, me ? mpiml::Op::min : mpiml::Op::max);
    // Ends while the other ranks go on to step(2): they wait for it there.
    if (mode == "exit" && me) std::exit(3);
    if (mode == "return" && me) return 0;
    if (mode == "caught" && me) {
        try {
            throw std::runtime_error("handled by exiting");
        } catch (const std::exception&) {
            std::exit(4);
        }
    }
    // A SharedBucket made by hand: the faulty rank leaves its scope (destroys
    // it) while the others go on to step(2); bucket_caught: by an exception
    // it catches, then it ends with status 4.
    if (mode == "bucket_return" || mode == "bucket_caught") {
        try {
            mpiml::SharedBucket b(4096);
            b.average<double>(16);
            if (me && mode == "bucket_return") return 0;
            if (me) throw Handled();
            step(2);
        } catch (const Handled&) {
            return 4;
        }
    }
    if (mode == "early_ok") {  // not a failure: the faulty rank ends first, the others work on
        step(1);
        if (me) return 0;
        ::usleep(1500 * 1000);
        const std::string path = "fault_child_early_ok." + std::to_string(rank);
        if (FILE* f = std::fopen(path.c_str(), "w")) {
            std::fprintf(f, "rank %d done\n", rank);
            std::fclose(f);
        }
        return 0;
    }
    if (mode == "ticks") {  // every rank: 60 small allreduces 0.1 s apart, then one line
        for (int i = 0; i < 60; ++i) {
            step(4 + i);
            if (i == 0 && rank == 0) {
                std::printf("ticks: every rank started\n");
                std::fflush(stdout);
            }
            ::usleep(100 * 1000);
        }
        if (rank == 0)
            std::printf("ticks done on %d ranks, attempt %d\n", mpiml::num_procs(),
                        mpiml::restart_attempt());
        return 0;
    }
    if (mode == "attempts" && rank == 0) std::printf("attempt=%d\n", mpiml::restart_attempt());
    if (mode == "stopped_slow_exit" || mode == "stopped_term_exit") {  // see main
        step(1);
        return mpiml::exit_stopped;
    }
    if (mode == "session_unwind") {
        try {
            mpiml::Session s;
            if (me) throw std::runtime_error("injected failure inside a Session scope");
            step(1);
        } catch (const std::exception&) {
        }
    }
    step(2);
    step(3);
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 3) {
        std::fprintf(stderr, "usage: fault_child <mode>[_run] <faulty-rank>\n");
        return 2;
    }
    std::string mode = argv[1];
    bool use_run = false;  // mode "<name>_run": the same, inside mpiml::run
    if (mode.size() > 4 && mode.ends_with("_run")) {
        mode.resize(mode.size() - 4);
        use_run = true;
    }
    const int faulty = std::atoi(argv[2]);
    // Every rank stops on request (status 75, in body) and the faulty rank's
    // exit goes on for 0.5 s past MPI_Finalize (exit handlers registered
    // before mpiml's run after it): stopped_slow_exit through the SIGTERM a
    // launcher sends once the others ended (srun -K); stopped_term_exit with
    // that SIGTERM sent to itself as its exit begins, while the others end
    // 1 s later (under Open MPI's mpirun a rank still inside MPI_Finalize
    // when another exits non-zero cannot complete it: mpirun stops serving
    // while it ends the job).
    if (mode == "stopped_slow_exit" || mode == "stopped_term_exit") {
        const char* r = nullptr;
        for (const char* v : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"})
            if ((r = std::getenv(v))) break;
        static int own_rank = r ? std::atoi(r) : -1;
        static bool self_term = mode == "stopped_term_exit";
        if (own_rank == faulty)
            std::atexit([] {
                if (self_term) ::raise(SIGTERM);
                const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
                while (std::chrono::steady_clock::now() < until) ::usleep(10'000);  // on through signals
                char line[80];
                const int n = std::snprintf(line, sizeof line, "fault_child: rank %d finished its exit\n", own_rank);
                if (n > 0 && ::write(2, line, static_cast<std::size_t>(n)) < 0) std::_Exit(1);
            });
        else if (self_term)
            std::atexit([] { ::usleep(1'000'000); });
    }
    if (mode == "fork_restarts") {  // mpi_fork onto 2 ranks with 2 restarts, then "attempts"
        mpiml::mpi_fork(2, mpiml::ForkOptions{.restarts = 2, .backoff = 0.2});
        mode = "attempts";
    }
    if (mode == "after_finalize") {
        mpiml::ensure_initialized();
        mpiml::finalize();
        try {
            mpiml::mpi_sum(1);
        } catch (const mpiml::Error& e) {
            std::fprintf(stderr, "%s\n", e.what());
            return 3;
        }
        return 0;
    }
    // Ends (status 0, or 3) before it starts MPI while the others start it
    // 2 s later (exit_others_late_before_mpi: 5 s): they wait in MPI_Init.
    // os_exit_before_mpi: ends with _exit(0) (no exit handlers).
    // all_exit_before_mpi: every rank ends so. sleep_before_mpi: starts MPI
    // 15 s after the others. clobbered_env_before_mpi: writes over its
    // environment's strings (as setproctitle does; getenv reads copies) and
    // starts MPI 5 s after the others: not an end, the job completes.
    if (mode.ends_with("_before_mpi")) {
        const char* r = nullptr;
        for (const char* v : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"})
            if ((r = std::getenv(v))) break;
        if (mode == "all_exit_before_mpi") return 0;
        if (r && std::atoi(r) == faulty) {
            fault_mark();
            if (mode == "exit_before_mpi" || mode == "exit_others_late_before_mpi") return 0;
            if (mode == "exit3_before_mpi") return 3;
            if (mode == "os_exit_before_mpi") ::_exit(0);
            if (mode == "clobbered_env_before_mpi") {
                static std::vector<char*> copy;
                for (char** e = environ; *e; ++e) {
                    copy.push_back(::strdup(*e));
                    std::memset(*e, 'x', std::strlen(*e));
                }
                copy.push_back(nullptr);
                environ = copy.data();
            }
            ::sleep(mode == "sleep_before_mpi" ? 15 : 5);
        } else {
            ::sleep(mode == "exit_others_late_before_mpi" ? 5 : 2);
        }
    }
    if (use_run)
        return mpiml::run(argc, argv, [&](int, char**) { return body(mode, faulty); });
    // FAULT_OWN_INIT=1: the program initializes and finalizes MPI itself, as
    // a program that uses another MPI library beside mpiml does.
    const char* own = std::getenv("FAULT_OWN_INIT");
    if (own && std::strcmp(own, "1") == 0) {
        int provided = 0;
        MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
        const int rc = body(mode, faulty);
        MPI_Finalize();
        return rc;
    }
    return body(mode, faulty);
}
