// The type-erased collective core: every mpiml collective goes through here.
#include "core/agreement.hpp"
#include "core/call.hpp"
#include "core/exit_guard.hpp"
#include "core/profile_hooks.hpp"
#include "core/report.hpp"
#include "core/state.hpp"
#include "core/op.hpp"
#include "core/types.hpp"
#include "core/arrival.hpp"
#include "core/watchdog.hpp"
#include "core/backend.hpp"

#include <mpiml/collectives.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <functional>
#include <thread>
#include <climits>
#include <cstdio>
#include <cstring>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <sched.h>

namespace mpiml {

namespace detail {
namespace {

int op_id(const ReduceOp& op) { return op.known() ? static_cast<int>(*op.known()) : 99; }

// Built-in datatypes by their registry id, the same on every rank.
int type_id(MPI_Datatype t) {
    const TypeInfo* e = find_type(t);
    return e ? e->id : 99;
}

MPI_Datatype type_of_id(std::int64_t id) {
    const TypeInfo* e = type_by_id(id);
    return e ? e->type : MPI_DATATYPE_NULL;
}

int seq_keyval = MPI_KEYVAL_INVALID;
int delete_seq(MPI_Comm, int, void* value, void*) {
    delete static_cast<CommUse*>(value);
    return MPI_SUCCESS;
}

// This thread's tag in CommUse::owner (never 0).
std::uintptr_t thread_tag() {
    thread_local char tag;
    return reinterpret_cast<std::uintptr_t>(&tag);
}

// Every rank is a member (the exit guard's concern).
bool spans_world(MPI_Comm comm) {
    if (comm == MPI_COMM_WORLD) return true;
    int n = 0;
    return MPI_Comm_size(comm, &n) == MPI_SUCCESS && n == state().world_size;
}


void check_root(int root, MPI_Comm comm, const char* call) {
    int size = 0;
    check_mpi(MPI_Comm_size(comm, &size), call);
    if (root < 0 || root >= size)
        fail(call, "root " + std::to_string(root) + " is out of range for a communicator of " +
                       std::to_string(size) + " ranks");
}

}  // namespace

void check_op(const ReduceOp& op, TypeClass cls, MPI_Datatype type, const char* call) {
    if (op.native() == MPI_OP_NULL) fail(call, "operation is MPI_OP_NULL");
    if (!op.known()) return;  // user-defined: MPI decides
    if (!op_allowed(*op.known(), cls))
        fail(call, std::string("operation '") + op.name() + "' is not defined for element type " +
                       datatype_name(type));
}

const char* kind_name(Kind k) {
    switch (k) {
        case Kind::allreduce: return "allreduce";
        case Kind::broadcast: return "broadcast";
        case Kind::allgather: return "allgather";
        case Kind::barrier: return "barrier";
        case Kind::other: break;
    }
    return "collective";
}

std::string describe(const CallInfo& c) {
    std::string s = kind_name(c.kind);
    if (c.kind == Kind::barrier) return s;
    s += "(count=" + std::to_string(c.count) + ", type=" + datatype_name(c.type);
    if (c.op_id >= 0)
        s += std::string(", op=") + (c.op_id < static_cast<int>(op_count) ? op_name(static_cast<Op>(c.op_id)) : "user-defined");
    if (c.root >= 0) s += ", root=" + std::to_string(c.root);
    return s + ")";
}

CommUse* comm_use(MPI_Comm comm) {
    // MPI_COMM_WORLD's, found once: Open MPI's attribute lookup takes a lock,
    // a third of a small collective's own cost.
    static std::atomic<CommUse*> world{nullptr};
    if (comm == MPI_COMM_WORLD)
        if (CommUse* w = world.load(std::memory_order_acquire)) return w;
    static std::mutex create;
    static std::atomic<bool> keyval_made{false};
    if (!keyval_made.load(std::memory_order_acquire)) {
        std::lock_guard lk(create);
        if (seq_keyval == MPI_KEYVAL_INVALID)
            check_mpi(MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, delete_seq, &seq_keyval, nullptr),
                      "MPI_Comm_create_keyval");
        keyval_made.store(true, std::memory_order_release);
    }
    void* v = nullptr;
    int flag = 0;
    check_mpi(MPI_Comm_get_attr(comm, seq_keyval, &v, &flag), "MPI_Comm_get_attr");
    if (!flag) {
        std::lock_guard lk(create);  // two threads' first collectives on comm
        check_mpi(MPI_Comm_get_attr(comm, seq_keyval, &v, &flag), "MPI_Comm_get_attr");
        if (!flag) {
            auto* use = new CommUse;
            const int rc = MPI_Comm_set_attr(comm, seq_keyval, use);
            if (rc != MPI_SUCCESS) delete use;
            check_mpi(rc, "MPI_Comm_set_attr");
            v = use;
        }
    }
    if (comm == MPI_COMM_WORLD) world.store(static_cast<CommUse*>(v), std::memory_order_release);
    return static_cast<CommUse*>(v);
}

std::uint64_t claim_comm(Kind kind, MPI_Comm comm, const char* call, CommUse*& held) {
    CommUse* use = comm_use(comm);
    const std::uintptr_t me = thread_tag();
    std::uintptr_t owner = 0;
    if (!use->owner.compare_exchange_strong(owner, me, std::memory_order_acquire,
                                            std::memory_order_acquire)) {
        if (owner != me) {
            const std::uint64_t what = use->what.load(std::memory_order_relaxed);
            fail(call, std::string("another thread of this rank is inside ") +
                           kind_name(static_cast<Kind>(what & 0xff)) +
                           (what >> 8 ? " #" + std::to_string(what >> 8) : std::string()) +
                           " on this communicator: collectives on a communicator must come "
                           "from one thread at a time, in the same order on every rank "
                           "(give each thread a communicator of its own: MPI_Comm_dup)");
        }
        held = nullptr;  // nested on this thread: the outer collective holds it
        if (!use->broken.empty()) fail(call, use->broken);
        return ++use->seq;
    }
    if (!use->broken.empty()) {
        const std::string why = use->broken;
        use->owner.store(0, std::memory_order_release);
        fail(call, why);
    }
    held = use;
    const std::uint64_t seq = ++use->seq;
    use->what.store((seq << 8) | static_cast<std::uint64_t>(kind), std::memory_order_relaxed);
    return seq;
}

void release_comm(CommUse*& held) {
    if (!held) return;
    held->what.store(0, std::memory_order_relaxed);
    held->owner.store(0, std::memory_order_release);
    held = nullptr;
}

namespace {
std::atomic<std::uint64_t> agreement_round_count{0};

// A worker's wait for the others (AgreeWait::poll): spins for kSpinPolls
// tests, then yields its core for kYieldTime (to this process's other threads
// or another rank when one is runnable), then naps 10-200 us.
constexpr int kSpinPolls = 200;
constexpr auto kYieldTime = std::chrono::microseconds(500);

void wait_politely(MPI_Request& req, const char* call) {
    using Clock = std::chrono::steady_clock;
    int done = 0;
    auto nap = std::chrono::microseconds(10);
    Clock::time_point yielding;
    for (int polls = 0;; ++polls) {
        check_mpi(MPI_Test(&req, &done, MPI_STATUS_IGNORE), call);
        if (done) return;
        if (polls < kSpinPolls) continue;
        if (polls == kSpinPolls) yielding = Clock::now();
        if (Clock::now() - yielding < kYieldTime) {
            sched_yield();
        } else {
            std::this_thread::sleep_for(nap);
            nap = std::min(nap * 2, std::chrono::microseconds(200));
        }
    }
}
}  // namespace

std::uint64_t agreement_rounds() { return agreement_round_count.load(std::memory_order_relaxed); }

bool agree(const std::int64_t* x, int n, MPI_Comm comm, const char* call, std::int64_t* lo,
           std::int64_t* hi, AgreeWait wait) {
    agreement_round_count.fetch_add(1, std::memory_order_relaxed);
    // max(~x) = ~min(x): minima and maxima in one reduction, no overflow.
    std::int64_t small[16];
    std::vector<std::int64_t> large;
    std::int64_t* buf = small;
    if (2 * n > 16) {
        large.resize(2 * static_cast<std::size_t>(n));
        buf = large.data();
    }
    for (int i = 0; i < n; ++i) {
        buf[i] = x[i];
        buf[n + i] = ~x[i];
    }
    if (wait == AgreeWait::block) {
        check_mpi(MPI_Allreduce(MPI_IN_PLACE, buf, 2 * n, MPI_INT64_T, MPI_MAX, comm), call);
    } else {
        MPI_Request req = MPI_REQUEST_NULL;
        check_mpi(MPI_Iallreduce(MPI_IN_PLACE, buf, 2 * n, MPI_INT64_T, MPI_MAX, comm, &req), call);
        wait_politely(req, call);
    }
    bool same = true;
    for (int i = 0; i < n; ++i) {
        same = same && buf[i] == ~buf[n + i];
        if (lo) lo[i] = ~buf[n + i];
        if (hi) hi[i] = buf[i];
    }
    return same;
}

void check_agreement(const std::int64_t* sig, int n, MPI_Comm comm, const char* call,
                     std::uint64_t seq, const std::function<std::string(const std::int64_t*)>& describe,
                     AgreeWait wait) {
    if (agree(sig, n, comm, call, nullptr, nullptr, wait)) return;
    // Every rank saw the mismatch: gather who called what, and say so.
    int size = 0;
    check_mpi(MPI_Comm_size(comm, &size), call);
    std::vector<std::int64_t> all(static_cast<std::size_t>(n) * size);
    check_mpi(MPI_Allgather(sig, n, MPI_INT64_T, all.data(), n, MPI_INT64_T, comm), call);
    // and from where (each rank's call site, cut to a fixed length)
    constexpr int site_len = 256;
    char site[site_len] = {};
    std::snprintf(site, sizeof site, "%s", site_text(current_site()).c_str());
    std::vector<char> sites(static_cast<std::size_t>(site_len) * size);
    check_mpi(MPI_Allgather(site, site_len, MPI_CHAR, sites.data(), site_len, MPI_CHAR, comm), call);
    std::vector<std::string> called(static_cast<std::size_t>(size));
    for (int r = 0; r < size; ++r) {
        called[r] = describe(all.data() + static_cast<std::size_t>(r) * n);
        const char* at = sites.data() + static_cast<std::size_t>(r) * site_len;
        if (at[0]) called[r] += std::string(" at ") + std::string(at, strnlen(at, site_len));
    }
    fail(call, "mismatched collectives (call #" + std::to_string(seq) +
                   " on this communicator): " + group_ranks(called, 0, "called", "called"));
}

namespace {
// What every rank must pass alike: the check's round compares these.
constexpr int kSigLen = 5;
std::array<std::int64_t, kSigLen> signature(const CallInfo& info) {
    return {static_cast<std::int64_t>(info.kind), static_cast<std::int64_t>(info.count),
            type_id(info.type), info.op_id, info.root};
}
}  // namespace

void check_consistent(const CallInfo& info, std::uint64_t seq) {
    const auto sig = signature(info);
    check_agreement(sig.data(), kSigLen, info.comm, info.call, seq, [&info](const std::int64_t* s) {
        CallInfo c = info;
        c.kind = static_cast<Kind>(s[0]);
        c.count = static_cast<std::size_t>(s[1]);
        c.type = type_of_id(s[2]);
        c.op_id = static_cast<int>(s[3]);
        c.root = static_cast<int>(s[4]);
        return describe(c);
    });
}

namespace {
// The door collective running on this thread, if any: core calls inside it
// on its communicator are part of it (no second round, watch or mark).
thread_local const DoorScope* t_door = nullptr;

Kind door_kind(int kind) {
    return kind >= static_cast<int>(Kind::allreduce) && kind <= static_cast<int>(Kind::other)
               ? static_cast<Kind>(kind)
               : Kind::other;
}
}  // namespace

namespace {
// Every rank counts and marks every collective whatever its own settings,
// which may differ between ranks: the sequence numbers and the world set-up
// (collective, on the first collective spanning every rank when another
// library initialized MPI) may not. The watch is armed between the two
// steps, so a rank that never comes to the set-up is a hang like any other.
std::uint64_t begin_collective(Kind kind, MPI_Comm comm, const char* call, CommUse*& held) {
    if (injecting()) inject_on_collective();
    return claim_comm(kind, comm, call, held);
}

// marked: on the exit guard's board.
void enter_collective(Kind kind, std::uint64_t seq, MPI_Comm comm, bool& marked) {
    if (!collective_entered(kind, seq))
        fail(kind_name(kind), "MPI is being finalized (another thread is ending the process)");
    if (spans_world(comm)) {
        world_setup_on_entry(kind, seq);
        if (comm == MPI_COMM_WORLD) arrival_mark(seq);
        if (exit_guard_ready()) {
            exit_mark_enter(kind, seq);
            marked = true;
        }
    }
}

// history: the entry's token, never 0 once entered.
void leave_collective(bool& marked, std::uint64_t& watch, std::uint64_t& history, CommUse*& held) {
    if (history) collective_left();
    history_leave(history);
    history = 0;
    if (marked && exit_guard_ready()) exit_mark_leave();
    marked = false;
    watchdog_disarm(watch);
    watch = 0;
    release_comm(held);
}
}  // namespace

CollectiveScope::CollectiveScope(const CallInfo& info) {
    const bool prof = profile_on.load(std::memory_order_relaxed);
    if (t_door && t_door->comm_ == info.comm) {
        // Inside a door's collective: it has counted, marked, watched and
        // checked (or not: then calls MPI carries check, PathCheck); the
        // profile records this call with the door's start.
        check_mpi_path_ = !t_door->checked_;
        seq_ = t_door->seq_;
        if (prof)
            profile_ = ProfileMark{info, t_door->seq_, t_door->t0_, t_door->check_ns_,
                                   profile_generation.load(std::memory_order_relaxed)};
        return;
    }
    const auto& s = state();
    const bool check = s.check.load(std::memory_order_relaxed);
    check_mpi_path_ = !check;
    const bool timed = s.timeout.load(std::memory_order_relaxed) > 0;
    const std::int64_t t0 = prof ? profile_now() : 0;
    const std::uint64_t seq = begin_collective(info.kind, info.comm, info.call, use_);
    seq_ = seq;
    if (timed) watch_ = watchdog_arm(Watched{info, seq, 0, {}, {}});
    try {
        enter_collective(info.kind, seq, info.comm, marked_);
    } catch (...) {
        watchdog_disarm(watch_);
        release_comm(use_);
        throw;
    }
    history_ = history_enter(info, seq);
    if (!check && !timed && !prof) return;
    if (check) {
        try {
            check_consistent(info, seq);
        } catch (...) {
            leave_collective(marked_, watch_, history_, use_);
            throw;
        }
    }
    if (prof)
        profile_ = ProfileMark{info, seq, t0, check ? profile_now() - t0 : -1,
                               profile_generation.load(std::memory_order_relaxed)};
}

CollectiveScope::~CollectiveScope() {
    leave_collective(marked_, watch_, history_, use_);
    if (profile_) profile_collective(*profile_);
}

DoorScope::DoorScope(const DoorCall& d) : comm_(d.comm), outer_(t_door) {
    const auto& s = state();
    const bool check = d.check || s.check.load(std::memory_order_relaxed);
    const bool timed = d.timeout > 0 || s.timeout.load(std::memory_order_relaxed) > 0;
    t0_ = profile_on.load(std::memory_order_relaxed) ? profile_now() : 0;
    const Kind kind = door_kind(d.kind);
    seq_ = begin_collective(kind, d.comm, d.call, use_);
    if (timed)
        watch_ = watchdog_arm(
            Watched{{kind, d.call, 0, MPI_DATATYPE_NULL, -1, -1, d.comm}, seq_, d.timeout, d.call, d.where});
    try {
        enter_collective(kind, seq_, d.comm, marked_);
    } catch (...) {
        watchdog_disarm(watch_);
        release_comm(use_);
        throw;
    }
    history_ = history_enter({kind, d.call, 0, MPI_DATATYPE_NULL, -1, -1, d.comm}, seq_);
    if (check && d.nsig > 0) {
        try {
            check_agreement(d.sig, d.nsig, d.comm, d.call, seq_, d.describe, AgreeWait::poll);
        } catch (...) {
            leave_collective(marked_, watch_, history_, use_);
            throw;
        }
        checked_ = true;
        if (t0_) check_ns_ = profile_now() - t0_;
    }
    t_door = this;
}

DoorScope::~DoorScope() {
    if (t_door == this) t_door = outer_;
    leave_collective(marked_, watch_, history_, use_);
}

DoorWatch::DoorWatch(std::string call, double timeout, std::string where) {
    if (timeout > 0 || state().timeout.load(std::memory_order_relaxed) > 0)
        id_ = watchdog_arm(Watched{{Kind::other, "", 0, MPI_DATATYPE_NULL, -1, -1, MPI_COMM_NULL}, 0,
                                   timeout, std::move(call), std::move(where)});
}

DoorWatch::~DoorWatch() { watchdog_disarm(id_); }

namespace {
// Whether every rank of comm runs on one host (collective the first time on
// comm; the same answer on every rank).
bool on_one_host(MPI_Comm comm, const char* call) {
    CommUse* use = comm_use(comm);
    if (use->one_host < 0) {
        MPI_Comm host = MPI_COMM_NULL;
        check_mpi(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &host), call);
        int n = 0, all = 0;
        MPI_Comm_size(host, &n);
        MPI_Comm_free(&host);
        check_mpi(MPI_Comm_size(comm, &all), call);
        use->one_host = n == all;
    }
    return use->one_host == 1;
}

// A call MPI carries without MPIML_CHECK still compares the ranks' arguments
// in the check's agreement round. On one host the check runs before the call
// (one small allreduce, cheaper there than a nonblocking one). Across hosts
// the round is posted as a nonblocking allreduce before the call and waited
// after it, its round trips beside the call's; on a mismatch MPI's result is
// not valid (a partial result, or MPI's truncation error on some ranks), and
// every rank that returns from the call throws instead. (A round after the
// call would not do: a rank that MPI's call failed early would meet the
// others' call with it.)
class PathCheck {
public:
    PathCheck(const CollectiveScope& scope, const CallInfo& info) : info_(info) {
        if (!scope.checks_mpi_path()) return;
        int size = 1;
        check_mpi(MPI_Comm_size(info.comm, &size), info.call);
        if (size < 2) return;
        const auto sig = signature(info);
        for (int i = 0; i < kN; ++i) {
            buf_[i] = sig[i];
            buf_[kN + i] = ~sig[i];
        }
        if (on_one_host(info.comm, info.call)) {
            check_consistent(info, scope.seq());
            return;
        }
        on_ = true;
        check_mpi(MPI_Iallreduce(MPI_IN_PLACE, buf_, 2 * kN, MPI_INT64_T, MPI_MAX, info.comm, &req_),
                  info.call);
        agreement_round_count.fetch_add(1, std::memory_order_relaxed);
    }
    ~PathCheck() {
        if (req_ != MPI_REQUEST_NULL) MPI_Wait(&req_, MPI_STATUS_IGNORE);
    }
    PathCheck(const PathCheck&) = delete;
    PathCheck& operator=(const PathCheck&) = delete;

