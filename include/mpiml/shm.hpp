// Intra-node shared-memory collectives (MPI-3 shared windows).
//
// mpiml::allreduce and mpiml::broadcast take this path by themselves when it
// is faster (large buffers, built-in ops); see Mode. SharedBucket lets data
// live in the shared segment, so that an allreduce skips the copy-in: on one
// node each rank reduces its slice over all ranks' buckets and writes it into
// every bucket, 2 * n bytes of memory traffic per rank and two node barriers
// (with several nodes it writes its own bucket, and the others' slices are
// copied back after the exchange across nodes).
//
// Ranks of a node reduce through shared memory; with several nodes, each node
// rank r reduces its slice across nodes over MPI with node rank r of the other
// nodes (one leader per node when nodes differ in size), and the node reads
// the result.
// Reductions run in a fixed order (node rank order, then node order), so every
// rank gets bit-identical results, run after run.
//
// Mismatched calls (count, type, op, root, SharedBucket::average vs allreduce)
// are an mpiml::Error on every rank, always: each rank's arguments travel with
// its arrival at the first barrier (across nodes, one small MPI agreement).
//
// Environment (read once, at the first use):
//   MPIML_SHM=auto|on|off          auto (default): by size; on: always; off: never
//   MPIML_SHM_THRESHOLD=bytes      auto: allreduce of at least this many bytes (0)
//   MPIML_SHM_BCAST_THRESHOLD=bytes auto: broadcast of at least this many bytes (0)
//                                  (auto: with several nodes, at least 64 KiB too;
//                                  with more ranks than cores on the node, 1 KiB)
//   MPIML_SHM_CHUNK=bytes          pipeline chunk (per buffer set)
//   MPIML_NODE_SPLIT=K             test aid: ranks r of a node with the same
//                                  r / K form one "node" (simulates K-rank nodes)
#pragma once

#include <mpiml/collectives.hpp>
#include <mpiml/datatype.hpp>
#include <mpiml/session.hpp>
#include <mpiml/shm_config.hpp>

#include <cstddef>
#include <memory>
#include <span>

namespace mpiml {

namespace shm {

/// The settings in force (environment, then set_mode).
Config config();
/// Overrides MPIML_SHM at run time. Every rank must make the same change
/// between the same collectives.
void set_mode(Mode mode);
/// Whether an allreduce of `bytes` bytes on comm, as mpiml dispatches it,
/// takes the shared-memory path. Collective the first time on a communicator
/// (it sets up the node layout); the same answer on every rank.
bool takes_shared_path(std::size_t bytes, Comm comm = {});

}  // namespace shm

namespace detail {
struct ShmContext;
}

/// A buffer of `bytes` bytes per rank, in memory shared by the ranks of a node.
/// Constructing, reducing and destroying it are collective over comm (every
/// rank, same order, same size). Destroy it before MPI_Finalize or let mpiml's
/// finalize release it. Its destruction is checked as a collective: a rank
/// that destroys it while the others wait in another collective meets the
/// mismatch error, the exit guard or the watchdog, and a bucket destroyed
/// while an exception unwinds is left to finalize.
class SharedBucket {
public:
    SharedBucket(std::size_t bytes, Comm comm = {});
    ~SharedBucket();
    SharedBucket(SharedBucket&& other) noexcept;
    SharedBucket& operator=(SharedBucket&& other) noexcept;
    SharedBucket(const SharedBucket&) = delete;
    SharedBucket& operator=(const SharedBucket&) = delete;

    void* data() const { return data_; }
    std::size_t size_bytes() const { return bytes_; }
    MPI_Comm comm() const { return comm_; }

    template <MpiType T>
    std::span<T> as_span() const {
        return {static_cast<T*>(data_), bytes_ / sizeof(T)};
    }

    /// In place: the first count elements become op over all ranks.
    /// Built-in ops reduce through shared memory (unless MPIML_SHM=off);
    /// user-defined ops and MPIML_SHM=off go through mpiml::allreduce's core.
    void allreduce(std::size_t count, MPI_Datatype type, const ReduceOp& op);
    /// Deprecated: the same; cls is ignored (the type's class is the registry's).
    void allreduce(std::size_t count, MPI_Datatype type, TypeClass cls, const ReduceOp& op);
    template <MpiType T>
    void allreduce(std::size_t count, ReduceOp op) {
        allreduce(count, mpi_datatype<T>(), op);
    }
    /// In place: the first count elements become their sum over all ranks
    /// divided by the number of ranks (floating or complex types).
    void average(std::size_t count, MPI_Datatype type);
    template <MpiType T>
    void average(std::size_t count) {
        average(count, mpi_datatype<T>());
    }

private:
    void release() noexcept;
    void reduce(std::size_t count, MPI_Datatype type, const ReduceOp& op, bool average,
                const char* call);

    std::shared_ptr<detail::ShmContext> ctx_;
    MPI_Comm comm_ = MPI_COMM_NULL;
    MPI_Win win_ = MPI_WIN_NULL;
    std::size_t bytes_ = 0;
    void* data_ = nullptr;
    std::unique_ptr<void*[]> peers_;  // every node rank's bucket
    std::size_t id_ = 0;              // registry entry, for finalize
};

namespace detail {
/// Memory for repeated in-place collectives of up to bytes on comm: a
/// SharedBucket where the shared-memory path applies to that size (the same
/// answer on every rank), else nullptr. Collective.
std::unique_ptr<SharedBucket> collective_memory(std::size_t bytes, MPI_Comm comm,
                                                const char* call);
/// From now on buckets released are not freed (MPI_Win_free is collective)
/// but left to MPI_Finalize, which frees them after the exit guard: for an
/// interpreter's teardown at exit, where a peer may still wait in a
/// collective and never free its own.
void defer_collective_frees() noexcept;
/// Whether frees are deferred: for the process, or on this thread (a
/// DeferFrees alive on it).
bool collective_frees_deferred() noexcept;
/// Whether defer_collective_frees() was called (the process is ending).
bool process_frees_deferred() noexcept;
/// The node-shared buckets alive in this process (for tests of their
/// release).
std::size_t shared_bucket_count() noexcept;
/// While one is alive on this thread, buckets released are left to
/// MPI_Finalize as after defer_collective_frees(): for a destruction whose
/// moment differs between ranks (Python's garbage collector).
class DeferFrees {
public:
    DeferFrees() noexcept;
    ~DeferFrees();
    DeferFrees(const DeferFrees&) = delete;
    DeferFrees& operator=(const DeferFrees&) = delete;
};
/// While one is alive on this thread, buckets released skip their own
/// agreement: the caller has made one (every rank at the same point).
class FreesAgreed {
public:
    FreesAgreed() noexcept;
    ~FreesAgreed();
    FreesAgreed(const FreesAgreed&) = delete;
    FreesAgreed& operator=(const FreesAgreed&) = delete;
};
}  // namespace detail

}  // namespace mpiml
