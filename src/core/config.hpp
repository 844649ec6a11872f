// mpiml's configuration from MPIML_* environment variables: read and validated
// in one place (config.cpp) at initialization, one parser per kind.
#pragma once

#include <mpiml/shm_config.hpp>

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

namespace mpiml::detail {

/// One fault of MPIML_INJECT: at this rank's `at`-th collective.
struct Injection {
    enum class Action { kill, segv, stall, exit } action;
    int rank = 0;
    std::uint64_t at = 1;
    int status = 1;  // for exit
};

struct EnvConfig {
    std::optional<bool> check;      // MPIML_CHECK
    std::optional<double> timeout;  // MPIML_TIMEOUT, seconds
    shm::Config shm;                // MPIML_SHM, MPIML_SHM_*THRESHOLD, MPIML_SHM_CHUNK, MPIML_NODE_SPLIT
    std::string profile_dir;        // MPIML_PROFILE
    bool profile_clock_measure = false;  // MPIML_PROFILE_CLOCK=measure
    std::vector<Injection> inject;  // MPIML_INJECT (first attempt only)
    int attempt = 0;                // MPIML_ATTEMPT: 0 first, set by restarting launchers
    int requeues = 0;               // SLURM_RESTART_COUNT (a requeued batch job)
    std::string abort_record;       // MPIML_ABORT_RECORD: file the abort line is appended to
    std::optional<bool> c10d_check; // MPIML_C10D_CHECK
    std::optional<bool> report;     // MPIML_REPORT: the report agent (default on)
    std::string report_dir;         // MPIML_REPORT_DIR (default ./mpiml-reports)
    double stall_warning = 60;      // MPIML_STALL_WARNING, seconds (0: off)
};

/// Parses MPIML_INJECT's value (exposed for tests).
std::vector<Injection> parse_inject(const std::string& v);

/// mpi_fork's variables, read when it launches (before MPI starts, so not part
/// of EnvConfig): MPIML_MPIRUN, MPIML_MPIRUN_FLAGS, MPIML_HOSTFILE.
struct LaunchConfig {
    std::string launcher;                  // MPIML_MPIRUN (empty: find one)
    std::vector<std::string> extra_flags;  // MPIML_MPIRUN_FLAGS, split at blanks
    std::string hostfile;                  // MPIML_HOSTFILE (checked readable)
};
/// Throws mpiml::Error naming `call` and the variable for a bad value.
LaunchConfig read_launch_config(const char* call);
/// IN_MPI is set: this process was started by mpi_fork.
bool launched_by_mpi_fork();
/// The rank an MPI launcher gave this process (Open MPI's, PMIx's or Hydra's
/// variable; with_slurm: else SLURM_PROCID, which a batch script has too),
/// or nullptr. Only getenv: usable before MPI starts, in constructors and at exit.
const char* launcher_rank(bool with_slurm = true);
/// The number of ranks the launcher started (Open MPI's, Hydra's or srun's
/// variable), or 0 when none says. Only getenv, as launcher_rank.
int launcher_size();

/// Reads every variable; throws mpiml::Error naming the first malformed one.
EnvConfig read_env_config();
/// The configuration read at initialization (read then, or on first use).
const EnvConfig& env_config();
/// Reads it again (at initialization).
void load_env_config();

/// The words every boolean variable takes: 1/on/true/yes, 0/off/false/no.
bool parse_bool(const char* name, const std::string& v);
/// Byte counts: 65536, 64K/64KiB, 4M/4MiB, 1G/1GiB.
std::size_t parse_bytes(const char* name, const std::string& v);
/// Seconds: a finite number >= 0.
double parse_seconds(const char* name, const std::string& v);

/// MPIML_PROFILE_CLOCK as set now (profiles may start long after
/// initialization, and tests set it then); validated like the rest.
bool profile_clock_measure();

}  // namespace mpiml::detail
