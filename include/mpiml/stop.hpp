// Stopping on a signal: a batch system's warning before a time limit or a
// preemption becomes a checkpoint and a clean end instead of lost work.
#pragma once

#include <mpiml/session.hpp>

#include <source_location>
#include <vector>

namespace mpiml {

/// The exit status of a job that stopped on request (EX_TEMPFAIL): restarting
/// launchers (mpiml-run, mpi_fork with restarts) do not start it again.
inline constexpr int exit_stopped = 75;

/// From this call on, the given signals no longer end this rank: each sets a
/// flag that should_stop() reads. Call it on every rank (the signals may reach
/// only some). SIGUSR1 (reports), SIGKILL, SIGSTOP and the fatal signals are
/// refused (mpiml::Error). Not collective.
///
///     mpiml::stop_on_signals({SIGUSR2, SIGTERM});
///     for (int epoch = start; epoch < epochs; ++epoch) {
///         train_one_epoch();
///         if (mpiml::should_stop()) {   // collective: the same answer everywhere
///             save_checkpoint(epoch);
///             return mpiml::exit_stopped;
///         }
///     }
void stop_on_signals(const std::vector<int>& signals);

/// This rank got one of those signals (local; safe from any thread).
bool stop_requested();
/// The first such signal this rank got, or 0.
int stop_signal();

/// Collective over comm: true on every rank when any rank got one of the
/// signals (one allreduce of an int). The ranks stop at the same point
/// although the signal reaches them at different moments.
bool should_stop(Comm comm = {}, std::source_location loc = std::source_location::current());

}  // namespace mpiml
