// mpiml-run: mpirun (or Hydra's mpiexec) with automatic restarts.
//   mpiml-run [--restarts K] [--backoff S] [--hostfile H] [--bind-to-core] -np N prog [args...]
#include <mpiml/error.hpp>
#include <mpiml/launch.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

const char* usage =
    "usage: mpiml-run [--restarts K] [--backoff SECONDS] [--hostfile FILE] [--bind-to-core]\n"
    "                 -np N program [args...]\n"
    "Runs program on N ranks with the MPI launcher mpiml's mpi_fork uses (MPIML_MPIRUN,\n"
    "mpirun or mpiexec), and starts the job again after a failure, up to K times (default 0),\n"
    "after SECONDS (default 1, doubling), with one line naming what failed. The ranks see\n"
    "MPIML_ATTEMPT (0 on the first run) and resume from their last checkpoint. Exits with\n"
    "the last attempt's status.\n";

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
    int n = 0, restarts = 0;
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
            ::setenv("MPIML_HOSTFILE", v, 1);
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
    try {
        const auto plan = mpiml::detail::plan_program(n, bind, std::vector<std::string>(argv + i, argv + argc));
        return mpiml::detail::run_with_restarts(plan, restarts, backoff, "mpiml-run");
    } catch (const mpiml::Error& e) {
        std::fprintf(stderr, "mpiml-run: %s\n", e.what());
        return 2;
    }
}
