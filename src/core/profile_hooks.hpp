// The profiler's entry points for the rest of mpiml (profile.cpp).
#pragma once

#include "core/call.hpp"

#include <atomic>
#include <cstdint>

namespace mpiml::detail {

// Also declared in <mpiml/profile.hpp>, for its inline Region.
extern std::atomic<bool> profile_on;
extern std::atomic<std::uint32_t> profile_generation;
std::int64_t profile_now();  // steady clock, ns

void profile_collective(const ProfileMark& mark);
/// Starts profiling at initialization when MPIML_PROFILE=DIR is set (not collective).
void profile_from_environment();
/// Stops profiling without writing anything (the parent process of mpi_fork).
void profile_discard();
/// A rank that ends the job (not from a signal handler): when profiling,
/// writes its own DIR/profile_<rank>.json without MPI (the others' are lost)
/// and says so on stderr. Never waits for a lock, never throws.
void profile_write_own() noexcept;

}  // namespace mpiml::detail
