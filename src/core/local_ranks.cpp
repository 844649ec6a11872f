#include "core/local_ranks.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string_view>

namespace mpiml::detail {
namespace {

struct LauncherVars {
    const char* rank;
    const char* local_rank;
    const char* local_size;
    const char* job;  // the job's name, when the launcher gives one
};
constexpr LauncherVars launchers[] = {
    {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", "PMIX_NAMESPACE"},
    {"PMI_RANK", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", nullptr},  // Hydra
};

enum class Read { ok, gone, denied };

Read read_file(const std::string& path, std::string& out) {
    out.clear();
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errno == EACCES || errno == EPERM ? Read::denied : Read::gone;
    char buf[8192];
    for (;;) {
        const ssize_t n = ::read(fd, buf, sizeof buf);
        if (n > 0) {
            out.append(buf, static_cast<std::size_t>(n));
            continue;
        }
        const int err = errno;
        ::close(fd);
        if (n == 0) return Read::ok;
        return err == EACCES || err == EPERM ? Read::denied : Read::gone;
    }
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
    if (read_file("/proc/" + std::to_string(pid) + "/stat", s) != Read::ok) return false;
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

}  // namespace

std::optional<LocalRanks> LocalRanks::find() {
    for (const LauncherVars& l : launchers) {
        const std::optional<int> size = whole(std::getenv(l.local_size));
        if (!std::getenv(l.rank) || !whole(std::getenv(l.local_rank)) || !size) continue;
        if (*size < 2) return std::nullopt;
        LocalRanks r;
        r.local_size_ = *size;
        r.rank_var_ = l.rank;
        r.local_var_ = l.local_rank;
        if (l.job && std::getenv(l.job)) {
            r.job_var_ = l.job;
            r.job_ = std::getenv(l.job);
        }
        // Up past the wrappers (they carry the rank's variables) to the daemon.
        int p = static_cast<int>(::getppid());
        for (int depth = 0; depth < 8 && p > 1; ++depth) {
            std::string env;
            if (read_file("/proc/" + std::to_string(p) + "/environ", env) != Read::ok) return std::nullopt;
            if (!env_value(env, l.rank)) {
                r.daemon_ = p;
                return r;
            }
            int pp = 0;
            char state = 0;
            if (!parent_and_state(p, pp, state)) return std::nullopt;
            p = pp;
        }
        return std::nullopt;
    }
    return std::nullopt;
}

std::optional<std::string> LocalRanks::gone() {
    DIR* proc = ::opendir("/proc");
    if (!proc) return std::nullopt;
    std::set<int> present;
    bool unknown = false;
    while (const dirent* e = ::readdir(proc)) {
        const std::optional<int> pid = whole(e->d_name);
        int ppid = 0;
        char state = 0;
        if (!pid || !parent_and_state(*pid, ppid, state) || ppid != daemon_) continue;
        if (state == 'Z' || state == 'X') continue;  // ended, not yet reaped
        std::string env;
        const Read got = read_file("/proc/" + std::to_string(*pid) + "/environ", env);
        if (got == Read::denied) unknown = true;
        if (got != Read::ok) continue;
        const std::optional<std::string> rank = env_value(env, rank_var_);
        if (!rank) continue;  // not a rank (Open MPI's ssh to other hosts, say)
        if (job_var_ && env_value(env, job_var_) != job_) continue;  // another job's
        const std::optional<std::string> local = env_value(env, local_var_);
        const std::optional<int> l = whole(local ? local->c_str() : nullptr);
        if (!l) continue;
        present.insert(*l);
        seen_[*l] = Seen{*rank, *pid};
    }
    ::closedir(proc);
    if (unknown) return std::nullopt;
    for (int l = 0; l < local_size_; ++l) {
        if (present.count(l)) continue;
        if (auto it = seen_.find(l); it != seen_.end())
            return "rank " + it->second.rank + " (pid " + std::to_string(it->second.pid) + ")";
        return "local rank " + std::to_string(l) + " of " + std::to_string(local_size_);
    }
    return std::nullopt;
}

}  // namespace mpiml::detail
