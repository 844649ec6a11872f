// A rank whose launcher's process on its host has ended (killed, crashed) is
// left running with no one to end it; Hydra's mpiexec then waits for it too.
#pragma once

namespace mpiml::detail {

/// From MPI's start: a thread waits for the launcher's daemon of this host
/// (local_ranks.hpp) to end, and then ends this rank with a line naming it.
/// Nothing when there is no such daemon. Once per process.
void start_daemon_watch();
/// At MPI_Finalize: the watch ends (a rank may outlive its launcher after).
void stop_daemon_watch();

}  // namespace mpiml::detail
