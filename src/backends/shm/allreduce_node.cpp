// Shared-memory allreduce on one node, and through node leaders when nodes
// differ in size (nodes of one size: allreduce_peers.cpp).
//
// allreduce round, p node ranks, rank r owns slice r of the chunk:
//   1. r copies its slices q != r into its own set.
//   2. barrier; r reduces slice r over all ranks in rank order (its own part
//      straight from its send buffer) into recv, and on one node into every
//      other rank's set (writing to a peer's lines costs less than reading
//      them), else into its own set.
//   3. barrier; r copies the reduced slices q != r into recv: from its own
//      set on one node, else from their owners' sets.
// Nodes of unequal size: the leader gathers the reduced slices, reduces
// across leaders (deterministic reduce-scatter + allgather over MPI),
// barrier, and every rank copies the chunk from the leader's set.
// With several nodes, steps 2-3 are node_round, which SharedBucket also runs
// once in place (its buckets are the sets, no step 1; with nodes of one size
// it folds the slice across nodes before the barrier of step 3). On one node
// SharedBucket runs push_round: step 2 writes the reduced slice into every
// bucket, and there is no step 3.
#include "algorithms.hpp"

#include <cstring>
#include <vector>

namespace mpiml::detail {

void node_round(ShmContext& c, const char* const* in, char* const* res, char* out,
                std::size_t m, const Kernel& k, int divide_by, bool stream, const char* call) {
    const std::size_t ts = k.tsize;
    const int p = c.node_size, me = c.node_rank;
    const bool hier = c.num_nodes > 1;
    const bool peers = hier && c.peers != MPI_COMM_NULL;
    const auto copy = [stream](char* dst, const char* src, std::size_t n) {
        if (stream) stream_copy(dst, src, n);
        else std::memcpy(dst, src, n);
    };
    const Slices sl(m, p, ts);
    const std::size_t o = sl.off(me) * ts, len = sl.len(me);
    static thread_local std::vector<const char*> from;
    from.resize(static_cast<std::size_t>(p));
    for (int q = 0; q < p; ++q) from[q] = in[q] + o;
    char* mine = res[me] + o;
    reduce_slice(k, from.data(), p, len, mine, hier || out == res[me] ? nullptr : out + o,
                 hier ? 0 : divide_by);
    // Nodes of one size: every rank exchanges its slice with its peers.
    if (peers && c.num_nodes == 2) pair_allreduce(c, mine, len, k, divide_by, call);
    else if (peers) group_allreduce(c, c.peers, c.peer_rank, mine, len, k, divide_by, call);
    c.barrier();
    if (!hier || peers) {
        for (int q = 0; q < p; ++q)
            if (q != me) copy(out + sl.off(q) * ts, res[q] + sl.off(q) * ts, sl.len(q) * ts);
    } else {
        if (me == 0) {
            for (int q = 1; q < p; ++q)
                std::memcpy(res[0] + sl.off(q) * ts, res[q] + sl.off(q) * ts, sl.len(q) * ts);
            leader_allreduce(c, res[0], m, k, divide_by, call);
        }
        c.barrier();
        if (out != res[0]) copy(out, res[0], m * ts);
    }
}

void push_round(ShmContext& c, const char* const* in, char* const* out, std::size_t m,
                const Kernel& k, int divide_by) {
    const std::size_t ts = k.tsize;
    const int p = c.node_size;
    const Slices sl(m, p, ts);
    const std::size_t o = sl.off(c.node_rank) * ts;
    static thread_local std::vector<const char*> from;  // no allocation per call
    static thread_local std::vector<char*> to;
    from.resize(static_cast<std::size_t>(p));
    to.resize(static_cast<std::size_t>(p));
    for (int q = 0; q < p; ++q) {
        from[q] = in[q] + o;
        to[q] = out[q] + o;
    }
    reduce_slice(k, from.data(), p, sl.len(c.node_rank), to.data(), p, divide_by);
}

void run_allreduce(ShmContext& c, const char* send, char* recv, std::size_t count,
                   const Kernel& k, const Signature& sig, const char* call) {
    const std::size_t ts = k.tsize;
    const std::size_t per = c.chunk / ts;
    const int p = c.node_size, me = c.node_rank;
    const bool hier = c.num_nodes > 1;
    if (hier && c.peers != MPI_COMM_NULL) return run_allreduce_peers(c, send, recv, count, k, sig, call);
    static thread_local std::vector<const char*> in;  // no allocation per call
    static thread_local std::vector<char*> res;
    in.resize(static_cast<std::size_t>(p));
    res.resize(static_cast<std::size_t>(p));
    if (!hier && count * ts <= std::min(kOneBarrierBytes, c.chunk)) {
        // Small, one node: one barrier. Every rank publishes its input in its
        // set and reduces all of them in rank order (as a slice is) into recv.
        // The set is rewritten two rounds on, after the next round's barrier,
        // which no rank passes before every rank has read this round's.
        ++c.round;
        std::memcpy(c.set(me), send, count * ts);
        checked_barrier(c, sig, call);
        for (int q = 0; q < p; ++q) in[q] = q == me ? send : c.set(q);
        reduce_slice(k, in.data(), p, count, recv, nullptr, 0);
        return;
    }
    for (std::size_t done = 0; done < count;) {
        const std::size_t m = std::min(per, count - done);
        const char* s = send + done * ts;
        char* r = recv + done * ts;
        ++c.round;
        const Slices sl(m, p, ts);
        char* mine = c.set(me);
        for (int q = 0; q < p; ++q)
            if (q != me) std::memcpy(mine + sl.off(q) * ts, s + sl.off(q) * ts, sl.len(q) * ts);
        if (done == 0) checked_barrier(c, sig, call);
        else c.barrier();
        for (int q = 0; q < p; ++q) {
            in[q] = q == me ? s : c.set(q);  // this rank's own slice straight from send
            res[q] = c.set(q);
        }
        if (hier) {
            node_round(c, in.data(), res.data(), r, m, k, 0, false, call);
        } else {
            // One node: slice me goes into every other rank's set and into
            // recv; after the barrier each rank copies from its own set.
            res[me] = r;
            push_round(c, in.data(), res.data(), m, k, 0);
            c.barrier();
            for (int q = 0; q < p; ++q)
                if (q != me) std::memcpy(r + sl.off(q) * ts, mine + sl.off(q) * ts, sl.len(q) * ts);
        }
        done += m;
    }
}

}  // namespace mpiml::detail
