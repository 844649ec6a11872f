// The shared-memory algorithms, one per file: on one node or through node
// leaders (allreduce_node.cpp), across nodes of one size (allreduce_peers.cpp),
// broadcast (broadcast.cpp). Every rank of the node calls them alike.
#pragma once

#include "context.hpp"

namespace mpiml::detail {

/// One node, up to this many bytes: run_allreduce's one-barrier round (every
/// rank reduces all inputs) instead of slices and two barriers.
constexpr std::size_t kOneBarrierBytes = 16384;

/// allreduce_node.cpp: one round of the node algorithm on m elements, after a
/// node barrier (inputs ready). Node rank me reduces slice me of in[0..p)
/// (node rank order) into res[me], and into out when out is another buffer
/// (one node); nodes of one size fold that slice across nodes (pair or group
/// exchange). Barrier; out gets every other slice from res[q]. Nodes of
/// unequal size: node rank 0 gathers the slices into res[0] and reduces them
/// across leaders; barrier; out gets all from res[0]. divide_by > 1 divides
/// the result; stream: copies into out with stream_copy.
void node_round(ShmContext& c, const char* const* in, char* const* res, char* out,
                std::size_t m, const Kernel& k, int divide_by, bool stream, const char* call);
/// allreduce_node.cpp: one node, between two node barriers (inputs ready;
/// results written). Node rank me reduces slice me of in[0..p) (node rank
/// order) and writes it into slice me of every out[q]. SharedBucket passes
/// its buckets as both (in place: no rank reads a slice after its owner
/// wrote it, so no copy round); run_allreduce passes the sets, with its send
/// and recv buffers as in[me] and out[me]. divide_by > 1 divides the result.
void push_round(ShmContext& c, const char* const* in, char* const* out, std::size_t m,
                const Kernel& k, int divide_by);
/// allreduce_node.cpp: count elements of send into recv (send may be recv);
/// hands nodes of one size to run_allreduce_peers. Each run_* takes its
/// first barrier through checked_barrier with sig.
void run_allreduce(ShmContext& c, const char* send, char* recv, std::size_t count,
                   const Kernel& k, const Signature& sig, const char* call);

/// allreduce_peers.cpp: the hierarchical allreduce with nodes of one size.
void run_allreduce_peers(ShmContext& c, const char* send, char* recv, std::size_t count,
                         const Kernel& k, const Signature& sig, const char* call);
/// Deterministic allreduce of m elements of buf across the nodes over group
/// (rank me, in node order), divided by divide_by when it is > 1.
void group_allreduce(ShmContext& c, MPI_Comm group, int me, char* buf, std::size_t m,
                     const Kernel& k, int divide_by, const char* call);
/// The same across exactly 2 nodes with one peer (c.peers).
void pair_allreduce(ShmContext& c, char* buf, std::size_t m, const Kernel& k, int divide_by,
                    const char* call);
/// group_allreduce over the node leaders.
void leader_allreduce(ShmContext& c, char* buf, std::size_t m, const Kernel& k, int divide_by,
                      const char* call);

/// broadcast.cpp: bytes bytes of buf from comm rank sig.root.
void run_broadcast(ShmContext& c, char* buf, std::size_t bytes, const Signature& sig,
                   const char* call);

}  // namespace mpiml::detail
