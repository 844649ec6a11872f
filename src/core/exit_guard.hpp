// The exit guard (exit_guard.cpp): a rank that ends while others wait for it
// in a collective ends the job instead of hanging in MPI_Finalize.
#pragma once

#include "core/call.hpp"

#include <cstdint>

namespace mpiml::detail {

/// The world set-up: the arrival board, the exit board and the report agent,
/// each collective over MPI_COMM_WORLD, once. When mpiml initialized MPI,
/// every rank runs it there.
void world_setup_at_init();
/// When another library initialized MPI, each rank runs it on its first
/// collective spanning every rank (kind, seq), after a door every rank passes
/// there or at its exit (exit_guard_run): a rank that ended before its first
/// collective ends the job, naming it, instead of leaving the others in the
/// set-up forever.
void world_setup_on_entry(Kind kind, std::uint64_t seq);
/// state().world_set_up says when it ran (or its door was passed at exit).
/// True when the board exists (the hot path skips everything otherwise).
bool exit_guard_ready();
/// Entering / leaving a collective on a communicator that spans every rank.
void exit_mark_enter(Kind kind, std::uint64_t seq);
void exit_mark_leave();
/// The status this process exits with, when known before MPI_Finalize.
void set_exit_status(int status);
/// Entering / leaving any collective, on any communicator and thread;
/// entering is refused (false) once MPI is being finalized.
bool collective_entered(Kind kind, std::uint64_t seq);
void collective_left();
/// Before MPI_Finalize: when another thread of this process is inside a
/// collective (a GradAverager's communication thread, say), MPI_Finalize
/// would run alongside it and its peers would wait for its part forever:
/// aborts the job instead, naming this rank, how it ended and the collective.
/// From then on no thread may enter a collective.
void exit_check_other_threads();
/// Run at the start of MPI_Finalize: waits until every rank ends; aborts the
/// job, naming the ranks, when a rank waits in a collective this rank never
/// entered. exiting: run early by an exit handler (Python's atexit), this
/// process's status not known yet; once every rank has ended, the rest of
/// its exit is protected from the launcher's SIGTERM all the same.
void exit_guard_run(bool exiting = false);
/// At the exit of a process in which another library started MPI and mpiml
/// never started (no mpiml call, so no hook in MPI_Finalize): the door of
/// exit_guard_run, for ranks that wait in their first collective.
void exit_guard_unstarted(bool exiting = false);
/// In a rank that ended before it started MPI and then started it on its way
/// out: the door, where the ranks that start MPI learn that it ended (the
/// job ends, naming it) or every rank ended the same way (nothing to guard).
void exit_guard_before_mpi();

}  // namespace mpiml::detail
