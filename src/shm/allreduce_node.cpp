// Shared-memory allreduce on one node, and through node leaders when nodes
// differ in size (nodes of one size: allreduce_peers.cpp).
//
// allreduce round, p node ranks, rank r owns slice r of the chunk:
//   1. r copies its slices q != r into its own set.
//   2. barrier; r reduces slice r over all ranks in rank order (its own part
//      straight from its send buffer) into its set, and into recv.
//   3. barrier; r copies the reduced slices q != r into recv.
// Nodes of unequal size: the leader gathers the reduced slices, reduces
// across leaders (deterministic reduce-scatter + allgather over MPI),
// barrier, and every rank copies the chunk from the leader's set.
#include "algorithms.hpp"

#include <cstring>
#include <vector>

namespace mpiml::detail {

void run_allreduce(ShmContext& c, const char* send, char* recv, std::size_t count,
                   const Kernel& k, const char* call) {
    const std::size_t ts = k.tsize;
    const std::size_t per = c.chunk / ts;
    const int p = c.node_size, me = c.node_rank;
    const bool hier = c.num_nodes > 1;
    if (hier && c.peers != MPI_COMM_NULL) return run_allreduce_peers(c, send, recv, count, k, call);
    std::vector<const char*> in(p);
    for (std::size_t done = 0; done < count;) {
        const std::size_t m = std::min(per, count - done);
        const char* s = send + done * ts;
        char* r = recv + done * ts;
        ++c.round;
        const Slices sl(m, p, ts);
        char* mine = c.set(me);
        for (int q = 0; q < p; ++q)
            if (q != me) std::memcpy(mine + sl.off(q) * ts, s + sl.off(q) * ts, sl.len(q) * ts);
        c.barrier();
        const std::size_t o = sl.off(me) * ts;
        for (int q = 0; q < p; ++q) in[q] = q == me ? s + o : c.set(q) + o;
        reduce_slice(k, in.data(), p, sl.len(me), mine + o, hier ? nullptr : r + o, 0);
        c.barrier();
        if (!hier) {
            for (int q = 0; q < p; ++q)
                if (q != me)
                    std::memcpy(r + sl.off(q) * ts, c.set(q) + sl.off(q) * ts, sl.len(q) * ts);
        } else {
            char* lead = c.set(0);
            if (me == 0) {
                for (int q = 1; q < p; ++q)
                    std::memcpy(lead + sl.off(q) * ts, c.set(q) + sl.off(q) * ts, sl.len(q) * ts);
                leader_allreduce(c, lead, m, k, 0, call);
            }
            c.barrier();
            std::memcpy(r, lead, m * ts);
        }
        done += m;
    }
}

}  // namespace mpiml::detail
