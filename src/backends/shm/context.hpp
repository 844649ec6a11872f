// The shared-memory context of a communicator, and the one path decision.
//
// Per communicator, a context holds the node communicator (ranks sharing
// memory), a leader communicator (node rank 0 of every node) and one window
// in which every node rank owns a flag line and two chunk-sized buffer sets.
// Large buffers go through the sets chunk by chunk; chunk k uses set k % 2.
// Every round has a node barrier that each rank enters after its reads of the
// previous round and before its writes of the next one, so a set is never
// rewritten while a peer still reads it.
#pragma once

#include "kernels.hpp"

#include <mpiml/shm.hpp>

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <bit>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

namespace mpiml::detail {

constexpr int kPeerDepth = 4;         // exchanges in flight at once across 2 nodes
constexpr std::size_t kHeader = 128;  // flag line (+ the adjacent line)

/// What a rank passed to a shared-memory collective. Published in its flag
/// line before the collective's first barrier and compared after it
/// (checked_barrier): a mismatch throws on every rank before any rank reads
/// a peer's data.
struct Signature {
    enum Kind : std::uint8_t { allreduce = 1, broadcast, bucket_allreduce, bucket_average };
    std::uint64_t count = 0;
    std::uint64_t bytes = 0;
    std::uint8_t kind = 0;
    std::uint8_t op = 0xff;        // mpiml::Op; 0xff for broadcast
    std::uint16_t type = 0xffff;   // registry id; 0xffff when not in the registry
    std::int32_t root = -1;
};
static_assert(sizeof(Signature) == 24);

/// Whether two ranks' calls fit together: the same kind, bytes and root, and
/// for reductions the same count, type and op (a broadcast moves bytes).
inline bool same_call(const Signature& a, const Signature& b) {
    if (a.kind != b.kind || a.bytes != b.bytes || a.root != b.root) return false;
    return a.kind == Signature::broadcast || (a.count == b.count && a.type == b.type && a.op == b.op);
}

struct ShmContext {
    MPI_Comm comm = MPI_COMM_NULL;     // the user's communicator (not owned)
    MPI_Comm node = MPI_COMM_NULL;     // ranks of comm sharing memory (owned)
    MPI_Comm leaders = MPI_COMM_NULL;  // node rank 0 of every node (owned; null elsewhere)
    MPI_Comm peers = MPI_COMM_NULL;    // same node rank on every node, in node order (owned;
                                       // only with several nodes all of one size)
    int peer_rank = -1;                // this node's place in the node order
    int rank = 0, size = 1;            // in the user's communicator
    int node_rank = 0, node_size = 1, num_nodes = 1, leader_rank = -1, max_node_size = 1;
    std::vector<int> leader_of;        // comm rank -> leader rank of its node
    std::vector<int> node_rank_of;     // comm rank -> its node rank
    MPI_Win win = MPI_WIN_NULL;
    std::size_t chunk = 0;             // bytes per buffer set
    std::vector<char*> data;           // node rank -> its two buffer sets
    std::vector<std::uint64_t*> flag;  // node rank -> its barrier flag
    std::uint64_t epoch = 0;
    std::uint64_t round = 0;
    int spin_limit = 64;               // pauses before yielding (see barrier)
    bool crowded = false;              // the node's ranks outnumber its cores
    std::vector<char> scratch;         // leader reduce-scatter
    std::vector<char> inbox;           // slices received from the other node (kPeerDepth)
    bool alive = false;
    std::vector<std::int64_t> free_key;  // free_order_key(comm): finalize frees in its order

    char* set(int q) const { return data[q] + (round % 2) * chunk; }

    // Node rank q's signature for the barrier that takes epoch to e: two
    // slots after the flag and waiter words, by parity, so that a rank one
    // barrier ahead never overwrites the one a peer is still reading.
    Signature* signature(int q, std::uint64_t e) const {
        return reinterpret_cast<Signature*>(reinterpret_cast<char*>(flag[q]) + 16) + (e & 1);
    }

    // Flags in shared memory: a seq_cst store on arrival, acquire on every
    // peer. A waiter spins (long when every rank has a core of its own,
    // briefly when ranks outnumber cores), yields for kYieldTime, then sleeps
    // on a futex on the low half of the peer's flag after counting itself in
    // the peer's waiter word; an arriving rank wakes only when that count is
    // non-zero, so the uncontended path stays a store. Store-then-load on
    // both sides (seq_cst) means either the waiter sees the new epoch or the
    // arriving rank sees the waiter; FUTEX_WAIT re-checks the word itself.
    void barrier() { barrier([] {}, false); }

    // The same for a rank with MPI transfers in flight to another node:
    // poke() drives them while it waits (every kPokeTime once asleep). MPI
    // moves data only inside MPI calls, and the peer on the other node may
    // wait for this rank's part while its own node partner waits for it.
    template <class Poke>
    void barrier(Poke&& poke, bool pokes = true) {
        ++epoch;
        std::atomic_ref<std::uint64_t>(*flag[node_rank]).store(epoch, std::memory_order_seq_cst);
        if (std::atomic_ref<std::uint32_t>(*waiters(node_rank)).load(std::memory_order_seq_cst) != 0)
            futex_wake(futex_word(node_rank));
        for (int q = 0; q < node_size; ++q) {
            if (q == node_rank) continue;
            std::atomic_ref<std::uint64_t> f(*flag[q]);
            std::chrono::steady_clock::time_point yielding;
            for (int spins = 0; f.load(std::memory_order_acquire) < epoch; ++spins) {
                if (spins < spin_limit) {
                    cpu_relax();
                    continue;
                }
                const auto now = std::chrono::steady_clock::now();
                if (spins == spin_limit) {
                    yielding = now;
                } else if (now - yielding > kYieldTime) {
                    sleep_on(q, poke, pokes);
                    break;
                }
                if (pokes) poke();
                sched_yield();
            }
        }
    }

