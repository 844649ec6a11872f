// The process-wide state of mpiml and its lifetime (session.cpp).
#pragma once

#include <mpi.h>

#include <atomic>
#include <string>
#include <string_view>

namespace mpiml::detail {

struct State {
    bool ready = false;            // MPI initialized and mpiml configured
    bool we_initialized = false;   // mpiml called MPI_Init_thread
    int provided = 0;
    MPI_Comm default_comm = MPI_COMM_WORLD;
    // Written by set_timeout/set_check, read by the watchdog thread.
    std::atomic<double> timeout{0.0};  // seconds, 0: off
    std::atomic<bool> check{false};
    bool abort_on_failure = true;
    int world_rank = -1;           // cached for signal handlers and the watchdog
    int world_size = 0;
    // The world set-up ran (or its door was passed at exit; exit_guard.cpp).
    std::atomic<bool> world_set_up{false};
};
State& state();

/// Reads MPIML_* settings; throws mpiml::Error on a malformed value.
void read_environment(State& s);

/// The current exception as "type: what()" (failure.cpp).
std::string current_exception_text();
/// Where abort lines are also appended (MPIML_ABORT_RECORD; failure.cpp).
void set_abort_record(const std::string& path);
/// Appends one line to the abort record, if there is one.
void record_abort_line(std::string_view what);
/// MPI_Abort with code, without a line (the lines that end the job are out).
[[noreturn]] void abort_quietly(int code);
/// Ends this rank alone, with "[mpiml] rank R/N: <what> - ending this rank"
/// (also in the abort record) and status 1: for a rank its launcher left.
[[noreturn]] void end_orphan(std::string_view what);

/// MPIML_INJECT: set up at initialization (inject.cpp); then each collective
/// calls inject_on_collective while injecting() is true.
void inject_setup();
extern std::atomic<bool> injecting_flag;
inline bool injecting() { return injecting_flag.load(std::memory_order_relaxed); }
void inject_on_collective();

/// At the exit of a launched rank that never started MPI: starts it, meets
/// the ranks that start it and ends the job when they do (session.cpp).
void join_mpi_at_exit(int status);

/// Around another library's MPI_Init (mpi4py's import): the watch of
/// mpiml's own start (a rank of this host that ended, MPIML_TIMEOUT, the
/// stall line, the launcher's daemon). Nothing once MPI runs (session.cpp).
void begin_foreign_init();
void end_foreign_init();

/// A second MPI library in this process (another MPI_Init than mpiml's,
/// e.g. mpi4py built for another MPI): what to tell the user, or "" when
/// there is none (mpi_library.cpp). check_one_mpi_library throws it.
std::string other_mpi_library();
void check_one_mpi_library(const char* call);

/// Cleanup run before MPI_Finalize (attribute delete callback on MPI_COMM_SELF).
void register_finalize_hook(void (*fn)());

}  // namespace mpiml::detail
