// Shared-memory allreduce across nodes of one size: node rank r exchanges its
// reduced slice with node rank r of the other nodes (a peer communicator, in
// node order) and folds the node results in node order; and the deterministic
// exchanges across nodes (group, pair, leaders) the other paths use.
#include "algorithms.hpp"

#include "core/backend.hpp"

#include <mpiml/error.hpp>

#include <cstring>
#include <vector>

namespace mpiml::detail {
namespace {

// Starts the exchange of bytes at out with the other node's peer (2 nodes),
// received into inbox slot i % kPeerDepth; returns where the peer's bytes land.
char* post_pair_exchange(ShmContext& c, std::size_t i, char* out, std::size_t bytes, int tag,
                         MPI_Request (&req)[2], const char* call) {
    char* got = c.inbox.data() + (i % kPeerDepth) * (c.chunk + kLine);
    const int other = 1 - c.peer_rank;
    const int n = static_cast<int>(bytes);
    check_mpi(MPI_Irecv(got, n, MPI_BYTE, other, tag, c.peers, &req[0]), call);
    check_mpi(MPI_Isend(out, n, MPI_BYTE, other, tag, c.peers, &req[1]), call);
    return got;
}

// Slice q of a chunk of m elements when every chunk is cut like the first
// one (base elements) and the last, shorter one clipped: rank q owns the same
// bytes of every set in every chunk, so a set's slice is never read by one
// rank while its owner writes it for a later chunk.
struct FixedSlices {
    FixedSlices(std::size_t base, std::size_t m_, int p, std::size_t ts) : full(base, p, ts), m(m_) {}
    std::size_t off(int q) const { return std::min(m, full.off(q)); }
    std::size_t len(int q) const { return off(q + 1) - off(q); }
    Slices full;
    std::size_t m;
};

}  // namespace

// Deterministic allreduce of m elements of buf across the nodes, over group
// (leaders, or the peers of one node rank; rank me of L, in node order): rank
// j reduces slice j over all nodes in node order, then all gather.
void group_allreduce(ShmContext& c, MPI_Comm group, int me, char* buf, std::size_t m,
                     const Kernel& k, int divide_by, const char* call) {
    const int L = c.num_nodes;
    const std::size_t ts = k.tsize;
    const std::size_t piece = c.chunk / ts;
    std::vector<int> scount(L), sdispl(L), rcount(L), rdispl(L);
    std::vector<const char*> in(L);
    for (std::size_t done = 0; done < m; done += piece) {
        const std::size_t n = std::min(piece, m - done);
        char* b = buf + done * ts;
        const Slices sl(n, L, ts);
        const std::size_t mylen = sl.len(me);
        for (int j = 0; j < L; ++j) {
            scount[j] = static_cast<int>(sl.len(j) * ts);
            sdispl[j] = static_cast<int>(sl.off(j) * ts);
            rcount[j] = static_cast<int>(mylen * ts);
            rdispl[j] = static_cast<int>(j * mylen * ts);
            in[j] = c.scratch.data() + rdispl[j];
        }
        check_mpi(MPI_Alltoallv(b, scount.data(), sdispl.data(), MPI_BYTE, c.scratch.data(),
                                rcount.data(), rdispl.data(), MPI_BYTE, group),
                  call);
        reduce_slice(k, in.data(), L, mylen, b + sl.off(me) * ts, nullptr, divide_by);
        check_mpi(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, b, scount.data(),
                                 sdispl.data(), MPI_BYTE, group),
                  call);
    }
}

// The same across exactly 2 nodes with one peer (rank other of c.peers):
// buf goes out in chunk-sized pieces, kPeerDepth in flight, and each piece
// is folded in node order (then divided) as it arrives.
void pair_allreduce(ShmContext& c, char* buf, std::size_t m, const Kernel& k, int divide_by,
                    const char* call) {
    const std::size_t ts = k.tsize, per = c.chunk / ts;
    const std::size_t pieces = (m + per - 1) / per;
    const int other = 1 - c.peer_rank;
    MPI_Request req[kPeerDepth][2];
    const char* got[kPeerDepth] = {};
    auto post = [&](std::size_t i) {
        const std::size_t n = std::min(per, m - i * per);
        got[i % kPeerDepth] = post_pair_exchange(c, i, buf + i * per * ts, n * ts, 1, req[i % kPeerDepth], call);
    };
    for (std::size_t i = 0; i < std::min<std::size_t>(pieces, kPeerDepth); ++i) post(i);
    for (std::size_t i = 0; i < pieces; ++i) {
        wait_all(2, req[i % kPeerDepth], call);
        const std::size_t n = std::min(per, m - i * per);
        char* mine = buf + i * per * ts;
        const char* ins[2];
        ins[c.peer_rank] = mine;
        ins[other] = got[i % kPeerDepth];
        reduce_slice(k, ins, 2, n, mine, nullptr, divide_by);
        if (i + kPeerDepth < pieces) post(i + kPeerDepth);
    }
}

