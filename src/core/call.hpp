// What every collective goes through (collectives.cpp): its description,
// sequence number and the scope that runs the check, watchdog and profiler.
#pragma once

#include "core/op.hpp"

#include <cstdint>
#include <optional>
#include <string>

namespace mpiml::detail {

/// The one op/type legality check of every reduction: MPI_OP_NULL, and a
/// built-in op on a class it is not defined for (op_allowed); user-defined
/// ops are left to MPI. Throws naming call.
void check_op(const ReduceOp& op, TypeClass cls, MPI_Datatype type, const char* call);

/// The kinds of collective, for checks, the watchdog and profiles.
enum class Kind : std::int64_t { allreduce = 1, broadcast, allgather, barrier, other };
const char* kind_name(Kind k);

/// Description of one collective call.
struct CallInfo {
    Kind kind;
    const char* call;
    std::size_t count;
    MPI_Datatype type;
    int op_id;   // index of mpiml::Op, -1 for none, 99 for a user MPI_Op
    int root;    // -1 for none
    MPI_Comm comm;
};
std::string describe(const CallInfo& c);

/// Sequence number of the next collective on comm (per communicator).
std::uint64_t next_sequence(MPI_Comm comm);

/// A collective being profiled: recorded when its CollectiveScope ends.
struct ProfileMark {
    CallInfo info;
    std::uint64_t seq;
    std::int64_t t0;        // entry, profile_now()
    std::int64_t check_ns;  // time in the mismatch check, -1 when the check is off
    std::uint32_t generation;
};

/// RAII around every collective: mismatch check, watchdog, profile hooks.
class CollectiveScope {
public:
    explicit CollectiveScope(const CallInfo& info);
    ~CollectiveScope();
    CollectiveScope(const CollectiveScope&) = delete;
    CollectiveScope& operator=(const CollectiveScope&) = delete;

private:
    bool armed_ = false;
    bool marked_ = false;  // on the exit guard's board
    std::optional<ProfileMark> profile_;
};

/// Cross-rank mismatch check; throws on every rank.
void check_consistent(const CallInfo& info, std::uint64_t seq);

}  // namespace mpiml::detail
