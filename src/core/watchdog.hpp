// The collective watchdog (watchdog.cpp): one thread watches every armed
// wait of the process (the main thread's collectives, a backend's worker
// threads, several groups), each with its own deadline.
#pragma once

#include "core/call.hpp"

#include <cstdint>
#include <string>

namespace mpiml::detail {

/// One watched wait: a core collective (info and seq; `call` and `where`
/// empty) or another door's operation (`call` names it, `where` adds to the
/// message). timeout: seconds; 0 follows mpiml::timeout() as it changes.
struct Watched {
    CallInfo info{};
    std::uint64_t seq = 0;
    double timeout = 0;
    std::string call;
    std::string where;
};

/// Arms a watch; past its deadline the job ends with its message
/// ("watchdog: <call> waited <s> s, past the timeout of <t> s<where>").
std::uint64_t watchdog_arm(Watched w);
/// Disarms the watch with this id (0: none).
void watchdog_disarm(std::uint64_t id);

}  // namespace mpiml::detail