void leader_allreduce(ShmContext& c, char* buf, std::size_t m, const Kernel& k, int divide_by,
                      const char* call) {
    group_allreduce(c, c.leaders, c.leader_rank, buf, m, k, divide_by, call);
}

// The hierarchical allreduce with nodes of one size. Node rank r, per chunk:
// reduces slice r over its node (shared memory) into recv, exchanges it with
// node rank r of every other node (every rank uses the network at once), folds
// the node results in node order into recv and into its set, and the node
// copies the slices from the sets. One node barrier per step: step t copies
// chunk t into the sets and writes the folded slice of chunk t - D, barrier,
// then reduces chunk t (and starts its exchange) and copies chunk t - D out.
// With 2 nodes D exchanges are in flight while the node works; with more,
// each exchange is a blocking reduce-scatter + allgather (D = 1).
void run_allreduce_peers(ShmContext& c, const char* send, char* recv, std::size_t count,
                         const Kernel& k, const Signature& sig, const char* call) {
    const std::size_t ts = k.tsize;
    const std::size_t per = c.chunk / ts;
    const int p = c.node_size, me = c.node_rank;
    const bool pair = c.num_nodes == 2;
    const std::size_t base = std::min(per, count);
    const std::size_t chunks = (count + per - 1) / per;
    const std::size_t depth = pair ? std::min<std::size_t>(kPeerDepth, chunks) : 1;
    std::vector<const char*> in(p);
    struct Exchange {
        char* out = nullptr;  // this rank's slice in recv (sent; the result goes here)
        char* got = nullptr;  // the other node's slice
        std::size_t len = 0;
        MPI_Request req[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    };
    Exchange ex[kPeerDepth];
    const int other = 1 - c.peer_rank;
    for (std::size_t t = 0; t < chunks + depth; ++t) {
        ++c.round;
        const bool reduce = t < chunks, fold = t >= depth;
        const std::size_t j = t - depth;  // chunk folded and copied out (if fold)
        const std::size_t m = reduce ? std::min(per, count - t * per) : 0;
        const char* s = reduce ? send + t * per * ts : send;
        char* r = reduce ? recv + t * per * ts : recv;
        const FixedSlices sl(base, m, p, ts);
        char* mine = c.set(me);
        if (reduce)
            for (int q = 0; q < p; ++q)
                if (q != me) std::memcpy(mine + sl.off(q) * ts, s + sl.off(q) * ts, sl.len(q) * ts);
        const std::size_t mj = fold ? std::min(per, count - j * per) : 0;
        const FixedSlices slj(base, mj, p, ts);
        Exchange& e = ex[j % kPeerDepth];
        if (fold) {
            char* shared = mine + slj.off(me) * ts;
            if (pair) {
                wait_all(2, e.req, call);
                const char* ins[2];
                ins[c.peer_rank] = e.out;
                ins[other] = e.got;
                reduce_slice(k, ins, 2, e.len, e.out, shared, 0);
            } else {
                std::memcpy(shared, e.out, e.len * ts);
            }
        }
        if (t == 0) {
            checked_barrier(c, sig, call);
        } else if (pair) {
            c.barrier([&] {
                int done = 0;
                for (auto& x : ex) check_mpi(MPI_Testall(2, x.req, &done, MPI_STATUSES_IGNORE), call);
            });
        } else {
            c.barrier();
        }
        if (reduce) {
            const std::size_t o = sl.off(me) * ts, len = sl.len(me);
            for (int q = 0; q < p; ++q) in[q] = q == me ? s + o : c.set(q) + o;
            Exchange& n = ex[t % kPeerDepth];
            n.out = r + o;
            n.len = len;
            reduce_slice(k, in.data(), p, len, n.out, nullptr, 0);
            if (pair) {
                n.got = post_pair_exchange(c, t, n.out, len * ts, 0, n.req, call);
            } else {
                group_allreduce(c, c.peers, c.peer_rank, n.out, len, k, 0, call);
            }
        }
        if (fold) {
            char* rj = recv + j * per * ts;
            for (int q = 0; q < p; ++q)
                if (q != me)
                    std::memcpy(rj + slj.off(q) * ts, c.set(q) + slj.off(q) * ts, slj.len(q) * ts);
        }
    }
}

}  // namespace mpiml::detail
