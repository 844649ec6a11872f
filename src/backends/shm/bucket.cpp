// SharedBucket: a per-rank buffer in node-shared memory, reduced in place.
// Built-in ops reduce slices of the peers' buckets directly; everything else
// goes through mpiml's core (detail::allreduce).
#include "algorithms.hpp"

#include "core/agreement.hpp"
#include "core/backend.hpp"
#include "core/call.hpp"
#include "core/state.hpp"
#include "core/types.hpp"

#include <mpiml/error.hpp>
#include <mpiml/shm.hpp>

#include <atomic>
#include <cstring>
#include <exception>
#include <mutex>
#include <unordered_map>
#include <string>
#include <vector>

namespace mpiml {
namespace detail {
namespace {

/// A live bucket's memory, as the backend reduces it in place. The fields
/// survive moves of the SharedBucket (the context and peer table stay put).
struct BucketMem {
    ShmContext* ctx;
    void* const* peers;
    std::size_t bytes;
    MPI_Comm comm;
};
std::mutex bucket_mutex;
std::atomic<std::size_t> bucket_count{0};
std::unordered_map<const void*, BucketMem>& bucket_memory() {
    static auto* m = new std::unordered_map<const void*, BucketMem>;
    return *m;
}

}  // namespace

void forget_bucket_memory() {
    std::lock_guard lock(bucket_mutex);
    bucket_memory().clear();
    bucket_count.store(0, std::memory_order_relaxed);
}

bool bucket_reduce(void* data, std::size_t count, MPI_Datatype type, const ReduceOp& op,
                   bool average, MPI_Comm comm, const char* call) {
    if (bucket_count.load(std::memory_order_relaxed) == 0 || !op.known()) return false;
    BucketMem b{};
    {
        std::lock_guard lock(bucket_mutex);
        const auto it = bucket_memory().find(data);
        if (it == bucket_memory().end()) return false;
        b = it->second;
    }
    if (b.comm != comm || !b.ctx->alive || config_ref().mode == shm::Mode::off) return false;
    const Kernel k = resolve(type, *op.known());
    if (!k.combine || (average && !k.divide)) return false;
    int tsize = 0;
    check_mpi(MPI_Type_size(type, &tsize), call);
    if (count * static_cast<std::size_t>(tsize) > b.bytes) return false;
    ShmContext& c = *b.ctx;
    Signature sig;
    sig.count = count;
    sig.bytes = count * static_cast<std::size_t>(tsize);
    sig.kind = average ? Signature::bucket_average : Signature::bucket_allreduce;
    sig.op = static_cast<std::uint8_t>(*op.known());
    sig.type = static_cast<std::uint16_t>(k.type_id);
    ++c.round;  // as every shared-memory collective (checked_barrier)
    if (count == 0) {  // still compared: a peer may have passed more
        checked_barrier(c, sig, call);
        return true;
    }
    // One round in place: every rank's bucket is both its input and where
    // the reduced slices land (algorithms.hpp: push_round, node_round).
    const int p = c.node_size;
    static thread_local std::vector<const char*> in;  // no allocation per call
    static thread_local std::vector<char*> res;
    in.resize(static_cast<std::size_t>(p));
    res.resize(static_cast<std::size_t>(p));
    for (int q = 0; q < p; ++q) {
        in[q] = static_cast<const char*>(b.peers[q]);
        res[q] = q == c.node_rank ? static_cast<char*>(data) : static_cast<char*>(b.peers[q]);
    }
    checked_barrier(c, sig, call);  // every rank's bucket is ready, and alike
    if (c.num_nodes == 1) {
        push_round(c, in.data(), res.data(), count, k, average ? c.size : 0);
        c.barrier();  // every slice is in every bucket
        return true;
    }
    node_round(c, in.data(), res.data(), static_cast<char*>(data), count, k,
               average ? c.size : 0, true, call);
    c.barrier();  // peers are done reading this bucket
    return true;
}

std::unique_ptr<SharedBucket> collective_memory(std::size_t bytes, MPI_Comm comm,
                                                const char* call) {
    ensure_initialized(call);
    if (!shm_takes(bytes, comm, call)) return nullptr;
    try {
        return std::make_unique<SharedBucket>(bytes, Comm(comm));
    } catch (const Error& e) {
        if (e.mpi_code() != 0) throw;
        // the bucket's size agreement, thrown on every rank alike
        fail(call, std::string("the models differ across ranks (their parameters, dtypes or which "
                               "have gradients; MPIML_CHECK=1 names the first that differs): ") +
                       e.what());
    }
}

bool shm_average(void* buf, std::size_t count, MPI_Datatype type, MPI_Comm comm,
                 const char* call) {
    return bucket_reduce(buf, count, type, Op::sum, true, comm, call);
}

}  // namespace detail

SharedBucket::SharedBucket(std::size_t bytes, Comm comm) {
    constexpr const char* call = "mpiml::SharedBucket";
    comm_ = comm.get(call);
    if (!detail::usable_comm(comm_)) detail::fail(call, "needs an intra-communicator");
    // Same size everywhere, or the reductions would read past a peer's bucket.
    const auto want = static_cast<std::int64_t>(bytes);
    std::int64_t lo = 0, hi = 0;
    if (!detail::agree(&want, 1, comm_, call, &lo, &hi))
        detail::fail(call, "ranks asked for different sizes (" + std::to_string(lo) + " to " +
                               std::to_string(hi) + " bytes)");
    ctx_ = detail::context(comm_, call);
    bytes_ = bytes;
    const std::size_t alloc = detail::kLine + std::max<std::size_t>(detail::kLine, (bytes + 63) / 64 * 64);
    MPI_Info info = detail::noncontig_info();
    void* base = nullptr;
    const int rc = MPI_Win_allocate_shared(static_cast<MPI_Aint>(alloc), 1, info, ctx_->node,
                                           &base, &win_);
    MPI_Info_free(&info);
    detail::check_mpi(rc, call);
    MPI_Win_set_errhandler(win_, MPI_ERRORS_RETURN);
    detail::check_mpi(MPI_Win_lock_all(MPI_MODE_NOCHECK, win_), call);
    data_ = detail::align_line(base);
    peers_ = std::make_unique<void*[]>(static_cast<std::size_t>(ctx_->node_size));
    for (int q = 0; q < ctx_->node_size; ++q) {
        MPI_Aint sz = 0;
        int disp = 0;
        detail::check_mpi(MPI_Win_shared_query(win_, q, &sz, &disp, &peers_[q]), call);
        peers_[q] = detail::align_line(peers_[q]);
    }
    id_ = detail::add_bucket_window(win_, detail::free_order_key(comm_, call));
    std::lock_guard lock(detail::bucket_mutex);
    detail::bucket_memory()[data_] = {ctx_.get(), peers_.get(), bytes_, comm_};
    detail::bucket_count.store(detail::bucket_memory().size(), std::memory_order_relaxed);
}

SharedBucket::~SharedBucket() { release(); }

SharedBucket::SharedBucket(SharedBucket&& o) noexcept
    : ctx_(std::move(o.ctx_)), comm_(o.comm_), win_(o.win_), bytes_(o.bytes_), data_(o.data_),
      peers_(std::move(o.peers_)), id_(o.id_) {
    o.win_ = MPI_WIN_NULL;
    o.data_ = nullptr;
    o.bytes_ = 0;
}

SharedBucket& SharedBucket::operator=(SharedBucket&& o) noexcept {
    if (this != &o) {
        release();
        ctx_ = std::move(o.ctx_);
        comm_ = o.comm_;
        win_ = o.win_;
        bytes_ = o.bytes_;
        data_ = o.data_;
        peers_ = std::move(o.peers_);
        id_ = o.id_;
        o.win_ = MPI_WIN_NULL;
        o.data_ = nullptr;
        o.bytes_ = 0;
    }
    return *this;
}

namespace detail {
namespace {
std::atomic<bool> frees_deferred{false};
thread_local int frees_agreed = 0;
thread_local int frees_deferred_here = 0;
}
void defer_collective_frees() noexcept { frees_deferred.store(true, std::memory_order_relaxed); }
bool collective_frees_deferred() noexcept {
    return frees_deferred_here > 0 || frees_deferred.load(std::memory_order_relaxed);
}
bool process_frees_deferred() noexcept { return frees_deferred.load(std::memory_order_relaxed); }
std::size_t shared_bucket_count() noexcept { return bucket_count.load(std::memory_order_relaxed); }
DeferFrees::DeferFrees() noexcept { ++frees_deferred_here; }
DeferFrees::~DeferFrees() { --frees_deferred_here; }
FreesAgreed::FreesAgreed() noexcept { ++frees_agreed; }
FreesAgreed::~FreesAgreed() { --frees_agreed; }

namespace {
/// Whether every rank of comm is releasing its bucket here: a small
/// allreduce mpiml tracks (a rank that destroys its bucket while the others
/// wait in another collective meets the mismatch check, the exit guard or
/// the watchdog, not a silent wait in MPI_Win_free). Not while an exception
/// unwinds this rank: the others are not releasing theirs, and finalize
/// frees it after the exit guard.
bool all_release(MPI_Comm comm) noexcept {
    if (std::uncaught_exceptions() > 0) return false;
    if (frees_agreed > 0) return true;  // the caller agreed
    int one = 1;
    try {
        allreduce(MPI_IN_PLACE, &one, 1, MPI_INT, TypeClass::integer, Op::min, comm,
                  "mpiml::SharedBucket::~SharedBucket");
    } catch (const std::exception&) {
        return false;  // finalize frees it; the others meet the same error or the exit guard
    }
    return one == 1;
}
}  // namespace
}  // namespace detail

void SharedBucket::release() noexcept {
    if (win_ == MPI_WIN_NULL) return;
    int finalized = 0;
    MPI_Finalized(&finalized);
    {
        std::lock_guard lock(detail::bucket_mutex);
        detail::bucket_memory().erase(data_);
        detail::bucket_count.store(detail::bucket_memory().size(), std::memory_order_relaxed);
    }
    // Else mpiml's finalize freed it, or frees it (deferred, or not agreed).
    if (!finalized && !detail::collective_frees_deferred() && detail::all_release(comm_) &&
        detail::remove_bucket_window(id_)) {
        MPI_Win_unlock_all(win_);
        MPI_Win_free(&win_);
    }
    win_ = MPI_WIN_NULL;
    data_ = nullptr;
}

void SharedBucket::allreduce(std::size_t count, MPI_Datatype type, const ReduceOp& op) {
    reduce(count, type, op, false, "mpiml::SharedBucket::allreduce");
}

void SharedBucket::allreduce(std::size_t count, MPI_Datatype type, TypeClass, const ReduceOp& op) {
    allreduce(count, type, op);
}

void SharedBucket::average(std::size_t count, MPI_Datatype type) {
    reduce(count, type, Op::sum, true, "mpiml::SharedBucket::average");
}

void SharedBucket::reduce(std::size_t count, MPI_Datatype type, const ReduceOp& op, bool average,
                          const char* call) {
    using namespace detail;
    ensure_initialized(call);
    if (win_ == MPI_WIN_NULL) fail(call, "the bucket has been released");
    if (!ctx_->alive) fail(call, "used after MPI finalization began");
    int tsize = 0;
    check_mpi(MPI_Type_size(type, &tsize), call);
    const std::size_t ts = static_cast<std::size_t>(tsize);
    if (count * ts > bytes_)
        fail(call, std::to_string(count) + " elements of " + datatype_name(type) + " need " +
                       std::to_string(count * ts) + " bytes; the bucket has " +
                       std::to_string(bytes_));
    // The core's legality rule; a built-in op needs a type of the registry.
    const TypeInfo* info = find_type(type);
    if (op.known() && !info)
        fail(call, std::string("operation '") + op.name() + "' is not defined for element type " +
                       datatype_name(type));
    const TypeClass cls = info ? info->cls : TypeClass::integer;  // else a user op: MPI decides
    // The core runs it: this backend recognizes the bucket's memory.
    if (average)
        detail::average(data_, count, type, comm_, call);
    else
        detail::allreduce(MPI_IN_PLACE, data_, count, type, cls, op, comm_, call);
}

}  // namespace mpiml
