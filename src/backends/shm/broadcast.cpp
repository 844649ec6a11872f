// Shared-memory broadcast: the root's node reads it from the root's set; with
// several nodes the leaders broadcast each piece over MPI first.
#include "algorithms.hpp"

#include <mpiml/error.hpp>

#include <cstring>

namespace mpiml::detail {

void run_broadcast(ShmContext& c, char* buf, std::size_t bytes, const Signature& sig,
                   const char* call) {
    const int root = sig.root;
    const bool hier = c.num_nodes > 1;
    const bool root_here = c.leader_of[root] == c.leader_of[c.rank];
    const int src_rank = root_here ? c.node_rank_of[root] : 0;
    // Quarter-chunk rounds: the root fills one set while the others drain the other.
    const std::size_t piece = std::max<std::size_t>(kLine, c.chunk / 4);
    for (std::size_t done = 0; done < bytes;) {
        const std::size_t m = std::min(piece, bytes - done);
        char* b = buf + done;
        ++c.round;
        char* src = c.set(src_rank);
        if (c.rank == root) std::memcpy(src, b, m);
        if (done == 0) checked_barrier(c, sig, call);
        else c.barrier();
        if (hier) {
            if (c.leader_rank >= 0)
                check_mpi(MPI_Bcast(src, static_cast<int>(m), MPI_BYTE, c.leader_of[root],
                                    c.leaders),
                          call);
            c.barrier();
        }
        if (c.rank != root) std::memcpy(b, src, m);
        done += m;
    }
}

}  // namespace mpiml::detail
