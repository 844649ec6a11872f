// Abort on failure: a training job never hangs and always says why it died.
#pragma once

#include <functional>
#include <string_view>

namespace mpiml {

/// Installs handlers so that an uncaught exception, std::terminate or a fatal
/// signal (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT) on any rank prints
///   [mpiml] rank R/N: <what happened> - aborting the job
/// to stderr and calls MPI_Abort. Done automatically when mpiml initializes
/// MPI (unless SessionOptions::abort_on_failure is false). Idempotent.
/// Where SIGPIPE has its default action, a write to a closed socket or pipe
/// other than stdout and stderr (MPI's transport to a rank that has ended)
/// then fails with EPIPE instead of ending the rank silently; a broken stdout
/// or stderr still ends it by SIGPIPE.
void install_failure_handlers();

/// Prints the [mpiml] line for `what` and aborts the whole job with `code`.
[[noreturn]] void abort_job(std::string_view what, int code = 1);

/// Runs fn as the body of main: initializes MPI, calls fn, finalizes and
/// returns fn's result; an exception escaping fn aborts the whole job with a
/// clear message instead of leaving the other ranks hanging.
int run(int argc, char** argv, const std::function<int(int, char**)>& fn);

namespace detail {
/// Registers the exit handler of a rank that ends before it started MPI
/// (failure.cpp), again from each program and module that includes this
/// header (hidden: a copy each) as it starts. Exit handlers run
/// last-registered first: the program's (or a module's loaded later) runs
/// before the shared libraries' destructors, MPI's among them; the one
/// libmpiml registers as it loads, before the program starts, after them.
int watch_exit_before_mpi() noexcept;
#ifndef MPIML_NO_EXIT_WATCH  // a test of single sources, without libmpiml
inline const int exit_watch_registered __attribute__((visibility("hidden"))) = watch_exit_before_mpi();
#endif
}  // namespace detail

}  // namespace mpiml
