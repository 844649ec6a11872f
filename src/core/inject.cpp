// MPIML_INJECT: faults at a chosen collective, on the first attempt only, for
// tests of failure handling and of recovery (docs/RELIABILITY.md).
#include "core/config.hpp"
#include "core/state.hpp"

#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace mpiml::detail {

std::atomic<bool> injecting_flag{false};

namespace {

std::vector<Injection>& mine() {
    static auto* v = new std::vector<Injection>;
    return *v;
}
std::atomic<std::uint64_t> collectives{0};

const char* action_name(Injection::Action a) {
    switch (a) {
        case Injection::Action::kill: return "kill (SIGKILL)";
        case Injection::Action::segv: return "segv (SIGSEGV)";
        case Injection::Action::stall: return "stall";
        case Injection::Action::exit: return "exit";
    }
    return "?";
}

}  // namespace

void inject_setup() {
    const EnvConfig& c = env_config();
    auto& v = mine();
    v.clear();
    if (c.attempt == 0)
        for (const auto& j : c.inject)
            if (j.rank == state().world_rank) v.push_back(j);
    injecting_flag.store(!v.empty(), std::memory_order_relaxed);
}

void inject_on_collective() {
    const std::uint64_t n = collectives.fetch_add(1, std::memory_order_relaxed) + 1;
    for (const auto& j : mine()) {
        if (j.at != n) continue;
        const auto& s = state();
        char what[160];
        std::snprintf(what, sizeof what, "MPIML_INJECT: %s%s at collective #%llu",
                      action_name(j.action),
                      j.action == Injection::Action::exit ? (" " + std::to_string(j.status)).c_str() : "",
                      static_cast<unsigned long long>(n));
        std::fflush(stdout);
        std::fprintf(stderr, "[mpiml] rank %d/%d: %s\n", s.world_rank, s.world_size, what);
        std::fflush(stderr);
        switch (j.action) {
            case Injection::Action::kill:
                record_abort_line(std::string(what));  // the killed rank writes nothing else
                ::kill(::getpid(), SIGKILL);
                break;
            case Injection::Action::segv: std::raise(SIGSEGV); break;
            case Injection::Action::stall:
                for (;;) ::pause();
            case Injection::Action::exit: std::exit(j.status);
        }
    }
}

}  // namespace mpiml::detail
