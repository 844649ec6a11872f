// The type-erased collective core: every mpiml collective goes through here.
#include "core/agreement.hpp"
#include "core/call.hpp"
#include "core/exit_guard.hpp"
#include "core/profile_hooks.hpp"
#include "core/state.hpp"
#include "core/op.hpp"
#include "core/types.hpp"
#include "core/watchdog.hpp"
#include "core/backend.hpp"

#include <mpiml/collectives.hpp>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

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
    delete static_cast<std::uint64_t*>(value);
    return MPI_SUCCESS;
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

std::uint64_t next_sequence(MPI_Comm comm) {
    if (seq_keyval == MPI_KEYVAL_INVALID)
        check_mpi(MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, delete_seq, &seq_keyval, nullptr),
                  "MPI_Comm_create_keyval");
    void* v = nullptr;
    int flag = 0;
    check_mpi(MPI_Comm_get_attr(comm, seq_keyval, &v, &flag), "MPI_Comm_get_attr");
    if (!flag) {
        auto* counter = new std::uint64_t(0);
        const int rc = MPI_Comm_set_attr(comm, seq_keyval, counter);
        if (rc != MPI_SUCCESS) delete counter;
        check_mpi(rc, "MPI_Comm_set_attr");
        v = counter;
    }
    return ++*static_cast<std::uint64_t*>(v);
}

bool agree(const std::int64_t* x, int n, MPI_Comm comm, const char* call, std::int64_t* lo,
           std::int64_t* hi) {
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
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, buf, 2 * n, MPI_INT64_T, MPI_MAX, comm), call);
    bool same = true;
    for (int i = 0; i < n; ++i) {
        same = same && buf[i] == ~buf[n + i];
        if (lo) lo[i] = ~buf[n + i];
        if (hi) hi[i] = buf[i];
    }
    return same;
}

void check_consistent(const CallInfo& info, std::uint64_t seq) {
    constexpr int n = 5;
    const std::int64_t sig[n] = {static_cast<std::int64_t>(info.kind),
                                 static_cast<std::int64_t>(info.count), type_id(info.type),
                                 info.op_id, info.root};
    if (agree(sig, n, info.comm, info.call)) return;

    // Every rank saw the mismatch: gather who called what, and say so.
    int size = 0;
    check_mpi(MPI_Comm_size(info.comm, &size), info.call);
    std::vector<std::int64_t> all(static_cast<std::size_t>(n) * size);
    check_mpi(MPI_Allgather(sig, n, MPI_INT64_T, all.data(), n, MPI_INT64_T, info.comm),
              info.call);
    std::vector<std::string> called(static_cast<std::size_t>(size));
    for (int r = 0; r < size; ++r) {
        const std::int64_t* s = all.data() + static_cast<std::size_t>(r) * n;
        CallInfo c = info;
        c.kind = static_cast<Kind>(s[0]);
        c.count = static_cast<std::size_t>(s[1]);
        c.op_id = static_cast<int>(s[3]);
        c.root = static_cast<int>(s[4]);
        c.type = type_of_id(s[2]);
        called[r] = describe(c);
    }
    const std::string text = "mismatched collectives (call #" + std::to_string(seq) +
                             " on this communicator): " + group_ranks(called, 0, "called", "called");
    fail(info.call, text);
}

