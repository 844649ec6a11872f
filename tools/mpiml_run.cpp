// mpiml-run: mpirun (or Hydra's mpiexec) with automatic restarts.
//   mpiml-run [--restarts K] [--backoff S] [--hostfile H [--min-ranks M]] [--bind-to-core]
//             -np N prog [args...]
#include <mpiml/error.hpp>
#include <mpiml/launch.hpp>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

const char* usage =
    "usage: mpiml-run [--restarts K] [--backoff SECONDS] [--hostfile FILE [--min-ranks M]]\n"
    "                 [--bind-to-core] -np N program [args...]\n"
    "Runs program on N ranks with the MPI launcher mpiml's mpi_fork uses (MPIML_MPIRUN,\n"
    "mpirun or mpiexec), and starts the job again after a failure, up to K times (default 0),\n"
    "after SECONDS (default 1, doubling), with one line naming what failed. The ranks see\n"
    "MPIML_ATTEMPT (0 on the first run) and resume from their last checkpoint. Exits with\n"
    "the last attempt's status.\n"
    "With --min-ranks M (and --hostfile), hosts that can no longer be reached are left out\n"
    "of the next attempt, which runs on the slots of the others (at most N ranks), as long\n"
    "as at least M ranks remain.\n";

[[noreturn]] void bad(const std::string& what) {
    std::fprintf(stderr, "mpiml-run: %s\n%s", what.c_str(), usage);
    std::exit(2);
}

long number(const char* flag, const char* v, long lo, long hi) {
    if (!v) bad(std::string(flag) + " needs a value");
    char* end = nullptr;
    const long x = std::strtol(v, &end, 10);
    if (end == v || *end || x < lo || x > hi)
        bad(std::string(flag) + " must be a whole number from " + std::to_string(lo) + " to " +
            std::to_string(hi) + ", got '" + v + "'");
    return x;
}

}  // namespace

int main(int argc, char** argv) {
    int n = 0, restarts = 0, min_ranks = 0;
    std::string hostfile;
    double backoff = 1.0;
    bool bind = false;
    int i = 1;
    for (; i < argc; ++i) {
        const std::string a = argv[i];
        const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
        if (a == "-h" || a == "--help") {
            std::fputs(usage, stdout);
            return 0;
        } else if (a == "-np" || a == "-n") {
            n = static_cast<int>(number(a.c_str(), v, 1, 1 << 20));
            ++i;
        } else if (a == "--restarts") {
            restarts = static_cast<int>(number("--restarts", v, 0, 1000));
            ++i;
        } else if (a == "--backoff") {
            if (!v) bad("--backoff needs a value");
            char* end = nullptr;
            backoff = std::strtod(v, &end);
            if (end == v || *end || !(backoff >= 0) || backoff > 3600)
                bad(std::string("--backoff must be 0-3600 seconds, got '") + v + "'");
            ++i;
        } else if (a == "--hostfile") {
            if (!v) bad("--hostfile needs a file");
            hostfile = v;
            ::setenv("MPIML_HOSTFILE", v, 1);
            ++i;
        } else if (a == "--min-ranks") {
            min_ranks = static_cast<int>(number("--min-ranks", v, 1, 1 << 20));
            ++i;
        } else if (a == "--bind-to-core") {
            bind = true;
        } else if (a == "--") {
            ++i;
            break;
        } else if (!a.empty() && a[0] == '-') {
            bad("unknown option " + a);
        } else {
            break;
        }
    }
    if (n == 0) bad("-np N is required");
    if (i >= argc) bad("no program to run");
    if (min_ranks > 0 && hostfile.empty()) bad("--min-ranks needs --hostfile (the hosts to choose from)");
    if (min_ranks > n) bad("--min-ranks must not exceed -np");
    try {
        const std::vector<std::string> program(argv + i, argv + argc);
        const auto plan = mpiml::detail::plan_program(n, bind, program);
        std::function<bool(mpiml::detail::LaunchPlan&)> shrink;
        std::string reduced;  // the hostfile of the reachable hosts
        if (min_ranks > 0) {
            const auto hosts = mpiml::detail::read_hostfile(hostfile, "mpiml-run");
            shrink = [&, hosts](mpiml::detail::LaunchPlan& p) {
                std::string up, down, lines;
                int slots = 0;
                for (const auto& h : hosts) {
                    if (mpiml::detail::host_reachable(p, h.host, 15.0)) {
                        up += (up.empty() ? "" : ", ") + h.host;
                        lines += h.host + " slots=" + std::to_string(h.slots) + "\n";
                        slots += h.slots;
                    } else {
                        down += (down.empty() ? "" : ", ") + h.host;
                    }
                }
                const int m = std::min(n, slots);
                if (m < min_ranks) {
                    std::fprintf(stderr,
                                 "[mpiml] mpiml-run: %d ranks fit on the hosts that can be reached (%s), "
                                 "fewer than --min-ranks %d; no restart\n",
                                 m, up.empty() ? "none" : up.c_str(), min_ranks);
                    return false;
                }
                if (down.empty()) return true;
                if (reduced.empty()) {
                    char tmpl[] = "/tmp/mpiml-run-hosts-XXXXXX";
                    const int fd = ::mkstemp(tmpl);
                    if (fd < 0) return false;
                    ::close(fd);
                    reduced = tmpl;
                }
                std::FILE* f = std::fopen(reduced.c_str(), "w");
                if (!f) return false;
                std::fputs(lines.c_str(), f);
                std::fclose(f);
                std::fprintf(stderr, "[mpiml] mpiml-run: leaving out %s (cannot be reached); next attempt: "
                                     "%d ranks on %s\n", down.c_str(), m, up.c_str());
                ::setenv("MPIML_HOSTFILE", reduced.c_str(), 1);
                p = mpiml::detail::plan_program(m, bind, program);
                return true;
            };
        }
        const int rc = mpiml::detail::run_with_restarts(plan, restarts, backoff, "mpiml-run", shrink);
        if (!reduced.empty()) ::unlink(reduced.c_str());
        return rc;
    } catch (const mpiml::Error& e) {
        std::fprintf(stderr, "mpiml-run: %s\n", e.what());
        return 2;
    }
}
