// The interface the core asks for each collective, after its argument checks
// and inside its CollectiveScope (agreement, watchdog, exit guard, profile).
// The shared-memory backend (backends/shm) is asked first and declines, by
// returning false, when its path does not apply (mode, size, op, type, or
// ranks on other nodes); the MPI backend (backends/mpi) runs everything else.
#pragma once

#include <mpiml/op.hpp>

#include <cstddef>
#include <vector>

namespace mpiml::detail {

// ---- backends/shm
/// Whether an allreduce of bytes on comm takes the shared-memory path (the
/// same answer on every rank; collective the first time on comm).
bool shm_takes(std::size_t bytes, MPI_Comm comm, const char* call);
/// The allreduce through node-shared memory; send may be MPI_IN_PLACE, bytes
/// is count times the type's size.
bool shm_allreduce(const void* send, void* recv, std::size_t count, MPI_Datatype type,
                   std::size_t bytes, const ReduceOp& op, MPI_Comm comm, const char* call);
/// In place: the sum over ranks divided by their number, when buf is the
/// memory of a SharedBucket on comm (floating or complex types).
bool shm_average(void* buf, std::size_t count, MPI_Datatype type, MPI_Comm comm,
                 const char* call);
/// Each rank's node, numbered in node order (by the node's lowest rank), as
/// the shared-memory path groups the ranks of comm (MPIML_NODE_SPLIT: its
/// simulated nodes). Collective.
std::vector<int> node_numbers(MPI_Comm comm, const char* call);
/// An in-place broadcast (tsize: the type's size).
bool shm_broadcast(void* buf, std::size_t count, MPI_Datatype type, int tsize, int root,
                   MPI_Comm comm, const char* call);

// ---- backends/mpi: counts beyond INT_MAX are sent in chunks.
/// Quiet waits on the calling thread (GradAverager's communication thread):
/// while on, waits test the requests with a growing sleep in between (paced
/// as backends/mpi/pace.hpp says) instead of MPI's polling wait, so the core
/// goes to the computation, and a sum allreduce on MPI is summed in order (as
/// set_ordered_sums) by nonblocking sends waited so.
void set_quiet_waits(bool on);
/// Sums in the shared-memory path's order on the calling thread
/// (GradAverager's averaging): while on, an in-place sum allreduce on MPI of
/// a floating or complex type over 3 ranks or more sums every element as
/// that path does, whatever the count: each node's ranks in rank order, then
/// the nodes' sums in node order (one node, or one rank a node: ((x0 + x1) +
/// x2) + ...), instead of in MPI's order. Returns the previous setting.
bool set_ordered_sums(bool on);
/// MPI_Waitall, or a quiet wait when the thread asked for one (bytes: the
/// larger direction's, when known, paces later quiet waits; see WaitPace).
void wait_all(int n, MPI_Request* req, const char* call, std::size_t bytes = 0);
void mpi_allreduce(const void* send, void* recv, std::size_t count, MPI_Datatype type,
                   int tsize, const ReduceOp& op, MPI_Comm comm, const char* call);
/// In place: the sum, then divided by the number of ranks.
void mpi_average(void* buf, std::size_t count, MPI_Datatype type, int tsize, MPI_Comm comm,
                 const char* call);
void mpi_broadcast(void* buf, std::size_t count, MPI_Datatype type, int tsize, int root,
                   MPI_Comm comm, const char* call);
void mpi_allgather(const void* send, void* recv, std::size_t count, MPI_Datatype type,
                   MPI_Comm comm, const char* call);
void mpi_barrier(MPI_Comm comm, const char* call);

}  // namespace mpiml::detail
