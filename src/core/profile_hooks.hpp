// The profiler's entry points for the rest of mpiml (profile.cpp).
#pragma once

#include "core/call.hpp"

#include <mpiml/profile.hpp>

namespace mpiml::detail {

void profile_collective(const ProfileMark& mark);
/// Starts profiling at initialization when MPIML_PROFILE=DIR is set (not collective).
void profile_from_environment();
/// Stops profiling without writing anything (the parent process of mpi_fork).
void profile_discard();

}  // namespace mpiml::detail