    template <class F>
    void run(F&& call) {
        if (!on_) return call();
        try {
            call();
        } catch (const Error& e) {
            // mpiml's own error (not MPI's) came before any data moved: it
            // stands, and the communicator stays usable.
            const bool mpi = e.mpi_code() != 0;
            std::string m;
            try {
                m = finish(mpi);
            } catch (const std::exception&) {  // the wait failed too: the call's error
            }
            if (mpi && !m.empty()) {
                char text[MPI_MAX_ERROR_STRING] = {};
                int len = 0;
                if (MPI_Error_string(e.mpi_code(), text, &len) != MPI_SUCCESS) len = 0;
                fail(info_.call, m + " (MPI's call failed: " + std::string(text, len) + ")");
            }
            throw;
        } catch (...) {
            try {
                finish(false);
            } catch (const std::exception&) {
            }
            throw;
        }
        if (std::string m = finish(true); !m.empty()) fail(info_.call, m);
    }

private:
    static constexpr int kN = kSigLen;
    // "" when every rank passed the same arguments, else what differs;
    // `close`: then no collective runs on the communicator again.
    std::string finish(bool close) {
        wait_politely(req_, info_.call);
        std::string diff;
        const auto add = [&diff](const std::string& what, const std::string& lo, const std::string& hi) {
            diff += (diff.empty() ? "" : ", ") + what + " " + lo + " on one rank, " + hi + " on another";
        };
        const auto lo = [this](int i) { return ~buf_[kN + i]; };
        const auto hi = [this](int i) { return buf_[i]; };
        if (lo(0) != hi(0))
            add("calls", kind_name(static_cast<Kind>(lo(0))), kind_name(static_cast<Kind>(hi(0))));
        if (lo(1) != hi(1)) add("count", std::to_string(lo(1)), std::to_string(hi(1)));
        if (lo(2) != hi(2)) add("type", datatype_name(type_of_id(lo(2))), datatype_name(type_of_id(hi(2))));
        const auto op_text = [](std::int64_t id) {
            return id >= 0 && id < static_cast<std::int64_t>(op_count) ? std::string(op_name(static_cast<Op>(id)))
                                                                       : std::string("user-defined");
        };
        if (lo(3) != hi(3)) add("op", op_text(lo(3)), op_text(hi(3)));
        if (lo(4) != hi(4)) add("root", std::to_string(lo(4)), std::to_string(hi(4)));
        if (diff.empty() || !close) return diff;
        // MPI's messages of the call may be left unmatched, to be taken by a
        // later one: no collective runs on the communicator again.
        comm_use(info_.comm)->broken =
            "an earlier call on this communicator had mismatched arguments on MPI's path (" + diff +
            ") and may have left MPI's messages out of step: no collective can run on it again";
        return "mismatched calls on MPI's path, found after the call (its result is not valid): " + diff +
               "; this rank called " + describe(info_) +
               "; no collective can run on this communicator again (MPIML_CHECK=1 checks before "
               "each call, names each rank's call and leaves the communicator usable)";
    }
    const CallInfo info_;
    std::int64_t buf_[2 * kN] = {};
    MPI_Request req_ = MPI_REQUEST_NULL;
    bool on_ = false;  // compares after the call
};
}  // namespace

