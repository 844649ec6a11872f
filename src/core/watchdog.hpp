// The collective watchdog (watchdog.cpp).
#pragma once

#include "core/call.hpp"

#include <cstdint>

namespace mpiml::detail {

void watchdog_arm(const CallInfo& info, std::uint64_t seq);
void watchdog_disarm();
/// Marks entry into a world collective (for "ranks that never arrived"); the
/// first call sets up the node's arrival board, collectively.
void arrival_mark(std::uint64_t world_seq);

}  // namespace mpiml::detail
