// mpiml-report PID [reason]: prints where every rank of a running job is.
// PID is the launcher (mpirun, mpiexec) or any rank; the job goes on.
#include "core/report.hpp"

#include <mpiml/error.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

int main(int argc, char** argv) {
    const bool help = argc == 2 && (std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0);
    if (help || argc < 2 || argc > 3 || std::atoi(argv[1]) <= 0) {
        std::fprintf(help ? stdout : stderr,
                     "usage: mpiml-report PID [reason]\n"
                     "  prints where every rank of the job is (host, pid, collective, last\n"
                     "  collectives, stacks); PID is the launcher or any rank of the job\n");
        return help ? 0 : 2;
    }
    try {
        const std::string text = mpiml::detail::request_report_of(
            std::atoi(argv[1]), argc > 2 ? argv[2] : "mpiml-report (on demand; the job goes on)");
        std::fwrite(text.data(), 1, text.size(), stdout);
        return 0;
    } catch (const mpiml::Error& e) {
        std::fprintf(stderr, "%s\n", e.what());
        return 1;
    }
}
