// Shared-memory collectives: the hooks detail::allreduce / detail::broadcast call.
#pragma once

#include <mpiml/collectives.hpp>

#include <cstddef>

namespace mpiml::detail {

/// Runs the allreduce through node-shared memory and returns true when the
/// shared-memory path applies (mode, size, built-in op and type); otherwise
/// returns false and does nothing. send may be MPI_IN_PLACE; bytes is
/// count times the type's size.
bool shm_allreduce(const void* send, void* recv, std::size_t count, MPI_Datatype type,
                   std::size_t bytes, const ReduceOp& op, MPI_Comm comm, const char* call);

/// Same for an in-place broadcast (tsize: the type's size).
bool shm_broadcast(void* buf, std::size_t count, MPI_Datatype type, int tsize, int root,
                   MPI_Comm comm, const char* call);

}  // namespace mpiml::detail
