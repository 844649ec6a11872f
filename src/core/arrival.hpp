// The node's arrival board (arrival.cpp): the world collective each rank of
// this node last entered, in a shared window.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>

namespace mpiml::detail {

/// Bytes a rank allocates for its words in a node board's shared window, and
/// where in that segment they go (own_lines): words a rank writes at every
/// collective must not share a cache line (nor its prefetched pair) with a
/// peer's, or each write waits for the line to come back from the peer's core.
constexpr MPI_Aint kBoardSegment = 256;
inline std::uint64_t* own_lines(void* segment) {
    const auto a = (reinterpret_cast<std::uintptr_t>(segment) + 127) & ~std::uintptr_t{127};
    return reinterpret_cast<std::uint64_t*>(a);
}

/// Sets up the board, collectively over MPI_COMM_WORLD (once; part of the
/// world set-up, exit_guard.hpp).
void arrival_board_setup();
/// Marks entry into a world collective.
void arrival_mark(std::uint64_t world_seq);
/// No lower world rank of this node has entered world collective world_seq
/// (true without a board): the one rank of the node to speak for it.
bool first_here_in(std::uint64_t world_seq);
/// "; ranks on this node (host) that never arrived: ..." for a wait in
/// collective my_seq on comm (the board knows MPI_COMM_WORLD's only).
std::string missing_ranks(std::uint64_t my_seq, MPI_Comm comm);

}  // namespace mpiml::detail
