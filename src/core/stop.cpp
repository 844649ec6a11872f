// Stopping on a signal: a flag set by the handler, agreed on by an allreduce.
#include <mpiml/collectives.hpp>
#include <mpiml/error.hpp>
#include <mpiml/stop.hpp>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <string>

namespace mpiml {
namespace {

std::atomic<int> first_signal{0};

extern "C" void on_stop_signal(int sig) {
    int none = 0;
    first_signal.compare_exchange_strong(none, sig, std::memory_order_relaxed);
}

std::string name_of(int sig) {
    const char* abbrev = ::sigabbrev_np(sig);
    return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

}  // namespace

void stop_on_signals(const std::vector<int>& signals) {
    constexpr const char* call = "mpiml::stop_on_signals";
    for (int sig : signals) {
        if (sig <= 0 || sig >= NSIG)
            throw Error(call, "not a signal: " + std::to_string(sig));
        switch (sig) {
            case SIGUSR1:
                throw Error(call, "SIGUSR1 asks every rank for a report (docs/DEBUGGING.md); "
                                  "use SIGUSR2 or SIGTERM");
            case SIGKILL:
            case SIGSTOP:
                throw Error(call, name_of(sig) + " cannot be caught");
            case SIGSEGV:
            case SIGBUS:
            case SIGFPE:
            case SIGILL:
            case SIGABRT:
                throw Error(call, name_of(sig) + " is a fatal signal: it ends the job (with a "
                                                 "line naming the rank), it cannot stop it");
            default:
                break;
        }
    }
    for (int sig : signals) {
        struct sigaction sa {};
        sa.sa_handler = on_stop_signal;
        sigemptyset(&sa.sa_mask);
        sa.sa_flags = SA_RESTART;
        if (::sigaction(sig, &sa, nullptr) != 0)
            throw Error(call, "sigaction(" + name_of(sig) + "): " + std::strerror(errno));
    }
}

bool stop_requested() { return first_signal.load(std::memory_order_relaxed) != 0; }

int stop_signal() { return first_signal.load(std::memory_order_relaxed); }

bool should_stop(Comm comm, std::source_location loc) {
    return mpi_op(stop_requested() ? 1 : 0, Op::max, comm, loc) != 0;
}

}  // namespace mpiml