    // Yielding before sleeping: a peer that is about to arrive (ranks
    // outnumbering cores) costs no wake-up.
    static constexpr auto kYieldTime = std::chrono::microseconds(100);
    std::uint32_t* waiters(int q) const {
        return reinterpret_cast<std::uint32_t*>(reinterpret_cast<char*>(flag[q]) + 8);
    }
    std::uint32_t* futex_word(int q) const {  // low half of the 64-bit flag
        static_assert(std::endian::native == std::endian::little);
        return reinterpret_cast<std::uint32_t*>(flag[q]);
    }
    static void futex_wake(std::uint32_t* word) {
        // Not FUTEX_PRIVATE: the word is in memory shared between processes.
        syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
    }
    // Blocks until peer q's flag reaches epoch. The timeout is a safety net
    // (a job stuck here is ended by the watchdog, from its own thread), or
    // the time between two pokes.
    template <class Poke>
    void sleep_on(int q, Poke& poke, bool pokes) {
        std::atomic_ref<std::uint64_t> f(*flag[q]);
        std::atomic_ref<std::uint32_t> w(*waiters(q));
        w.fetch_add(1, std::memory_order_seq_cst);
        for (;;) {
            const std::uint64_t v = f.load(std::memory_order_seq_cst);
            if (v >= epoch) break;
            const timespec limit{0, pokes ? kPokeTime : 50'000'000};
            syscall(SYS_futex, futex_word(q), FUTEX_WAIT, static_cast<std::uint32_t>(v), &limit,
                    nullptr, 0);
            if (pokes) poke();
        }
        w.fetch_sub(1, std::memory_order_relaxed);
    }
    static constexpr long kPokeTime = 500'000;  // ns

    void release() noexcept {
        if (!alive) return;
        alive = false;
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (finalized) return;
        if (win != MPI_WIN_NULL) {
            MPI_Win_unlock_all(win);
            MPI_Win_free(&win);
        }
        if (peers != MPI_COMM_NULL) MPI_Comm_free(&peers);
        if (leaders != MPI_COMM_NULL) MPI_Comm_free(&leaders);
        if (node != MPI_COMM_NULL) MPI_Comm_free(&node);
    }
};

/// The first barrier of every shared-memory collective (context.cpp). Every
/// collective increments c.round exactly once before it, so that ranks that
/// throw here leave with the same round and epoch. Publishes sig, waits for
/// the node, and compares every node rank's signature (and, with several
/// nodes, every node's, over MPI); on a mismatch every rank of the
/// communicator throws mpiml::Error naming what each rank passed.
void checked_barrier(ShmContext& c, const Signature& sig, const char* call);

/// The settings in force (src/config.cpp, then shm::set_mode).
shm::Config& config_ref();

/// The context of comm, created collectively on first use.
std::shared_ptr<ShmContext> context(MPI_Comm comm, const char* call);

/// The mode and size half of the path decision: no MPI, no context. Checked
/// first on every collective, so that small ones leave at once.
inline bool may_share(std::size_t bytes, std::size_t threshold) {
    const shm::Mode mode = config_ref().mode;
    return mode == shm::Mode::on || (mode == shm::Mode::automatic && bytes >= threshold);
}

// The one path decision: the context of comm when a collective of bytes
// bytes takes the shared-memory path (mode; in auto mode, at least threshold
// bytes and worth_sharing), else nullptr. Collective the first time on comm
// (it creates the context); the same answer on every rank.
ShmContext* shared_context_for(std::size_t bytes, std::size_t threshold, MPI_Comm comm,
                               const char* call);

/// Whether comm is an intra-communicator.
bool usable_comm(MPI_Comm comm);

/// Info for MPI_Win_allocate_shared: segments need not be contiguous.
MPI_Info noncontig_info();

/// In place on a live SharedBucket's memory (data, on comm): true when the
/// bucket path applies (mode, kernel, size), after reducing; else false.
bool bucket_reduce(void* data, std::size_t count, MPI_Datatype type, const ReduceOp& op,
                   bool average, MPI_Comm comm, const char* call);
/// Drops every bucket's memory from the recognized set (at finalization).
void forget_bucket_memory();

/// A key the ranks of comm agree on (collective). Keys of two communicators
/// that share a rank differ, whatever order the ranks' threads made them in,
/// so freeing windows in key order is one order on every rank.
std::vector<std::int64_t> free_order_key(MPI_Comm comm, const char* call);

/// A shared bucket still alive: its window and free order key.
struct BucketWindow {
    MPI_Win win = MPI_WIN_NULL;
    std::vector<std::int64_t> key;
};
/// Registers a live bucket's window; returns its id.
std::size_t add_bucket_window(MPI_Win win, std::vector<std::int64_t> key);
/// Unregisters it: true when the caller frees the window (false once
/// finalization freed it).
bool remove_bucket_window(std::size_t id);

}  // namespace mpiml::detail