void allreduce(const void* send, void* recv, std::size_t count, MPI_Datatype type, TypeClass cls,
               const ReduceOp& op, MPI_Comm comm, const char* call) {
    ensure_initialized(call);
    check_op(op, cls, type, call);
    if (count > 0 && recv == nullptr) fail(call, "recv buffer is null");
    int tsize = 0;
    check_mpi(MPI_Type_size(type, &tsize), call);
    const auto bytes = count * static_cast<std::size_t>(tsize);
    if (send == recv) send = MPI_IN_PLACE;
    if (send != MPI_IN_PLACE && count > 0) {
        if (send == nullptr) fail(call, "send buffer is null");
        const auto* s = static_cast<const char*>(send);
        const auto* r = static_cast<const char*>(recv);
        if (s < r + bytes && r < s + bytes)
            fail(call, "send and recv buffers overlap; use the in-place overload");
    }
    const CallInfo info{Kind::allreduce, call, count, type, op_id(op), -1, comm};
    CollectiveScope scope(info);
    if (shm_allreduce(send, recv, count, type, bytes, op, comm, call)) return;
    PathCheck(scope, info).run([&] { mpi_allreduce(send, recv, count, type, tsize, op, comm, call); });
}

void average(void* buf, std::size_t count, MPI_Datatype type, MPI_Comm comm, const char* call) {
    ensure_initialized(call);
    const TypeInfo* info = find_type(type);
    if (!info || (info->cls != TypeClass::floating && info->cls != TypeClass::complex))
        fail(call, std::string("averaging needs a floating or complex type, not ") +
                       datatype_name(type));
    if (count > 0 && buf == nullptr) fail(call, "buffer is null");
    int tsize = 0;
    check_mpi(MPI_Type_size(type, &tsize), call);
    const CallInfo what{Kind::allreduce, call, count, type, op_id(Op::sum), -1, comm};
    CollectiveScope scope(what);
    if (shm_average(buf, count, type, comm, call)) return;
    PathCheck(scope, what).run([&] { mpi_average(buf, count, type, tsize, comm, call); });
}

