// What every collective goes through (collectives.cpp): its description,
// sequence number and the scope that runs the check, watchdog and profiler.
#pragma once

#include "core/op.hpp"

#include <atomic>
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

/// A communicator's collectives on this rank: their count, and the thread
/// inside one (0: none) with its kind and number (seq << 8 | kind).
struct CommUse {
    std::uint64_t seq = 0;  // written by the owner only
    std::atomic<std::uintptr_t> owner{0};
    std::atomic<std::uint64_t> what{0};
    // Why no collective may run on it any more (a mismatch found after
    // MPI's call); written and read by the owner.
    std::string broken;
    int one_host = -1;  // every rank on one host: 1, else 0; -1 not known yet (owner)
};

/// Claims comm for this thread's collective and returns its sequence number;
/// held: the claim to release (null when this thread already holds it).
/// Another thread inside a collective on comm: an error naming it.
std::uint64_t claim_comm(Kind kind, MPI_Comm comm, const char* call, CommUse*& held);
void release_comm(CommUse*& held);

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
    /// Whether a call MPI carries runs the check's round of its own
    /// (PathCheck): MPIML_CHECK is off and no door has checked.
    bool checks_mpi_path() const { return check_mpi_path_; }
    std::uint64_t seq() const { return seq_; }

private:
    bool check_mpi_path_ = false;
    std::uint64_t seq_ = 0;  // its number on the communicator (0 inside a door)
    std::uint64_t watch_ = 0;  // the watchdog's id, 0: not watched
    bool marked_ = false;  // on the exit guard's board
    std::uint64_t history_ = 0;  // its entry in the history (report.cpp)
    CommUse* use_ = nullptr;  // this thread's claim on the communicator
    std::optional<ProfileMark> profile_;
};

/// Cross-rank mismatch check; throws on every rank.
void check_consistent(const CallInfo& info, std::uint64_t seq);

}  // namespace mpiml::detail
