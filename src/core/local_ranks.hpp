// The ranks an MPI launcher started on this host, seen through /proc: before
// MPI starts, the one way to learn that one of them has ended.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace mpiml::detail {

/// The other ranks of this host, as children of the launcher's daemon on it
/// (Open MPI's mpirun or orted, MPICH's hydra_pmi_proxy, Slurm's
/// slurmstepd; a rank may run under a wrapper such as `sh -c`).
/// The launcher's process that started this rank on this host (Open MPI's
/// mpirun or orted, Hydra's hydra_pmi_proxy, Slurm's slurmstepd): the first
/// ancestor without this rank's variable. Nothing when no such launcher
/// started this process, or /proc does not show its daemon.
struct LauncherDaemon {
    int pid;
    std::string name;
};
std::optional<LauncherDaemon> launcher_daemon();
/// Whether pid is an ancestor of this process, up to the depth wrappers reach.
bool is_ancestor(int pid);

class LocalRanks {
public:
    /// Nothing when this process was not started by one of those launchers
    /// with other ranks on this host, or /proc does not show its daemon.
    static std::optional<LocalRanks> find();
    /// A rank of this host that has ended: "rank 1 (pid 42)", or "local rank
    /// 1 of 2" ("rank 1" under srun) when it ended before it was seen.
    /// Nothing while all are there, or while a child of the daemon that is
    /// not known as a rank (its environment unreadable, or written over by
    /// the program) may be the one missing.
    std::optional<std::string> gone();

private:
    struct Seen {
        std::string rank;
        int pid;
    };
    int daemon_ = 0;
    const char* rank_var_ = nullptr;
    const char* key_var_ = nullptr;  // tells the host's ranks apart
    bool by_local_rank_ = true;      // the key is a local rank (else the rank)
    const char* job_var_ = nullptr;
    std::string job_;
    std::vector<std::string> keys_;    // every rank of the host has one
    std::map<std::string, Seen> seen_;  // by key, every one ever seen
};

}  // namespace mpiml::detail
