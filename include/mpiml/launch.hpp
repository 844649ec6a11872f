// mpi_fork: re-launch the running program on n MPI ranks.
#pragma once

#include <string>
#include <vector>

namespace mpiml {

/// Re-launches the running program (/proc/self/exe, its argv byte for byte)
/// under mpirun with n ranks, IN_MPI=1, OMP_NUM_THREADS=1, MKL_NUM_THREADS=1 and
/// OPENBLAS/GOTO/BLIS_NUM_THREADS=1.
/// In the parent it does not return: the process exits with the launcher's
/// exit status. Returns at once when n <= 1 or IN_MPI is set (in the children).
///
/// The launcher is $MPIML_MPIRUN if set, else mpirun or mpiexec from PATH.
/// $MPIML_HOSTFILE, if set, is passed as the launcher's hostfile (ranks on
/// other hosts); $MPIML_MPIRUN_FLAGS adds launcher flags.
/// Open MPI gets --oversubscribe when n exceeds the available cores and
/// --allow-run-as-root as root; MPICH's Hydra gets its own flags.
/// Throws mpiml::Error if n < 0 or no launcher is found.
void mpi_fork(int n, bool bind_to_core = false);

namespace detail {
enum class LauncherKind { open_mpi, mpich, unknown };
struct LaunchPlan {
    std::string launcher;              ///< path of mpirun/mpiexec
    LauncherKind kind = LauncherKind::unknown;
    std::vector<std::string> argv;     ///< launcher argv, program and its args
    std::vector<std::string> env;      ///< full child environment, NAME=value
};
/// What mpi_fork would run (exposed for tests and dry runs).
LaunchPlan plan_fork(int n, bool bind_to_core);
}  // namespace detail

}  // namespace mpiml
