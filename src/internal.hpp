// State shared by mpiml's translation units (not installed).
#pragma once

#include <mpiml/collectives.hpp>
#include <mpiml/profile.hpp>

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace mpiml::detail {

struct State {
    bool ready = false;            // MPI initialized and mpiml configured
    bool we_initialized = false;   // mpiml called MPI_Init_thread
    int provided = 0;
    MPI_Comm default_comm = MPI_COMM_WORLD;
    // Written by set_timeout/set_check, read by the watchdog thread.
    std::atomic<double> timeout{0.0};  // seconds, 0: off
    std::atomic<bool> check{false};
    bool abort_on_failure = true;
    int world_rank = -1;           // cached for signal handlers and the watchdog
    int world_size = 0;
};
State& state();

/// Reads MPIML_* settings; throws mpiml::Error on a malformed value.
void read_environment(State& s);

/// The kinds of collective, for checks, the watchdog and profiles.
enum class Kind : std::int64_t { allreduce = 1, broadcast, allgather, barrier };
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
    std::optional<ProfileMark> profile_;
};

// Profiler (profile.cpp).
void profile_collective(const ProfileMark& mark);
/// Starts profiling at initialization when MPIML_PROFILE=DIR is set (not collective).
void profile_from_environment();
/// Stops profiling without writing anything (the parent process of mpi_fork).
void profile_discard();

// Watchdog (watchdog.cpp).
void watchdog_arm(const CallInfo& info, std::uint64_t seq);
void watchdog_disarm();
/// Marks entry into a world collective (for "ranks that never arrived").
void arrival_mark(std::uint64_t world_seq);

/// Cross-rank agreement in one MPI_MAX allreduce of x and ~x (plain MPI, no
/// checks or profile): true on every rank when every rank passed the same n
/// values; lo/hi, when given, receive each value's minimum and maximum.
bool agree(const std::int64_t* x, int n, MPI_Comm comm, const char* call,
           std::int64_t* lo = nullptr, std::int64_t* hi = nullptr);

/// "rank 2" or "ranks 0, 3" (error.cpp).
std::string rank_list(const std::vector<int>& ranks);
/// The body of a mismatch message, the same on every rank: ranks grouped by
/// what each has, `first`'s group first, e.g. "ranks 0, 2 called X; rank 1 called Y".
std::string group_ranks(const std::vector<std::string>& per_rank, int first, const char* verb_one,
                        const char* verb_many);

// Cross-rank mismatch check (collectives.cpp); throws on every rank.
void check_consistent(const CallInfo& info, std::uint64_t seq);

/// Cleanup run before MPI_Finalize (attribute delete callback on MPI_COMM_SELF).
void register_finalize_hook(void (*fn)());

}  // namespace mpiml::detail