CollectiveScope::CollectiveScope(const CallInfo& info) {
    const auto& s = state();
    const bool prof = profile_on.load(std::memory_order_relaxed);
    const bool check = s.check.load(std::memory_order_relaxed);
    const bool timed = s.timeout.load(std::memory_order_relaxed) > 0;
    const std::int64_t t0 = prof ? profile_now() : 0;
    if (injecting()) inject_on_collective();
    // Every rank counts and marks every collective whatever its own settings,
    // which may differ between ranks: the sequence numbers and the arrival
    // board (set up collectively on the first world collective) may not.
    const std::uint64_t seq = next_sequence(info.comm);
    if (info.comm == MPI_COMM_WORLD) arrival_mark(seq);
    if (spans_world(info.comm)) {
        exit_guard_setup();
        if (exit_guard_ready()) {
            exit_mark_enter(info.kind, seq);
            marked_ = true;
        }
    }
    if (!check && !timed && !prof) return;
    if (timed) {
        watchdog_arm(info, seq);
        armed_ = true;
    }
    if (check) {
        try {
            check_consistent(info, seq);
        } catch (...) {
            if (armed_) watchdog_disarm();
            throw;
        }
    }
    if (prof)
        profile_ = ProfileMark{info, seq, t0, check ? profile_now() - t0 : -1,
                               profile_generation.load(std::memory_order_relaxed)};
}

ExitMark::ExitMark(int kind, MPI_Comm comm, std::uint64_t seq) {
    if (!spans_world(comm)) return;
    exit_guard_setup();
    if (!exit_guard_ready()) return;
    const bool known = kind >= static_cast<int>(Kind::allreduce) && kind <= static_cast<int>(Kind::other);
    exit_mark_enter(known ? static_cast<Kind>(kind) : Kind::other, seq);
    marked_ = true;
}

ExitMark::~ExitMark() {
    if (marked_ && exit_guard_ready()) exit_mark_leave();
}

CollectiveScope::~CollectiveScope() {
    if (marked_ && exit_guard_ready()) exit_mark_leave();
    if (armed_) watchdog_disarm();
    if (profile_) profile_collective(*profile_);
}

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
    CollectiveScope scope({Kind::allreduce, call, count, type, op_id(op), -1, comm});
    if (shm_allreduce(send, recv, count, type, bytes, op, comm, call)) return;
    mpi_allreduce(send, recv, count, type, tsize, op, comm, call);
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
    CollectiveScope scope({Kind::allreduce, call, count, type, op_id(Op::sum), -1, comm});
    if (shm_average(buf, count, type, comm, call)) return;
    mpi_average(buf, count, type, tsize, comm, call);
}

void broadcast(void* buf, std::size_t count, MPI_Datatype type, int root, MPI_Comm comm,
               const char* call) {
    ensure_initialized(call);
    check_root(root, comm, call);
    if (count > 0 && buf == nullptr) fail(call, "buffer is null");
    int tsize = 0;
    check_mpi(MPI_Type_size(type, &tsize), call);
    CollectiveScope scope({Kind::broadcast, call, count, type, -1, root, comm});
    if (shm_broadcast(buf, count, type, tsize, root, comm, call)) return;
    mpi_broadcast(buf, count, type, tsize, root, comm, call);
}

void allgather(const void* send, void* recv, std::size_t count, MPI_Datatype type,
               MPI_Comm comm, const char* call) {
    ensure_initialized(call);
    if (count > static_cast<std::size_t>(INT_MAX))
        fail(call, "more than INT_MAX elements per rank");
    CollectiveScope scope({Kind::allgather, call, count, type, -1, -1, comm});
    mpi_allgather(send, recv, count, type, comm, call);
}

void barrier(MPI_Comm comm, const char* call) {
    ensure_initialized(call);
    CollectiveScope scope({Kind::barrier, call, 0, MPI_DATATYPE_NULL, -1, -1, comm});
    mpi_barrier(comm, call);
}

}  // namespace detail

void barrier(Comm comm) { detail::barrier(comm.get("mpiml::barrier"), "mpiml::barrier"); }

void broadcast(std::string& s, int root, Comm comm) {
    const MPI_Comm c = comm.get("mpiml::broadcast");
    unsigned long long n = s.size();
    detail::broadcast(&n, 1, MPI_UNSIGNED_LONG_LONG, root, c, "mpiml::broadcast");
    s.resize(n);
    detail::broadcast(s.data(), s.size(), MPI_CHAR, root, c, "mpiml::broadcast");
}

}  // namespace mpiml
