// Cross-rank agreement and the mismatch messages built from it.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

namespace mpiml::detail {

/// Cross-rank agreement in one MPI_MAX allreduce of x and ~x (plain MPI, no
/// checks or profile): true on every rank when every rank passed the same n
/// values; lo/hi, when given, receive each value's minimum and maximum
/// (collectives.cpp).
bool agree(const std::int64_t* x, int n, MPI_Comm comm, const char* call,
           std::int64_t* lo = nullptr, std::int64_t* hi = nullptr);

/// "rank 2" or "ranks 0, 3" (error.cpp).
std::string rank_list(const std::vector<int>& ranks);
/// The body of a mismatch message, the same on every rank: ranks grouped by
/// what each has, `first`'s group first, e.g. "ranks 0, 2 called X; rank 1 called Y".
std::string group_ranks(const std::vector<std::string>& per_rank, int first, const char* verb_one,
                        const char* verb_many);

}  // namespace mpiml::detail
