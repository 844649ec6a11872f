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
void install_failure_handlers();

/// Prints the [mpiml] line for `what` and aborts the whole job with `code`.
[[noreturn]] void abort_job(std::string_view what, int code = 1);

/// Runs fn as the body of main: initializes MPI, calls fn, finalizes and
/// returns fn's result; an exception escaping fn aborts the whole job with a
/// clear message instead of leaving the other ranks hanging.
int run(int argc, char** argv, const std::function<int(int, char**)>& fn);

}  // namespace mpiml