void broadcast(void* buf, std::size_t count, MPI_Datatype type, int root, MPI_Comm comm,
               const char* call) {
    ensure_initialized(call);
    check_root(root, comm, call);
    if (count > 0 && buf == nullptr) fail(call, "buffer is null");
    int tsize = 0;
    check_mpi(MPI_Type_size(type, &tsize), call);
    const CallInfo info{Kind::broadcast, call, count, type, -1, root, comm};
    CollectiveScope scope(info);
    if (shm_broadcast(buf, count, type, tsize, root, comm, call)) return;
    PathCheck(scope, info).run([&] { mpi_broadcast(buf, count, type, tsize, root, comm, call); });
}

void allgather(const void* send, void* recv, std::size_t count, MPI_Datatype type,
               MPI_Comm comm, const char* call) {
    ensure_initialized(call);
    if (count > static_cast<std::size_t>(INT_MAX))
        fail(call, "more than INT_MAX elements per rank");
    const CallInfo info{Kind::allgather, call, count, type, -1, -1, comm};
    CollectiveScope scope(info);
    PathCheck(scope, info).run([&] { mpi_allgather(send, recv, count, type, comm, call); });
}

void barrier(MPI_Comm comm, const char* call) {
    ensure_initialized(call);
    CollectiveScope scope({Kind::barrier, call, 0, MPI_DATATYPE_NULL, -1, -1, comm});
    mpi_barrier(comm, call);
}

}  // namespace detail

void barrier(Comm comm, std::source_location loc) {
    detail::SiteMark site(loc);
    detail::barrier(comm.get("mpiml::barrier"), "mpiml::barrier");
}

void broadcast(std::string& s, int root, Comm comm, std::source_location loc) {
    detail::SiteMark site(loc);
    const MPI_Comm c = comm.get("mpiml::broadcast");
    unsigned long long n = s.size();
    detail::broadcast(&n, 1, MPI_UNSIGNED_LONG_LONG, root, c, "mpiml::broadcast");
    s.resize(n);
    detail::broadcast(s.data(), s.size(), MPI_CHAR, root, c, "mpiml::broadcast");
}

}  // namespace mpiml
