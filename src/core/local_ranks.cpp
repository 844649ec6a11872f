#include "core/local_ranks.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <set>
#include <string_view>
#include <vector>

namespace mpiml::detail {
namespace {

// A rank's variables: its rank, the key that tells it from the other ranks
// of its host, the keys every rank of the host has, and the job's name.
struct LauncherVars {
    const char* rank;
    const char* key;
    const char* members;  // a count (keys 0..n-1), or a list of keys with list
    bool list;
    const char* job;  // nullptr: the launcher gives none
};
constexpr LauncherVars launchers[] = {
    {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", false, "PMIX_NAMESPACE"},
    {"PMI_RANK", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", false, nullptr},  // Hydra
    {"SLURM_PROCID", "SLURM_PROCID", "SLURM_GTIDS", true, nullptr},  // srun: the host's ranks
};

// The whole of a file; false when it cannot be read (gone, another user's).
bool read_file(const std::string& path, std::string& out) {
    out.clear();
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    char buf[8192];
    ssize_t n = 0;
    while ((n = ::read(fd, buf, sizeof buf)) > 0) out.append(buf, static_cast<std::size_t>(n));
    ::close(fd);
    return n == 0;
}

// NAME's value in an environment block (NAME=value entries, each ended by NUL).
std::optional<std::string> env_value(const std::string& env, std::string_view name) {
    for (std::size_t i = 0; i < env.size();) {
        std::size_t end = env.find('\0', i);
        if (end == std::string::npos) end = env.size();
        const std::string_view entry(env.data() + i, end - i);
        if (entry.size() > name.size() && entry.substr(0, name.size()) == name && entry[name.size()] == '=')
            return std::string(entry.substr(name.size() + 1));
        i = end + 1;
    }
    return std::nullopt;
}

// The parent and state of pid (/proc/pid/stat: "pid (comm) S ppid ...").
bool parent_and_state(int pid, int& ppid, char& state) {
    std::string s;
    if (!read_file("/proc/" + std::to_string(pid) + "/stat", s)) return false;
    const std::size_t close = s.rfind(')');
    if (close == std::string::npos || close + 4 >= s.size()) return false;
    state = s[close + 2];
    ppid = std::atoi(s.c_str() + close + 4);
    return true;
}

std::optional<int> whole(const char* v) {
    if (!v || !*v) return std::nullopt;
    char* end = nullptr;
    const long x = std::strtol(v, &end, 10);
    if (*end != '\0' || x < 0 || x > 1 << 24) return std::nullopt;
    return static_cast<int>(x);
}

// "0,3,5" as its keys; nothing unless each is a whole number.
std::optional<std::vector<std::string>> key_list(const char* v) {
    std::vector<std::string> keys;
    std::string_view rest = v ? v : "";
    while (!rest.empty()) {
        const std::size_t comma = rest.find(',');
        std::string key(rest.substr(0, comma));
        if (!whole(key.c_str())) return std::nullopt;
        keys.push_back(std::move(key));
        rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    }
    if (keys.empty()) return std::nullopt;
    return keys;
}

// How far up the process tree the daemon may be (wrappers such as `sh -c`).
constexpr int max_depth = 8;

// The launchers' daemons, which may carry a rank's variables they inherited
// (a job launched from a rank of another).
bool is_daemon(int pid) {
    std::string name;
    if (!read_file("/proc/" + std::to_string(pid) + "/comm", name)) return false;
    while (!name.empty() && name.back() == '\n') name.pop_back();
    return name == "hydra_pmi_proxy" || name == "orted" || name == "prted" || name == "slurmstepd";
}

// The launcher's daemon above this process: up past the wrappers (they carry
// this rank's variable with the same value) to the first ancestor without it,
// or to a daemon. Nothing when /proc does not show it, or an ancestor is
// another rank's.
std::optional<int> daemon_above(const char* rank_var, const char* rank) {
    int p = static_cast<int>(::getppid());
    for (int depth = 0; depth < max_depth && p > 1; ++depth) {
        if (is_daemon(p)) return p;
        std::string env;
        if (!read_file("/proc/" + std::to_string(p) + "/environ", env)) return std::nullopt;
        const std::optional<std::string> v = env_value(env, rank_var);
        if (!v) return p;
        if (*v != rank) return std::nullopt;  // not this rank's wrapper: a daemon we do not know
        int pp = 0;
        char state = 0;
        if (!parent_and_state(p, pp, state)) return std::nullopt;
        p = pp;
    }
    return std::nullopt;
}

}  // namespace

std::optional<LocalRanks> LocalRanks::find() {
    for (const LauncherVars& l : launchers) {
        const char* rank = std::getenv(l.rank);
        if (!rank || !*rank || !whole(std::getenv(l.key))) continue;
        LocalRanks r;
        if (l.list) {
            auto keys = key_list(std::getenv(l.members));
            if (!keys) continue;
            r.keys_ = std::move(*keys);
        } else {
            const std::optional<int> n = whole(std::getenv(l.members));
            if (!n) continue;
            for (int k = 0; k < *n; ++k) r.keys_.push_back(std::to_string(k));
        }
        if (r.keys_.size() < 2) return std::nullopt;
        r.rank_var_ = l.rank;
        r.key_var_ = l.key;
        r.by_local_rank_ = !l.list;
        if (l.job && std::getenv(l.job)) {
            r.job_var_ = l.job;
            r.job_ = std::getenv(l.job);
        }
        const std::optional<int> daemon = daemon_above(l.rank, rank);
        if (!daemon) return std::nullopt;
        r.daemon_ = *daemon;
        return r;
    }
    return std::nullopt;
}

std::optional<LauncherDaemon> launcher_daemon() {
    for (const LauncherVars& l : launchers) {
        const char* rank = std::getenv(l.rank);
        if (!rank || !*rank) continue;
        const std::optional<int> pid = daemon_above(l.rank, rank);
        if (!pid) return std::nullopt;
        std::string name;
        read_file("/proc/" + std::to_string(*pid) + "/comm", name);
        while (!name.empty() && name.back() == '\n') name.pop_back();
        return LauncherDaemon{*pid, name.empty() ? "?" : name};
    }
    return std::nullopt;
}

bool is_ancestor(int pid) {
    int p = static_cast<int>(::getppid());
    for (int depth = 0; depth < max_depth && p > 1; ++depth) {
        if (p == pid) return true;
        int pp = 0;
        char state = 0;
        if (!parent_and_state(p, pp, state)) return false;
        p = pp;
    }
    return false;
}

std::optional<std::string> LocalRanks::gone() {
    DIR* proc = ::opendir("/proc");
    if (!proc) return std::nullopt;
    std::set<std::string> present;
    std::set<int> alive;  // every live child of the daemon, rank or not
    while (const dirent* e = ::readdir(proc)) {
        const std::optional<int> pid = whole(e->d_name);
        int ppid = 0;
        char state = 0;
        if (!pid || !parent_and_state(*pid, ppid, state) || ppid != daemon_) continue;
        if (state == 'Z' || state == 'X') continue;  // ended, not yet reaped
        alive.insert(*pid);
        std::string env;
        if (!read_file("/proc/" + std::to_string(*pid) + "/environ", env)) continue;
        const std::optional<std::string> rank = env_value(env, rank_var_);
        if (!rank) continue;  // not a rank (Open MPI's ssh to other hosts), or one that wrote over its environment
        if (job_var_ && env_value(env, job_var_) != job_) continue;  // another job's
        const std::optional<std::string> key = env_value(env, key_var_);
        if (!key) continue;
        present.insert(*key);
        seen_[*key] = Seen{*rank, *pid};
    }
    ::closedir(proc);
    // A rank not found is gone when its process, seen before, has ended, or
    // when fewer children live than the host has ranks. Otherwise it may be
    // a child whose environment cannot be read or was written over.
    for (const std::string& k : keys_) {
        if (present.count(k)) continue;
        if (auto it = seen_.find(k); it != seen_.end()) {
            if (alive.count(it->second.pid)) continue;
            return "rank " + it->second.rank + " (pid " + std::to_string(it->second.pid) + ")";
        }
        if (alive.size() >= keys_.size()) continue;
        if (!by_local_rank_) return "rank " + k;
        return "local rank " + k + " of " + std::to_string(keys_.size());
    }
    return std::nullopt;
}

}  // namespace mpiml::detail
