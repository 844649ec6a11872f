// mpi_fork: re-launch the running program on n MPI ranks.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace mpiml {

/// Re-launches the running program (/proc/self/exe, its argv byte for byte)
/// under mpirun with n ranks, IN_MPI=1, OMP_NUM_THREADS=1, MKL_NUM_THREADS=1 and
/// OPENBLAS/GOTO/BLIS_NUM_THREADS=1.
/// In the parent it does not return: the process exits with the launcher's
/// exit status. Returns at once when n <= 1 or IN_MPI is set (in the children).
///
/// The launcher is $MPIML_MPIRUN if set, else the linked MPI's own launcher
/// (mpirun.openmpi, mpiexec.mpich), else mpirun or mpiexec from PATH.
/// $MPIML_HOSTFILE, if set, is passed as the launcher's hostfile (ranks on
/// other hosts); $MPIML_MPIRUN_FLAGS adds launcher flags.
/// Open MPI gets --oversubscribe when n exceeds the available cores and
/// --allow-run-as-root as root; MPICH's Hydra gets its own flags.
/// Throws mpiml::Error if n < 0 or no launcher is found.
void mpi_fork(int n, bool bind_to_core = false);

/// mpi_fork with automatic restarts: when the job fails (any rank's failure
/// ends it: mpiml aborts, the launcher ends a killed rank's job), it is
/// started again, up to `restarts` times, after `backoff` seconds (doubling
/// each time), with one line naming what failed (rank, host, signal or
/// status, from mpiml's abort record). The ranks see MPIML_ATTEMPT
/// (restart_attempt()) and resume from their last checkpoint. When restarts
/// run out, the process exits with the last attempt's status.
struct ForkOptions {
    bool bind_to_core = false;
    int restarts = 0;
    double backoff = 1.0;  ///< seconds before the first restart
};
void mpi_fork(int n, const ForkOptions& options);

/// 0 on a job's first run, k on its k-th restart: by a restarting launcher
/// (MPIML_ATTEMPT) plus Slurm's requeues of the batch job (SLURM_RESTART_COUNT).
int restart_attempt();

namespace detail {
enum class LauncherKind { open_mpi, mpich, slurm, unknown };
struct LaunchPlan {
    std::string launcher;              ///< path of mpirun/mpiexec
    LauncherKind kind = LauncherKind::unknown;
    std::vector<std::string> argv;     ///< launcher argv, program and its args
    std::vector<std::string> env;      ///< full child environment, NAME=value
};
/// What mpi_fork would run (exposed for tests and dry runs).
LaunchPlan plan_fork(int n, bool bind_to_core);
/// The same for another program: program is its argv (path or name first).
LaunchPlan plan_program(int n, bool bind_to_core, const std::vector<std::string>& program);
/// Runs plan, then again after each failure, up to restarts times (see
/// ForkOptions); `who` names the caller in its lines. Returns the last
/// attempt's exit status.
/// before_restart, when given, may change the plan before each restart (the
/// hosts that can still be reached); returning false ends the restarts.
int run_with_restarts(const LaunchPlan& plan, int restarts, double backoff, const char* who,
                      const std::function<bool(LaunchPlan&)>& before_restart = {});
/// Runs plan once and returns its exit status (128 + N for signal N),
/// passing SIGTERM, SIGHUP, SIGUSR1, SIGUSR2 and SIGINT sent by kill on to
/// the launcher while it runs; `who` names the caller in its errors.
int run_once(const LaunchPlan& plan, const char* who);

/// A hostfile's hosts and slots (Open MPI "h slots=2" or MPICH "h:2" lines).
struct HostSlots {
    std::string host;
    int slots = 1;
};
std::vector<HostSlots> read_hostfile(const std::string& path, const char* call);
/// Whether the launcher can start a process on host (within timeout seconds).
bool host_reachable(const LaunchPlan& plan, const std::string& host, double timeout);
}  // namespace detail

}  // namespace mpiml
