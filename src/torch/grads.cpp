// mpi_avg_grads and GradAverager.
//
// Gradients are packed, in parameter order, into one cached flat buffer per
// bucket (per wire dtype, up to bucket_cap_bytes; a node shared-memory bucket
// when the shared path applies) and reduced with one allreduce per bucket; contiguous CPU tensors are packed with plain loops,
// anything else (strides, other devices, sparse) through ATen copies.
// float16 and bfloat16 travel and are summed as float32, then converted back.
// GradAverager's overlap plans the buckets in reverse parameter order and runs
// them on a communication thread as backward() finishes them (class Overlap).
#include "torch/common.hpp"

#include "core/agreement.hpp"
#include "core/backend.hpp"
#include "core/state.hpp"

#include <mpiml/error.hpp>
#include <mpiml/shm.hpp>

#include <ATen/MemoryOverlap.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <limits>
#include <memory>
#include <mutex>
#include <string_view>
#include <thread>
#include <tuple>
#include <unordered_set>
#include <utility>

namespace mpiml {
using namespace torch_detail;
namespace {

// --------------------------------------------------- pack / unpack loops

template <class W, class T>
void to_wire(const void* src, void* dst, std::size_t n) {
    if constexpr (std::is_same_v<W, T>) {
        std::memcpy(dst, src, n * sizeof(T));
    } else {
        const T* s = static_cast<const T*>(src);
        W* d = static_cast<W*>(dst);
        for (std::size_t i = 0; i < n; ++i) d[i] = static_cast<W>(s[i]);
    }
}

template <class W>
struct real_type {
    using type = W;
};
template <class R>
struct real_type<c10::complex<R>> {
    using type = R;
};

/// d = s / ranks, converted to T. The core's rule, so that every path gives
/// the same bits: a multiplication by 1/ranks when ranks is a power of two
/// (the same result, without divps/divpd, which made this loop the
/// bottleneck), a division otherwise.
template <class W, class T>
void from_wire_scaled(const void* src, void* dst, std::size_t n, int ranks) {
    using R = typename real_type<W>::type;
    const W* s = static_cast<const W*>(src);
    T* d = static_cast<T*>(dst);
    const R r = static_cast<R>(ranks);
    if ((ranks & (ranks - 1)) == 0)
        for (std::size_t i = 0; i < n; ++i) d[i] = static_cast<T>(s[i] * (R(1) / r));
    else
        for (std::size_t i = 0; i < n; ++i) d[i] = static_cast<T>(s[i] / r);
}

template <class W>
void scale_in_place(void* data, std::size_t n, int ranks) {
    from_wire_scaled<W, W>(data, data, n, ranks);
}

/// Packs the plain tensor t (dtype s) into dst as its wire type.
void pack_plain(const at::Tensor& t, void* dst) {
    const void* src = t.data_ptr();
    const auto n = static_cast<std::size_t>(t.numel());
    if (!with_grad_dtype(t.scalar_type(), [&]<class W, class T>() { to_wire<W, T>(src, dst, n); }))
        detail::fail("mpiml::mpi_avg_grads", "internal error: pack_plain got dtype " + dtype_name(t.scalar_type()));
}

/// Writes src / ranks into the plain tensor t.
void unpack_plain_avg(const void* src, const at::Tensor& t, int ranks) {
    void* dst = t.data_ptr();
    const auto n = static_cast<std::size_t>(t.numel());
    const bool ok = with_grad_dtype(t.scalar_type(), [&]<class W, class T>() {
        from_wire_scaled<W, T>(src, dst, n, ranks);
    });
    if (!ok)
        detail::fail("mpiml::mpi_avg_grads", "internal error: unpack_plain_avg got dtype " + dtype_name(t.scalar_type()));
}

/// Divides n elements of dtype s (float, double or complex) at data by ranks.
void average_in_place(at::ScalarType s, void* data, std::size_t n, int ranks) {
    bool done = false;
    with_grad_dtype(s, [&]<class W, class T>() {
        if constexpr (std::is_same_v<W, T>) {  // stored as summed: no half types
            scale_in_place<W>(data, n, ranks);
            done = true;
        }
    });
    if (!done)
        detail::fail("mpiml::mpi_avg_grads", "internal error: average_in_place got dtype " + dtype_name(s));
}

// --------------------------------------------------------- mpi_avg_grads

struct GradEntry {
    at::Tensor param;
    std::size_t index;  // position in the caller's parameter list
    Wire wire;
    std::size_t numel;
    at::ScalarType scalar = at::kFloat;  // the parameter's dtype when planned
    std::size_t bucket = 0;
    bool defined_here = false;  // gradient defined on this rank on entry
    std::string label;  // "parameter #3 '1.weight'" (GradAverager), or empty: by index
};

/// How messages name e's parameter.
std::string label_of(const GradEntry& e) {
    return e.label.empty() ? "parameter #" + std::to_string(e.index) : e.label;
}

/// Fused buckets are packed into the scratch buffer, with one flag per entry at
/// the tail counting the ranks that had a gradient. A direct bucket is one
/// gradient larger than the cap, reduced in its own memory (staged through the
/// scratch buffer only when it is not contiguous here); its flag rides in the
/// last fused bucket (or, without one, in a small allreduce of its own).
/// Splitting smaller gradients off into direct buckets was measured slower than
/// copying them (more collectives), so only those larger than the cap are.
struct Bucket {
    Wire wire;
    bool direct;
    std::size_t first = 0;  // into GradState::order
    std::size_t entries = 0;
    std::size_t payload = 0;  // elements, flags excluded
    std::size_t flags = 0;    // flag slots after the payload
};

struct GradState {
    Scratch scratch;
    std::unique_ptr<SharedBucket> shared;  // packed buckets, in node shared memory
    MPI_Comm shared_comm = MPI_COMM_NULL;
    std::vector<GradEntry> entries;
    std::vector<std::size_t> order;  // entry indices, bucket by bucket
    std::vector<std::size_t> fill;
    std::vector<Bucket> buckets;
    std::vector<std::size_t> direct;    // bucket indices of the direct buckets
    std::vector<char> direct_any;       // per direct bucket: some rank had a gradient
    std::size_t largest = 0;            // scratch bytes the plan needs
    std::size_t largest_fused = 0;      // bytes of the largest fused bucket
};

/// The flag's value: a float or double, or the real part of a complex.
double flag_value(const Wire& w, const void* p) {
    switch (w.scalar) {
        case at::kFloat:
        case at::kComplexFloat: return *static_cast<const float*>(p);
        default: return *static_cast<const double*>(p);
    }
}

void set_flag(const Wire& w, void* p, bool on) {
    std::memset(p, 0, w.size);
    if (!on) return;
    switch (w.scalar) {
        case at::kFloat:
        case at::kComplexFloat: *static_cast<float*>(p) = 1.0f; break;  // real part
        default: *static_cast<double*>(p) = 1.0; break;
    }
}

/// The parameter as planned (the buckets are laid out for its dtype and
/// size then) and its gradient, when defined, of that size.
void check_entry(const GradEntry& e, const at::Tensor& g) {
    if (e.param.scalar_type() != e.scalar || e.param.numel() != static_cast<std::int64_t>(e.numel))
        throw std::invalid_argument(
            label_of(e) + " is " + dtype_name(e.param.scalar_type()) + " of " +
            std::to_string(e.param.numel()) + " elements, but was " + dtype_name(e.scalar) + " of " +
            std::to_string(e.numel) + " when this averager planned its buckets: its gradient is not "
            "averaged; make a new GradAverager after changing the model's dtypes or sizes");
    if (g.defined() && g.numel() != static_cast<std::int64_t>(e.numel))
        throw std::invalid_argument("the gradient of " + label_of(e) +
                                    " has " + std::to_string(g.numel()) +
                                    " elements but the parameter has " +
                                    std::to_string(e.numel));
}

/// Packs p's gradient into dst as the wire type (zeros when undefined).
void pack_grad(const GradEntry& e, void* dst) {
    const at::Tensor& g = e.param.grad();
    check_entry(e, g);
    if (!g.defined()) {
        std::memset(dst, 0, e.numel * e.wire.size);
        return;
    }
    if (plain(g, e.param.scalar_type())) {
        pack_plain(g, dst);
    } else {
        const at::Tensor src = g.layout() == at::kStrided ? g : g.to_dense();
        wire_view(dst, e.param.sizes(), e.wire.scalar).copy_(src.view(e.param.sizes()));
    }
}

/// Writes src / ranks into p's gradient, creating it when undefined here.
void unpack_grad(const GradEntry& e, void* src, int ranks) {
    at::Tensor& g = e.param.mutable_grad();
    const at::ScalarType s = e.param.scalar_type();
    check_entry(e, g);
    if (!g.defined()) g = at::empty(e.param.sizes(), e.param.options());
    if (plain(g, s)) {
        unpack_plain_avg(src, g, ranks);
        return bump_version(g);
    }
    at::Tensor v = wire_view(src, e.param.sizes(), e.wire.scalar);
    v.div_(ranks);
    if (g.layout() == at::kStrided && at::has_internal_overlap(g) != at::MemOverlap::Yes)
        g.copy_(v.view(g.sizes()));
    else if (g.layout() == at::kStrided)  // expanded (elements share memory): a new tensor
        g = v.view(g.sizes()).to(g.options(), /*non_blocking=*/false, /*copy=*/true);
    else if (g.layout() == at::kSparse)  // stays sparse (SparseAdam), over the rows any rank had
        g = v.view(e.param.sizes()).to(g.scalar_type(), false, true).to_sparse(g.sparse_dim());
    else
        g = v.to(g.options().layout(at::kStrided), /*non_blocking=*/false, /*copy=*/true);
}

/// Entry order per bucket (a counting sort keeps the entries' order); one flag
/// per entry of a fused bucket.
void order_entries(GradState& st) {
    st.fill.assign(st.buckets.size(), 0);
    std::size_t pos = 0;
    for (Bucket& b : st.buckets) {
        b.first = pos;
        pos += b.entries;
        b.flags = b.direct ? 0 : b.entries;
    }
    st.order.resize(st.entries.size());
    for (std::size_t j = 0; j < st.entries.size(); ++j) {
        const std::size_t bi = st.entries[j].bucket;
        st.order[st.buckets[bi].first + st.fill[bi]++] = j;
    }
}

/// Fixed plan, the same on every rank (it depends only on dtypes, sizes and
/// options): wires in order of first appearance, parameter order within; a
/// gradient larger than the cap whose dtype travels as is gets a direct
/// bucket. Returns the scratch bytes needed.
std::size_t plan_buckets(GradState& st, const AvgGradsOptions& opts) {
    st.buckets.clear();
    st.direct.clear();
    std::array<Wire, 4> wires{};  // float, double, complex float, complex double
    std::size_t n_wires = 0;
    for (const GradEntry& e : st.entries)
        if (std::none_of(wires.begin(), wires.begin() + n_wires,
                         [&](const Wire& w) { return w.mpi == e.wire.mpi; }))
            wires[n_wires++] = e.wire;
    for (std::size_t wi = 0; wi < n_wires; ++wi) {
        const Wire& w = wires[wi];
        std::size_t open = SIZE_MAX;  // the fused bucket being filled
        for (GradEntry& e : st.entries) {
            if (e.wire.mpi != w.mpi) continue;
            if (e.param.scalar_type() == w.scalar && e.numel * w.size > opts.bucket_cap_bytes) {
                e.bucket = st.buckets.size();
                st.direct.push_back(e.bucket);
                st.buckets.push_back({w, true, 0, 1, e.numel, 0});
                continue;
            }
            if (open == SIZE_MAX ||
                (st.buckets[open].payload + e.numel) * w.size > opts.bucket_cap_bytes) {
                open = st.buckets.size();
                st.buckets.push_back({w, false});
            }
            e.bucket = open;
            st.buckets[open].entries += 1;
            st.buckets[open].payload += e.numel;
        }
    }
    order_entries(st);
    for (auto it = st.buckets.rbegin(); it != st.buckets.rend(); ++it)
        if (!it->direct) {
            it->flags += st.direct.size();  // the carrier of the direct flags
            break;
        }
    std::size_t largest = st.direct.size() * sizeof(float);
    for (const Bucket& b : st.buckets)
        largest = std::max(largest, (b.payload + b.flags) * b.wire.size);
    return largest;
}

/// DDP's first bucket: small, so that averaging starts early in backward().
constexpr std::size_t kFirstBucketBytes = std::size_t{1} << 20;

/// The overlap plan (entries already in reverse parameter order, the order in
/// which backward() finishes them): fused buckets only, one open bucket per
/// wire, closed once it holds at least its limit (DDP's rule: a layer's bias
/// and weight, adjacent in that order, end up together; a wire's first bucket
/// kFirstBucketBytes, the others the cap), or once the wire's next two entries
/// would take it past the cap: a bucket does not wait for the next layer's
/// weight it has no room for (with two large layers, DDP's rule would start
/// their bucket only when the second is done). Towards the end the limit is
/// half of what the wire has left (not below kFirstBucketBytes): the last
/// bucket, which only starts when backward() is done, is small, and the ones
/// before it start while backward() still runs. Buckets are numbered in the
/// order they open, i.e. of their first entry. Returns the scratch bytes needed.
std::size_t plan_overlap_buckets(GradState& st, std::size_t cap) {
    st.buckets.clear();
    st.direct.clear();
    struct OpenBucket {
        MPI_Datatype mpi;
        std::size_t open;   // the bucket being filled of this wire, SIZE_MAX: none
        std::size_t limit;  // its bytes
    };
    std::vector<OpenBucket> wires;
    // Bytes of each entry's next two entries of the same wire (one backward pass).
    std::vector<std::size_t> ahead(st.entries.size(), 0);
    struct Next {
        MPI_Datatype mpi;
        std::size_t one, two;  // bytes of the next entry and of the one after it
        std::size_t after;     // bytes of all the entries after
    };
    std::vector<Next> next;
    // Bytes of each entry and the wire's entries after it.
    std::vector<std::size_t> rest(st.entries.size(), 0);
    for (std::size_t i = st.entries.size(); i-- > 0;) {
        const GradEntry& e = st.entries[i];
        auto n = std::find_if(next.begin(), next.end(), [&](const Next& x) { return x.mpi == e.wire.mpi; });
        if (n == next.end()) n = next.insert(next.end(), {e.wire.mpi, 0, 0, 0});
        ahead[i] = n->one + n->two;
        n->two = n->one;
        n->one = e.numel * e.wire.size;
        rest[i] = n->after += n->one;
    }
    const std::size_t least = std::min(cap, kFirstBucketBytes);
    for (std::size_t i = 0; i < st.entries.size(); ++i) {
        GradEntry& e = st.entries[i];
        auto it = std::find_if(wires.begin(), wires.end(), [&](const OpenBucket& w) { return w.mpi == e.wire.mpi; });
        if (it == wires.end())
            it = wires.insert(wires.end(), {e.wire.mpi, SIZE_MAX, least});
        else if (it->open == SIZE_MAX)
            it->limit = std::max(least, std::min(cap, rest[i] / 2));
        if (it->open == SIZE_MAX) {
            it->open = st.buckets.size();
            st.buckets.push_back({e.wire, false});
        }
        Bucket& b = st.buckets[it->open];
        e.bucket = it->open;
        b.entries += 1;
        b.payload += e.numel;
        const std::size_t bytes = b.payload * e.wire.size;
        if (bytes >= it->limit || bytes + ahead[i] > cap) it->open = SIZE_MAX;
    }
    order_entries(st);
    std::size_t largest = 0;
    for (const Bucket& b : st.buckets) largest = std::max(largest, (b.payload + b.flags) * b.wire.size);
    return largest;
}

// ------------------------------------------- gradient as bucket view

/// A gradient kept as a view into a shared bucket.
struct ViewEntry {
    std::size_t param;   // index into the eligible parameter list
    std::size_t offset;  // elements from the bucket start (64-byte aligned)
};

struct ViewBucket {
    Wire wire;
    std::vector<ViewEntry> entries;
    std::size_t payload = 0;  // elements, padding included, flags excluded
    std::shared_ptr<SharedBucket> mem;  // also held by the gradients viewing it
};

using WeakImpl = c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;

struct ViewState {
    MPI_Comm comm = MPI_COMM_NULL;
    std::size_t cap = 0;
    std::vector<std::tuple<const void*, std::int64_t, int>> signature;
    std::vector<ViewBucket> buckets;
    std::vector<WeakImpl> params;  // the planned parameters, not kept alive
    std::vector<std::string> labels;  // how messages name them (GradAverager), or empty
    std::vector<c10::TensorImpl*> in_place;  // run_views' scratch, one bucket
    std::vector<char> unplanned;             // run_views' scratch: not as planned
};

/// A gradient viewing a bucket's memory at data; its storage holds `keep`
/// (the bucket), so a reference to it outlives the averager safely.
at::Tensor view_of(void* data, const at::Tensor& param, std::shared_ptr<void> keep) {
    return at::from_blob(data, param.sizes(), [keep = std::move(keep)](void*) {}, param.options());
}

/// A GradAverager's buckets kept at its destruction (dropped by Python's
/// garbage collector, or a gradient still viewed them): freed when every
/// rank of a communicator of the same ranks has them and none is viewed, at
/// the next GradAverager made there (number_and_reclaim), else by finalize.
struct Dropped {
    std::uint64_t members = 0;  // the averager's communicator (world ranks, hashed)
    std::uint64_t id = 0;       // the averager's number, alike on its ranks
    std::vector<std::shared_ptr<void>> mems;
};
struct DroppedList {
    std::mutex m;
    std::vector<Dropped> list;
};
DroppedList& dropped() {
    static auto* d = new DroppedList;  // never destroyed: finalize frees the windows
    return *d;
}
/// The averager being destroyed on this thread (its members and id), or null.
thread_local const Dropped* dropping = nullptr;

/// Whether a gradient still views one of these buckets (a reference the
/// program kept) on some rank of comm: then every rank keeps the buckets
/// (a GradAverager's until every rank dropped them, see Dropped; others
/// until mpiml's finalize, which frees their shared windows); else they are
/// freed now. Collective (at a destruction or a new plan, alike on every
/// rank), but not while an exception unwinds this rank (a failure: the other
/// ranks are not destroying theirs, and the job ends) or while frees are
/// deferred (kept: finalize frees them).
void free_or_keep(std::vector<std::shared_ptr<void>> mems, MPI_Comm comm, const char* call) {
    if (mems.empty() || is_finalized()) return;  // finalize freed the windows
    int viewed = std::any_of(mems.begin(), mems.end(), [](const auto& m) { return m.use_count() > 1; });
    if (std::uncaught_exceptions() > 0 || detail::collective_frees_deferred()) {
        viewed = 1;
    } else {
        try {
            detail::allreduce(MPI_IN_PLACE, &viewed, 1, MPI_INT, TypeClass::integer, Op::max, comm, call);
        } catch (const std::exception&) {  // the communicator is gone: finalize frees them
            viewed = 1;
        }
    }
    if (!viewed) {  // freed here, after the agreement just made
        detail::FreesAgreed agreed;
        mems.clear();
        return;
    }
    if (dropping) {
        DroppedList& d = dropped();
        std::lock_guard lk(d.m);
        auto it = std::find_if(d.list.begin(), d.list.end(), [](const Dropped& e) {
            return e.members == dropping->members && e.id == dropping->id;
        });
        if (it == d.list.end()) it = d.list.insert(d.list.end(), Dropped{dropping->members, dropping->id, {}});
        for (auto& p : mems) it->mems.push_back(std::move(p));
        return;
    }
    static std::mutex m;
    static auto* kept = new std::vector<std::shared_ptr<void>>;  // never destroyed: finalize frees the windows
    std::lock_guard lk(m);
    for (auto& p : mems) kept->push_back(std::move(p));
}

/// The world ranks of comm, hashed: which communicator an averager was on.
std::uint64_t members_of(MPI_Comm comm) {
    MPI_Group g = MPI_GROUP_NULL, w = MPI_GROUP_NULL;
    int n = 0;
    MPI_Comm_group(comm, &g);
    MPI_Comm_group(MPI_COMM_WORLD, &w);
    MPI_Group_size(g, &n);
    std::vector<int> ranks(static_cast<std::size_t>(n)), world(ranks.size());
    for (int i = 0; i < n; ++i) ranks[static_cast<std::size_t>(i)] = i;
    MPI_Group_translate_ranks(g, n, ranks.data(), w, world.data());
    MPI_Group_free(&g);
    MPI_Group_free(&w);
    return fnv1a(world.data(), world.size() * sizeof(int), fnv_basis ^ static_cast<std::uint64_t>(n));
}

/// A number for a new averager on comm, the same on every rank of it, and
/// the buckets of averagers on comm's ranks that every rank dropped (none
/// viewed) freed, in the order they were made. Collective, after the
/// averager's agreement: one small allreduce, a second when some were dropped.
std::uint64_t number_and_reclaim(MPI_Comm comm, std::uint64_t members, const char* call) {
    static std::atomic<std::uint64_t> last{0};
    DroppedList& d = dropped();
    std::vector<std::uint64_t> mine;  // ids this rank can free now
    if (std::uncaught_exceptions() == 0 && !detail::collective_frees_deferred()) {
        std::lock_guard lk(d.m);
        for (const Dropped& e : d.list)
            if (e.members == members &&
                std::all_of(e.mems.begin(), e.mems.end(), [](const auto& p) { return p.use_count() == 1; }))
                mine.push_back(e.id);
    }
    std::sort(mine.begin(), mine.end());
    constexpr auto none = std::numeric_limits<std::int64_t>::min();
    // max over ranks of: the next number, -(has some), the lowest, -(the highest)
    std::array<std::int64_t, 4> v{static_cast<std::int64_t>(last.load() + 1), mine.empty() ? 0 : -1,
                                  mine.empty() ? none : static_cast<std::int64_t>(mine.front()),
                                  mine.empty() ? none : -static_cast<std::int64_t>(mine.back())};
    detail::allreduce(MPI_IN_PLACE, v.data(), v.size(), MPI_INT64_T, TypeClass::integer, Op::max, comm, call);
    const auto id = static_cast<std::uint64_t>(v[0]);
    for (std::uint64_t was = last.load(); was < id && !last.compare_exchange_weak(was, id);) {
    }
    if (v[1] != -1) return id;  // some rank has none to free
    std::int64_t lo = v[2];
    const std::int64_t hi = -v[3];
    if (lo > hi) return id;
    constexpr std::int64_t kMaxSpan = 1 << 16;  // the rest at a later averager
    lo = std::max(lo, hi - kMaxSpan + 1);
    std::vector<int> all(static_cast<std::size_t>(hi - lo + 1), 0);
    for (std::uint64_t k : mine)
        if (static_cast<std::int64_t>(k) >= lo && static_cast<std::int64_t>(k) <= hi)
            all[static_cast<std::size_t>(static_cast<std::int64_t>(k) - lo)] = 1;
    detail::allreduce(MPI_IN_PLACE, all.data(), all.size(), MPI_INT, TypeClass::integer, Op::min, comm, call);
    std::vector<Dropped> freeing;
    {
        std::lock_guard lk(d.m);
        for (auto it = d.list.begin(); it != d.list.end();) {
            const auto k = static_cast<std::int64_t>(it->id);
            if (it->members == members && k >= lo && k <= hi && all[static_cast<std::size_t>(k - lo)]) {
                freeing.push_back(std::move(*it));
                it = d.list.erase(it);
            } else {
                ++it;
            }
        }
    }
    std::sort(freeing.begin(), freeing.end(), [](const Dropped& a, const Dropped& b) { return a.id < b.id; });
    const detail::FreesAgreed agreed;  // just agreed, on every rank of comm
    for (Dropped& e : freeing) e.mems.clear();  // in the order they were kept
    return id;
}

/// The averaged gradient v (a view of a bucket) in the layout of the
/// gradient it replaces: a sparse gradient stays sparse (SparseAdam), over
/// the rows any rank had; another layout gets memory of its own.
at::Tensor as_its_layout(at::Tensor v, const at::Tensor& was) {
    if (!was.defined() || was.layout() == at::kStrided) return v;
    if (was.layout() == at::kSparse) return v.to_sparse(was.sparse_dim());
    return v.clone();
}

/// Gradients still viewing st's buckets get their own memory back, and the
/// buckets are freed (collective: every rank releases the same plan).
void release_views(ViewState& st) {
    for (const WeakImpl& w : st.params) {
        auto impl = w.lock();
        if (!impl) continue;
        const at::Tensor p(std::move(impl));
        const at::Tensor& g = p.grad();
        if (!g.defined() || g.layout() != at::kStrided) continue;  // a sparse one is its own
        const auto* d = static_cast<const std::byte*>(g.data_ptr());
        for (const auto& b : st.buckets) {
            const auto* lo = static_cast<const std::byte*>(b.mem->data());
            if (d >= lo && d < lo + b.mem->size_bytes()) {
                p.mutable_grad() = g.clone();
                break;
            }
        }
    }
    if (!st.buckets.empty()) {
        std::vector<std::shared_ptr<void>> mems;
        for (auto& b : st.buckets) mems.push_back(std::move(b.mem));
        free_or_keep(std::move(mems), st.comm, "mpiml::GradAverager");
    }
    st.buckets.clear();
    st.params.clear();
    st.signature.clear();
}

/// Contiguous CPU parameters summed in their own dtype (float32, float64,
/// complex): their gradients can be plain views of a bucket in that dtype.
bool view_eligible(const at::Tensor& p) {
    if (p.layout() != at::kStrided || !p.is_cpu() || !p.is_contiguous()) return false;
    const auto wire = sum_wire(p.scalar_type());
    return wire && wire->scalar == p.scalar_type() && has_gradients(p.scalar_type());
}

/// Collective: every rank plans the same buckets from the same parameter list.
void plan_views(ViewState& st, const std::vector<at::Tensor>& params, std::size_t cap,
                MPI_Comm comm) {
    release_views(st);  // collective: every rank re-plans at the same call
    for (const auto& p : params) st.params.emplace_back(p.getIntrusivePtr());
    st.comm = comm;
    st.cap = cap;
    std::vector<Wire> wires;
    for (const auto& p : params) {
        const Wire w = *sum_wire(p.scalar_type());
        if (std::none_of(wires.begin(), wires.end(), [&](const Wire& x) { return x.mpi == w.mpi; }))
            wires.push_back(w);
    }
    for (const Wire& w : wires) {
        const std::size_t align = 64 / w.size;  // elements per cache line
        for (std::size_t i = 0; i < params.size(); ++i) {
            if (sum_wire(params[i].scalar_type())->mpi != w.mpi) continue;
            const auto n = static_cast<std::size_t>(params[i].numel());
            ViewBucket* b = st.buckets.empty() ? nullptr : &st.buckets.back();
            const std::size_t start = b ? (b->payload + align - 1) / align * align : 0;
            if (!b || b->wire.mpi != w.mpi || (b->payload > 0 && (start + n) * w.size > cap)) {
                st.buckets.push_back({w, {}, 0, nullptr});
                b = &st.buckets.back();
            }
            const std::size_t off = (b->payload + align - 1) / align * align;
            b->entries.push_back({i, off});
            b->payload = off + n;
        }
    }
    for (auto& b : st.buckets) {
        b.mem = std::make_shared<SharedBucket>((b.payload + b.entries.size()) * b.wire.size,
                                               Comm(comm));
        std::memset(b.mem->data(), 0, b.mem->size_bytes());
    }
}

using ViewSignature = std::vector<std::tuple<const void*, std::int64_t, int>>;

ViewSignature view_signature(const std::vector<at::Tensor>& params) {
    ViewSignature sig;
    sig.reserve(params.size());
    for (const auto& p : params)
        sig.emplace_back(p.unsafeGetTensorImpl(), p.numel(), static_cast<int>(p.scalar_type()));
    return sig;
}

/// Averages params' gradients in st's buckets (planned for these params).
void run_views(ViewState& st, const std::vector<at::Tensor>& params, const char* call) {

    torch::NoGradGuard no_grad;
    std::string deferred;  // a local failure, thrown after the collectives
    for (ViewBucket& b : st.buckets) {
        const std::size_t es = b.wire.size;
        auto* base = static_cast<std::byte*>(b.mem->data());
        std::byte* flags = base + b.payload * es;
        // The gradients already in place (else null): their versions are
        // bumped after the average.
        auto& in_place = st.in_place;
        in_place.assign(b.entries.size(), nullptr);
        st.unplanned.assign(b.entries.size(), 0);
        for (std::size_t k = 0; k < b.entries.size(); ++k) {
            const at::Tensor& p = params[b.entries[k].param];
            std::byte* dst = base + b.entries[k].offset * es;
            const at::Tensor& g = p.grad();
            // The dtype and size the bucket was laid out for.
            const auto& [planned_impl, planned_n, planned_dtype] = st.signature[b.entries[k].param];
            const auto n = static_cast<std::size_t>(planned_n);
            if (p.numel() != planned_n || static_cast<int>(p.scalar_type()) != planned_dtype) {
                if (deferred.empty())
                    deferred = (st.labels.empty() ? std::string("a parameter")
                                                  : st.labels[b.entries[k].param]) +
                               " (averaged as a bucket view) is " + dtype_name(p.scalar_type()) +
                               " of " + std::to_string(p.numel()) + " elements, but was " +
                               dtype_name(static_cast<at::ScalarType>(planned_dtype)) + " of " +
                               std::to_string(planned_n) +
                               " when its bucket was planned: its gradient is not averaged; "
                               "make a new GradAverager after changing the model's dtypes or sizes";
                std::memset(dst, 0, n * es);
                set_flag(b.wire, flags + k * es, false);
                st.unplanned[k] = 1;
                continue;
            }
            bool defined = g.defined();
            if (plain(g, p.scalar_type()) && g.data_ptr() == dst && g.sizes() == p.sizes()) {
                in_place[k] = g.unsafeGetTensorImpl();  // nothing to pack
            } else if (defined) {
                try {
                    if (g.numel() != p.numel())
                        throw std::invalid_argument(
                            "a gradient has " + std::to_string(g.numel()) +
                            " elements but its parameter has " + std::to_string(p.numel()));
                    const at::Tensor src = g.layout() == at::kStrided ? g : g.to_dense();
                    wire_view(dst, p.sizes(), p.scalar_type()).copy_(src.view(p.sizes()));
                } catch (const std::exception& ex) {
                    if (deferred.empty()) deferred = ex.what();
                    std::memset(dst, 0, n * es);
                    defined = false;
                }
            } else {
                std::memset(dst, 0, n * es);
            }
            set_flag(b.wire, flags + k * es, defined);
        }
        // Averages the gradients and the flags (non-zero: some rank had one).
        detail::average(b.mem->data(), b.payload + b.entries.size(), b.wire.mpi, b.mem->comm(),
                        call);
        for (std::size_t k = 0; k < b.entries.size(); ++k) {
            const at::Tensor& p = params[b.entries[k].param];
            if (st.unplanned[k]) continue;
            if (in_place[k]) {
                bump_version(in_place[k]);
            } else if (flag_value(b.wire, flags + k * es) != 0.0) {
                p.mutable_grad() = as_its_layout(view_of(base + b.entries[k].offset * es, p, b.mem), p.grad());
            }
        }
    }
    if (!deferred.empty()) detail::fail(call, deferred);
}

/// A thread's plan cache, never destroyed: its buckets' shared windows are
/// freed collectively, and a destructor run at exit() or at a thread's end
/// (before mpiml's exit guard) would wait on this rank alone, forever.
/// mpiml's finalize frees the windows on every rank.
template <class Cache>
Cache& thread_cache() {
    thread_local Cache* c = [] {
        static auto* m = new std::mutex;
        static auto* all = new std::vector<std::unique_ptr<Cache>>;  // kept reachable
        auto p = std::make_unique<Cache>();
        Cache* raw = p.get();
        std::lock_guard lock(*m);
        all->push_back(std::move(p));
        return raw;
    }();
    return *c;
}

/// The free function's plans for gradient_as_bucket_view, one per parameter
/// list (per model), least recently used dropped past kCachedPlans per
/// communicator.
constexpr std::size_t kCachedPlans = 8;
struct ViewCache {
    struct Entry {
        ViewState st;
        std::uint64_t used = 0;
    };
    std::vector<std::unique_ptr<Entry>> entries;
    std::uint64_t clock = 0;
};
ViewCache& view_cache() { return thread_cache<ViewCache>(); }

void avg_grads_as_views(const std::vector<at::Tensor>& params, const AvgGradsOptions& opts,
                        MPI_Comm comm, const char* call) {
    ViewCache& cache = view_cache();
    ViewSignature sig = view_signature(params);
    ViewCache::Entry* hit = nullptr;
    for (auto& e : cache.entries)
        if (e->st.signature == sig && e->st.comm == comm && e->st.cap == opts.bucket_cap_bytes)
            hit = e.get();
    // Whether to re-plan must be decided alike on every rank.
    int changed = hit == nullptr;
    detail::allreduce(MPI_IN_PLACE, &changed, 1, MPI_INT, TypeClass::integer, Op::max, comm, call);
    if (changed) {
        if (!hit) {
            // Dropped among this communicator's plans only: every rank of comm
            // made the same calls on it, so every rank drops the same one.
            auto lru = cache.entries.end();
            std::size_t same_comm = 0;
            for (auto it = cache.entries.begin(); it != cache.entries.end(); ++it)
                if ((*it)->st.comm == comm) {
                    ++same_comm;
                    if (lru == cache.entries.end() || (*it)->used < (*lru)->used) lru = it;
                }
            if (same_comm >= kCachedPlans) {
                release_views((*lru)->st);  // collective over comm
                cache.entries.erase(lru);
            }
            hit = cache.entries.emplace_back(std::make_unique<ViewCache::Entry>()).get();
        }
        plan_views(hit->st, params, opts.bucket_cap_bytes, comm);
        hit->st.signature = std::move(sig);
    }
    hit->used = ++cache.clock;
    run_views(hit->st, params, call);
}

/// Parameters whose gradients are averaged: defined, requiring grad, of a
/// floating or complex dtype, each once; with their position in the list.
struct Eligible {
    std::size_t index;
    at::Tensor tensor;
};
void eligible_params(const std::vector<at::Tensor>& params, std::vector<Eligible>& out) {
    out.clear();
    std::unordered_set<const void*> seen;
    for (std::size_t i = 0; i < params.size(); ++i) {
        const at::Tensor& p = params[i];
        if (!p.defined() || !p.requires_grad() || !has_gradients(p.scalar_type())) continue;
        if (!seen.insert(p.unsafeGetTensorImpl()).second) continue;
        out.push_back({i, p});
    }
}

/// The packed plan for these parameters (local: it depends only on dtypes,
/// sizes and options, so every rank makes the same one).
void plan_packed(GradState& st, const std::vector<Eligible>& ps, const AvgGradsOptions& opts,
                 const char* call) {
    st.entries.clear();
    for (const Eligible& p : ps) {
        const auto wire = sum_wire(p.tensor.scalar_type());
        if (!wire)  // depends only on dtypes, so every rank throws here or none
            detail::fail(call, "parameters of dtype " + dtype_name(p.tensor.scalar_type()) +
                                   " are not supported");
        st.entries.push_back(
            {p.tensor, p.index, *wire, static_cast<std::size_t>(p.tensor.numel()), p.tensor.scalar_type()});
    }
    if (opts.overlap) {
        std::reverse(st.entries.begin(), st.entries.end());
        st.largest = plan_overlap_buckets(st, opts.bucket_cap_bytes);
    } else {
        st.largest = plan_buckets(st, opts);
    }
    st.largest_fused = 0;
    for (const Bucket& b : st.buckets)
        if (!b.direct) st.largest_fused = std::max(st.largest_fused, (b.payload + b.flags) * b.wire.size);
}

/// The first local failure of a step, thrown after its collectives ran (so a
/// bad gradient on one rank never leaves the others waiting).
struct Deferred {
    std::string what;
    void operator()(const std::exception& ex) {
        if (what.empty()) what = ex.what();
    }
};

/// Fused buckets are packed into memory for repeated in-place collectives
/// (node-shared memory where the shared path applies: no copy into the
/// shared segment and back; the core's allreduce recognizes it). Every rank asks alike (same
/// plan, same comm). Else nullptr.
std::byte* fused_segment(GradState& st, MPI_Comm comm) {
    const std::size_t bytes = st.largest_fused;
    if (bytes == 0) return nullptr;
    if (!st.shared || st.shared_comm != comm || st.shared->size_bytes() < bytes) {
        st.shared.reset();
        st.shared = detail::collective_memory(bytes, comm, "mpiml::mpi_avg_grads");
        st.shared_comm = comm;
    }
    return st.shared ? static_cast<std::byte*>(st.shared->data()) : nullptr;
}

/// Whether e's gradient is already a plain view of its place at dst.
bool grad_in_place(const GradEntry& e, const std::byte* dst) {
    const at::Tensor& g = e.param.grad();
    return plain(g, e.scalar) && g.data_ptr() == dst && e.param.scalar_type() == e.scalar &&
           e.wire.scalar == e.scalar &&
           e.param.numel() == static_cast<std::int64_t>(e.numel) &&
           g.numel() == static_cast<std::int64_t>(e.numel);
}

/// A direct bucket: one large gradient, averaged in place when plain,
/// else staged through buf.
void run_direct(GradEntry& e, const Bucket& b, std::byte* buf, MPI_Comm comm, int size,
                const char* call, Deferred& defer) {
    at::Tensor& g = e.param.mutable_grad();
    const auto n = static_cast<std::int64_t>(e.numel);
    if (g.defined() && e.param.scalar_type() == e.scalar && plain(g, e.scalar) && e.param.numel() == n &&
        g.numel() == n) {
        detail::allreduce(MPI_IN_PLACE, g.data_ptr(), e.numel, b.wire.mpi, b.wire.cls, Op::sum,
                          comm, call);
        average_in_place(g.scalar_type(), g.data_ptr(), e.numel, size);
        bump_version(g);
        return;
    }
    try {  // staged: undefined, strided, sparse or elsewhere
        pack_grad(e, buf);
    } catch (const std::exception& ex) {
        defer(ex);
        std::memset(buf, 0, e.numel * b.wire.size);
    }
    detail::allreduce(MPI_IN_PLACE, buf, e.numel, b.wire.mpi, b.wire.cls, Op::sum, comm, call);
    try {
        unpack_grad(e, buf, size);
    } catch (const std::exception& ex) {
        defer(ex);
    }
}

/// A fused bucket: its gradients packed at base, one defined-flag per entry
/// after them (and, in the carrier bucket, the direct buckets' flags), one
/// allreduce, unpacked where some rank had a gradient.
void run_fused(GradState& st, const Bucket& b, std::byte* base, MPI_Comm comm,
               int size, const char* call, Deferred& defer, std::shared_ptr<void> views_of = {}) {
    const bool as_views = views_of != nullptr;
    const std::size_t es = b.wire.size;
    const auto& direct_entry = [&](std::size_t d) -> GradEntry& {
        return st.entries[st.order[st.buckets[st.direct[d]].first]];
    };
    std::byte* flags = base + b.payload * es;
    std::size_t off = 0;
    for (std::size_t k = 0; k < b.entries; ++k) {
        const GradEntry& e = st.entries[st.order[b.first + k]];
        if (as_views && grad_in_place(e, base + off * es)) {  // nothing to pack
            set_flag(b.wire, flags + k * es, true);
            off += e.numel;
            continue;
        }
        try {
            pack_grad(e, base + off * es);
        } catch (const std::exception& ex) {
            defer(ex);
            std::memset(base + off * es, 0, e.numel * es);
        }
        set_flag(b.wire, flags + k * es, e.defined_here);
        off += e.numel;
    }
    const bool carrier = b.flags > b.entries;
    if (carrier)
        for (std::size_t d = 0; d < st.direct.size(); ++d)
            set_flag(b.wire, flags + (b.entries + d) * es, direct_entry(d).defined_here);
    // The core reduces a shared bucket's memory in place in node-shared memory.
    detail::allreduce(MPI_IN_PLACE, base, b.payload + b.flags, b.wire.mpi, b.wire.cls, Op::sum,
                      comm, call);
    off = 0;
    for (std::size_t k = 0; k < b.entries; ++k) {
        const GradEntry& e = st.entries[st.order[b.first + k]];
        // Undefined on every rank: stays undefined, as in one process.
        if (flag_value(b.wire, flags + k * es) != 0.0) {
            std::byte* at = base + off * es;
            try {
                check_entry(e, e.param.grad());
                if (as_views && view_eligible(e.param)) {  // the gradient becomes (or stays) a view
                    average_in_place(e.wire.scalar, at, e.numel, size);
                    if (grad_in_place(e, at)) bump_version(e.param.grad());
                    else
                        e.param.mutable_grad() = as_its_layout(view_of(at, e.param, views_of), e.param.grad());
                } else {
                    unpack_grad(e, at, size);
                }
            } catch (const std::exception& ex) {
                defer(ex);
            }
        }
        off += e.numel;
    }
    if (carrier)
        for (std::size_t d = 0; d < st.direct.size(); ++d)
            st.direct_any[d] = flag_value(b.wire, flags + (b.entries + d) * es) != 0.0;
}

/// Averages the planned entries' gradients.
void run_packed(GradState& st, MPI_Comm comm, int size, const char* call) {
    if (st.buckets.empty()) return;
    for (GradEntry& e : st.entries) e.defined_here = e.param.grad().defined();
    auto* buf = static_cast<std::byte*>(st.scratch.get(st.largest));
    st.direct_any.assign(st.direct.size(), 1);
    std::byte* fused = fused_segment(st, comm);
    const auto& direct_entry = [&](std::size_t d) -> GradEntry& {
        return st.entries[st.order[st.buckets[st.direct[d]].first]];
    };

    torch::NoGradGuard no_grad;
    Deferred defer;
    for (const Bucket& b : st.buckets) {
        if (b.direct) run_direct(st.entries[st.order[b.first]], b, buf, comm, size, call, defer);
        else run_fused(st, b, fused ? fused : buf, comm, size, call, defer);
    }
    const bool any_fused = st.buckets.size() > st.direct.size();
    if (!any_fused && !st.direct.empty()) {  // direct flags on their own
        auto* f = reinterpret_cast<float*>(buf);
        for (std::size_t d = 0; d < st.direct.size(); ++d)
            f[d] = direct_entry(d).defined_here ? 1.0f : 0.0f;
        detail::allreduce(MPI_IN_PLACE, f, st.direct.size(), MPI_FLOAT, TypeClass::floating,
                          Op::sum, comm, call);
        for (std::size_t d = 0; d < st.direct.size(); ++d) st.direct_any[d] = f[d] != 0.0f;
    }
    // A direct gradient undefined on every rank was created here as zeros.
    for (std::size_t d = 0; d < st.direct.size(); ++d)
        if (!st.direct_any[d]) direct_entry(d).param.mutable_grad().reset();
    if (!defer.what.empty()) detail::fail(call, defer.what);
}

/// The free function's packed plans, one per list of (dtype, size): two
/// models averaged in turn keep theirs. Least recently used dropped past
/// kCachedPlans per communicator (the same on every rank of it).
struct PackedCache {
    struct Entry {
        MPI_Comm comm = MPI_COMM_NULL;
        std::size_t cap = 0;
        std::vector<std::pair<int, std::int64_t>> key;
        GradState st;
        std::uint64_t used = 0;
    };
    std::vector<std::unique_ptr<Entry>> entries;
    std::vector<std::pair<int, std::int64_t>> key;  // reused per call
    std::vector<Eligible> eligible;                 // reused per call
    std::uint64_t clock = 0;
};
PackedCache& packed_cache() { return thread_cache<PackedCache>(); }

void avg_packed_cached(const std::vector<Eligible>& ps, const AvgGradsOptions& opts,
                       MPI_Comm comm, int size, const char* call) {
    PackedCache& cache = packed_cache();
    cache.key.clear();
    for (const Eligible& p : ps)
        cache.key.emplace_back(static_cast<int>(p.tensor.scalar_type()), p.tensor.numel());
    PackedCache::Entry* hit = nullptr;
    for (auto& e : cache.entries)
        if (e->comm == comm && e->cap == opts.bucket_cap_bytes && e->key == cache.key) hit = e.get();
    if (hit) {
        for (std::size_t j = 0; j < ps.size(); ++j) {
            hit->st.entries[j].param = ps[j].tensor;
            hit->st.entries[j].index = ps[j].index;
        }
    } else {
        // As for the view plans: dropped among this communicator's only (its
        // shared bucket is freed collectively over comm).
        auto lru = cache.entries.end();
        std::size_t same_comm = 0;
        for (auto it = cache.entries.begin(); it != cache.entries.end(); ++it)
            if ((*it)->comm == comm) {
                ++same_comm;
                if (lru == cache.entries.end() || (*it)->used < (*lru)->used) lru = it;
            }
        if (same_comm >= kCachedPlans) cache.entries.erase(lru);
        auto e = std::make_unique<PackedCache::Entry>();
        e->comm = comm;
        e->cap = opts.bucket_cap_bytes;
        e->key = cache.key;
        plan_packed(e->st, ps, opts, call);
        hit = cache.entries.emplace_back(std::move(e)).get();
    }
    hit->used = ++cache.clock;
    struct Release {  // hold no tensors between calls
        GradState& st;
        ~Release() {
            for (GradEntry& e : st.entries) e.param.reset();
        }
    } release{hit->st};
    run_packed(hit->st, comm, size, call);
}

/// The options that decide which collectives run and their sizes.
std::array<Setting, 5> option_settings(const AvgGradsOptions& opts) {
    return {{
        {"overlap", opts.overlap, true},
        {"quiet_wait", opts.overlap ? opts.quiet_wait : true, true, /*only_if overlap*/ 0},
        {"overlap_on_one_node", opts.overlap && opts.overlap_on_one_node, true, /*only_if overlap*/ 0},
        {"gradient_as_bucket_view", opts.gradient_as_bucket_view, true},
        {"bucket_cap_bytes", static_cast<std::int64_t>(opts.bucket_cap_bytes)},
    }};
}

/// Every rank must pass those options alike (one small allreduce); otherwise,
/// across hosts, ranks would wait in different collectives until MPIML_TIMEOUT.
void agree_options(const AvgGradsOptions& opts, MPI_Comm comm, const char* call) {
    const auto settings = option_settings(opts);
    verify_same_settings(settings.data(), static_cast<int>(settings.size()), "AvgGradsOptions", comm, call);
}

/// A GradAverager's options and parameters (names, shapes, dtypes) alike on
/// every rank, in the one small allreduce agree_options makes: models of the
/// same total size but other shapes would otherwise be averaged element by
/// element without an error. On a difference, every rank throws naming it.
void agree_averager(const AvgGradsOptions& opts, const std::vector<std::string>& descs,
                    MPI_Comm comm, const char* call) {
    const auto settings = option_settings(opts);
    std::array<std::int64_t, std::tuple_size_v<decltype(settings)> + 1> mine{};
    for (std::size_t i = 0; i < settings.size(); ++i) mine[i] = settings[i].value;
    std::uint64_t h = fnv_basis;
    for (const std::string& d : descs) {
        const std::uint64_t dh = hash_desc(d);
        h = fnv1a(&dh, sizeof dh, h);
    }
    std::memcpy(&mine.back(), &h, sizeof h);
    if (detail::agree(mine.data(), static_cast<int>(mine.size()), comm, call)) return;
    agree_options(opts, comm, call);    // throws naming the options that differ
    verify_same(descs, -1, comm, call);  // throws naming the parameter
    detail::fail(call, "internal error: the ranks' options and parameters disagree, then agree");
}

void avg_grads(const std::vector<at::Tensor>& params, const AvgGradsOptions& opts,
               MPI_Comm comm, const std::vector<std::string>* check_descs) {
    constexpr const char* call = "mpiml::mpi_avg_grads";
    if (check_descs) {  // MPIML_CHECK: the options and the modules alike on every rank
        agree_options(opts, comm, call);
        verify_same(*check_descs, -1, comm, call);
    }
    if (opts.overlap)  // alike on every rank
        detail::fail(call, "overlap needs a GradAverager (it hooks the parameters once, at construction)");
    const int size = num_procs(comm);
    if (size == 1) return;
    PackedCache& cache = packed_cache();
    std::vector<Eligible> ps = std::move(cache.eligible);
    eligible_params(params, ps);
    struct Keep {  // capacity reused across calls, no tensors held
        std::vector<Eligible>& ps;
        PackedCache& cache;
        ~Keep() {
            ps.clear();
            cache.eligible = std::move(ps);
        }
    } keep{ps, cache};
    if (opts.gradient_as_bucket_view) {
        std::vector<at::Tensor> views;
        std::vector<Eligible> rest;
        for (Eligible& p : ps) {
            if (view_eligible(p.tensor)) views.push_back(p.tensor);
            else rest.push_back(std::move(p));
        }
        std::exception_ptr deferred;
        try {
            avg_grads_as_views(views, opts, comm, call);
        } catch (const Error&) {  // local: the rest's collectives still run
            deferred = std::current_exception();
        }
        if (!rest.empty()) avg_packed_cached(rest, opts, comm, size, call);
        if (deferred) std::rethrow_exception(deferred);
        return;
    }
    avg_packed_cached(ps, opts, comm, size, call);
}

// ---------------------------------------------------------------- overlap

constexpr const char* kAveragerCall = "mpiml::GradAverager";

/// GradAverager's sums in the shared-memory path's order on MPI's path too,
/// however the buckets are cut: the same bits with overlap as without.
struct OrderedSums {
    bool was = detail::set_ordered_sums(true);
    ~OrderedSums() { detail::set_ordered_sums(was); }
    OrderedSums() = default;
    OrderedSums(const OrderedSums&) = delete;
    OrderedSums& operator=(const OrderedSums&) = delete;
};

/// GradAverager's averaging while backward() runs. A post-hook on each
/// parameter's gradient accumulator counts its bucket down; the communication
/// thread runs the buckets strictly in plan order, so every rank issues the
/// same collectives in the same order: each bucket once its gradients are
/// final here or, at the latest, once the call after backward() says no more
/// are coming (a gradient this rank did not get counts as zeros). While a
/// step is under way only the communication thread calls MPI.
/// The communicators of this process's averagers with overlap.
std::mutex overlaps_mutex;
std::vector<MPI_Comm> overlaps_alive;

/// Whether the averager on comm is the only one with overlap on it (with
/// MPI_THREAD_MULTIPLE; else the only one in this process). Two
/// communication threads would start their collectives in an order that
/// differs from rank to rank, so beside another one an averager averages
/// at the call, in the program's order. Changes only at construction and
/// destruction (collective, between steps).
bool overlap_alone(MPI_Comm comm, bool thread_multiple) {
    std::lock_guard lk(overlaps_mutex);
    if (!thread_multiple) return overlaps_alive.size() <= 1;
    return std::count(overlaps_alive.begin(), overlaps_alive.end(), comm) <= 1;
}

class Overlap {
public:
    Overlap(GradState& st, MPI_Comm comm, int size, bool quiet, std::size_t cap, bool views)
        : st_(st), comm_(comm), size_(size), quiet_(quiet), cap_(cap), views_(views),
          site_(detail::current_site()) {
        int provided = MPI_THREAD_SINGLE;
        MPI_Query_thread(&provided);
        multiple_ = provided >= MPI_THREAD_MULTIPLE;
        const std::size_t n = st_.entries.size();
        fired_.assign(n, 0);
        slot_.resize(n);
        for (std::size_t j = 0; j < n; ++j) slot_[j] = j;
        reset_pending();
        for (std::size_t j = 0; j < n; ++j) {
            std::shared_ptr<torch::autograd::Node> acc;
            try {
                acc = torch::autograd::impl::grad_accumulator(st_.entries[j].param);
            } catch (const std::exception&) {  // not a leaf: no gradient of its own
            }
            if (!acc) continue;  // never ready early: averaged at the call
            const auto key = acc->add_post_hook(std::make_unique<Hook>(this, j));
            hooks_.push_back({std::move(acc), key});
        }
        if (!st_.buckets.empty()) thread_ = std::thread([this] { loop(); });
        std::lock_guard lk(overlaps_mutex);
        overlaps_alive.push_back(comm_);
    }

    ~Overlap() {
        for (auto& [acc, key] : hooks_) acc->del_post_hook(key);
        bool under_way = false;
        {
            std::lock_guard lk(m_);
            under_way = next_ > 0 || std::any_of(fired_.begin(), fired_.end(), [](char f) { return f; });
        }
        // Ends the step as the call would (not at the process's end: a peer may be gone).
        if (under_way && !detail::process_frees_deferred()) {
            try {
                finish(kAveragerCall, /*rebuild_plan=*/false);
            } catch (const std::exception&) {
            }
        }
        {
            std::lock_guard lk(m_);
            stop_ = true;
        }
        wake_.notify_all();
        if (thread_.joinable()) thread_.join();
        release_memory();
        std::lock_guard lk(overlaps_mutex);
        overlaps_alive.erase(std::find(overlaps_alive.begin(), overlaps_alive.end(), comm_));
    }

    Overlap(const Overlap&) = delete;
    Overlap& operator=(const Overlap&) = delete;

    /// The call after backward(): runs the buckets left, waits, starts a new
    /// step and throws the step's first failure.
    void finish(const char* call, bool rebuild_plan = true) {
        const double called = seconds_now();
        std::unique_lock lk(m_);
        finishing_ = true;
        wake_.notify_all();
        done_.wait(lk, [&] { return next_ == st_.buckets.size(); });
        record_step(called);
        finishing_ = false;
        next_ = 0;
        reset_pending();
        std::fill(fired_.begin(), fired_.end(), 0);
        const std::exception_ptr failure = std::exchange(failure_, nullptr);
        const std::string local = std::exchange(defer_.what, {});
        const std::size_t again = std::exchange(again_, SIZE_MAX);
        const bool again_no_sync = std::exchange(again_no_sync_, false);
        const std::string again_param = again == SIZE_MAX ? std::string() : label_of(st_.entries[again]);
        std::vector<at::Tensor> kept = std::move(keep_);  // released below, on this thread
        keep_.clear();
        if (!rebuilt_ && rebuild_plan) rebuild(call);  // the communication thread is idle
        lk.unlock();
        if (failure) std::rethrow_exception(failure);
        if (!local.empty()) detail::fail(call, local);
        if (again != SIZE_MAX && again_no_sync)
            detail::fail(call, again_param + " got a gradient under no_sync() after a backward() outside "
                                   "it, before the call (its average was under way): run the "
                                   "no_sync() passes first, then the one outside it, then the call");
        if (again != SIZE_MAX)
            detail::fail(call, again_param + " got a gradient twice in one step (two backward() passes "
                                   "before the call): accumulate under no_sync(), or make "
                                   "the call after each backward()");
    }

    /// Parameter indices, bucket by bucket, in the order they are averaged.
    std::vector<std::vector<std::size_t>> plan() {
        std::lock_guard lk(m_);
        std::vector<std::vector<std::size_t>> out;
        for (const Bucket& b : st_.buckets) {
            auto& v = out.emplace_back();
            for (std::size_t k = 0; k < b.entries; ++k) v.push_back(st_.entries[st_.order[b.first + k]].index);
        }
        return out;
    }

    GradAverager::OverlapStats stats() {
        std::lock_guard lk(m_);
        return stats_;
    }

    /// Returns the previous setting.
    bool set_sync(bool on) {
        std::lock_guard lk(m_);
        return std::exchange(sync_, on);
    }

private:
    struct Hook : torch::autograd::FunctionPostHook {
        Hook(Overlap* o, std::size_t e) : ov(o), entry(e) {}
        torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                                  const torch::autograd::variable_list&) override {
            ov->ready(entry);
            return outputs;
        }
        Overlap* ov;
        std::size_t entry;
    };

    static double seconds_now() {
        return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
    }

    /// The step's figures, from the buckets' spans and the moment of the call
    /// (with m_ held, every bucket run).
    void record_step(double called) {
        GradAverager::OverlapStats s;
        s.steps = stats_.steps + 1;
        for (const auto& [from, to] : span_) {
            if (to <= from) continue;  // not run (after a failure)
            ++s.buckets;
            s.averaging += to - from;
            s.hidden += std::max(0.0, std::min(to, called) - from);
        }
        s.left = std::max(0.0, seconds_now() - called);
        stats_ = s;
        std::fill(span_.begin(), span_.end(), std::pair{0.0, 0.0});
    }

    void reset_pending() {
        pending_.resize(st_.buckets.size());
        for (std::size_t b = 0; b < st_.buckets.size(); ++b) pending_[b] = st_.buckets[b].entries;
    }

    /// The plan rebuilt once, at the first call, from the order in which
    /// rank 0's gradients became final in that step (DDP's rebuild_buckets):
    /// those first, then the others in the planned order; broadcast, so every
    /// rank makes the same plan. Called with m_ held.
    void rebuild(const char* call) {
        rebuilt_ = true;
        const std::size_t n = st_.entries.size();
        std::vector<std::int64_t> order;
        order.reserve(n);
        std::vector<char> seen(n, 0);
        for (std::size_t e : observed_) {
            order.push_back(static_cast<std::int64_t>(e));
            seen[e] = 1;
        }
        for (std::size_t e = 0; e < n; ++e)
            if (!seen[e]) order.push_back(static_cast<std::int64_t>(e));
        observed_ = {};
        detail::broadcast(order.data(), n, MPI_INT64_T, 0, comm_, call);
        std::vector<GradEntry> entries(n);
        std::vector<std::size_t> moved(n);  // old position -> new
        for (std::size_t k = 0; k < n; ++k) {
            const auto e = static_cast<std::size_t>(order[k]);
            if (e >= n)  // every rank has the same n (checked at construction)
                detail::fail(call, "internal error: rank 0's bucket order does not fit this rank's parameters");
            entries[k] = std::move(st_.entries[e]);
            moved[e] = k;
        }
        st_.entries = std::move(entries);
        for (std::size_t& j : slot_) j = moved[j];
        st_.largest = st_.largest_fused = plan_overlap_buckets(st_, cap_);
        reset_pending();
        if (views_) {  // from now on each bucket has memory of its own, the gradients' home
            std::vector<std::shared_ptr<BucketMemory>> mem(st_.buckets.size());
            for (std::size_t b = 0; b < mem.size(); ++b) {
                const Bucket& bk = st_.buckets[b];
                const std::size_t bytes = (bk.payload + bk.flags) * bk.wire.size;
                mem[b] = std::make_shared<BucketMemory>();
                mem[b]->shared = detail::collective_memory(bytes, comm_, call);
                if (!mem[b]->shared) mem[b]->own.resize(bytes);
            }
            memory_ = std::move(mem);  // all or none
        }
    }

    /// Gradients still viewing the buckets get their own memory back; the
    /// buckets are freed (collective, as the destruction).
    void release_memory() {
        if (memory_.empty()) return;
        for (GradEntry& e : st_.entries) {
            const at::Tensor& g = e.param.grad();
            if (!g.defined() || g.layout() != at::kStrided) continue;  // a sparse one is its own
            const auto* d = static_cast<const std::byte*>(g.data_ptr());
            for (auto& m : memory_)
                if (d >= m->data() && d < m->data() + m->size()) {
                    e.param.mutable_grad() = g.clone();
                    break;
                }
        }
        std::vector<std::shared_ptr<void>> mems;
        for (auto& m : memory_) mems.push_back(std::move(m));
        memory_.clear();
        free_or_keep(std::move(mems), comm_, kAveragerCall);
    }

    /// A gradient is final (the autograd thread, after accumulating it).
    void ready(std::size_t hooked) {
        std::lock_guard lk(m_);
        const std::size_t entry = slot_[hooked];
        if (!sync_) {  // accumulating; after a backward() outside no_sync(), before the call: too late
            if (fired_[entry] && again_ == SIZE_MAX) again_ = entry, again_no_sync_ = true;
            return;
        }
        if (!rebuilt_ && !fired_[entry]) observed_.push_back(entry);
        if (fired_[entry]) {
            if (again_ == SIZE_MAX) again_ = entry;
            return;
        }
        fired_[entry] = 1;
        if (--pending_[st_.entries[entry].bucket] == 0) wake_.notify_all();
    }

    void loop() {
        torch::NoGradGuard no_grad;
        detail::set_quiet_waits(quiet_);
        const OrderedSums ordered;
        const detail::SiteMark site(site_);  // the construction's call site
        std::unique_lock lk(m_);
        for (;;) {
            wake_.wait(lk, [&] {
                return stop_ || (next_ < st_.buckets.size() &&
                                 (finishing_ || (pending_[next_] == 0 && overlap_alone(comm_, multiple_))));
            });
            if (stop_) return;
            const std::size_t b = next_;
            const bool skip = failure_ != nullptr;  // after a failed collective: none
            lk.unlock();
            std::exception_ptr failed;
            double from = 0, to = 0;
            if (!skip) {
                from = seconds_now();
                try {
                    run(b);
                } catch (...) {
                    failed = std::current_exception();
                }
                to = seconds_now();
            }
            lk.lock();
            if (span_.size() != st_.buckets.size()) span_.resize(st_.buckets.size());
            span_[b] = {from, to};
            if (failed) failure_ = failed;
            if (++next_ == st_.buckets.size()) done_.notify_all();
        }
    }

    /// One bucket, as run_packed averages it (so the results are the same).
    /// With gradient_as_bucket_view, from the second step: in the bucket's
    /// own memory, where the gradients stay as views (no packing once they are).
    void run(std::size_t b) {
        const Bucket& bk = st_.buckets[b];
        for (std::size_t k = 0; k < bk.entries; ++k) {
            GradEntry& e = st_.entries[st_.order[bk.first + k]];
            e.defined_here = e.param.grad().defined();
            if (e.defined_here) keep_.push_back(e.param.grad());
        }
        if (memory_.size() == st_.buckets.size())
            return run_fused(st_, bk, memory_[b]->data(), comm_, size_, kAveragerCall, defer_, memory_[b]);
        if (b == 0) segment_ = fused_segment(st_, comm_);  // every rank starts with bucket 0
        std::byte* base = segment_ ? segment_ : static_cast<std::byte*>(st_.scratch.get(st_.largest));
        run_fused(st_, bk, base, comm_, size_, kAveragerCall, defer_);
    }

    /// A bucket's memory: node-shared where the shared-memory path takes it.
    struct BucketMemory {
        std::unique_ptr<SharedBucket> shared;
        std::vector<std::byte> own;
        std::byte* data() { return shared ? static_cast<std::byte*>(shared->data()) : own.data(); }
        std::size_t size() const { return shared ? shared->size_bytes() : own.size(); }
    };

    GradState& st_;
    const MPI_Comm comm_;
    const int size_;
    const bool quiet_;
    const std::size_t cap_;
    const bool views_;  // gradient_as_bucket_view
    bool multiple_ = false;  // MPI_THREAD_MULTIPLE (set before the thread starts)
    const detail::CallSite site_;
    std::vector<std::shared_ptr<BucketMemory>> memory_;  // per bucket, with views_ after the rebuild
    std::vector<std::pair<std::shared_ptr<torch::autograd::Node>, std::uintptr_t>> hooks_;
    std::thread thread_;
    std::byte* segment_ = nullptr;  // the communication thread's
    Deferred defer_;                // local failures of the step (communication thread)
    std::mutex m_;                  // guards the members below
    std::condition_variable wake_;  // the communication thread waits here
    std::condition_variable done_;  // the call waits here
    std::vector<std::size_t> pending_;  // per bucket: gradients not yet final
    std::vector<char> fired_;           // per entry: final in this step
    std::size_t next_ = 0;              // buckets run in this step
    bool finishing_ = false;
    bool sync_ = true;
    bool stop_ = false;
    std::size_t again_ = SIZE_MAX;  // an entry that got a gradient twice
    bool again_no_sync_ = false;    // the second one under no_sync()
    // The gradients the communication thread may replace, kept until the
    // call: a gradient Python has seen is freed with the GIL, which the
    // thread must never wait for (the caller may hold it).
    std::vector<at::Tensor> keep_;
    std::vector<std::size_t> slot_;     // hooked entry -> its place in st_.entries
    std::vector<std::size_t> observed_; // entries in the order they became final
    bool rebuilt_ = false;
    std::exception_ptr failure_;    // a failed collective
    std::vector<std::pair<double, double>> span_;  // per bucket: run from, to (this step)
    GradAverager::OverlapStats stats_;             // of the last step
};

}  // namespace

namespace detail {
struct GradAveragerImpl {
    MPI_Comm comm = MPI_COMM_NULL;
    int size = 1;
    std::vector<at::Tensor> made;      // the parameters it was made with
    std::vector<std::string> made_names;  // theirs ("" where not known)
    std::vector<std::size_t> frozen;   // of those, not requiring grad then (positions in made)
    std::vector<std::string> frozen_labels;  // how messages name them
    std::weak_ptr<torch::nn::Module> module;  // the model, where it is held by a shared_ptr
    std::vector<at::Tensor> view_params;  // gradients kept in shared buckets
    ViewState views;
    GradState packed;
    std::unique_ptr<Overlap> overlap;  // before packed in destruction: it runs packed's plan
    Dropped number;  // members and id (0: one rank), for buckets kept at destruction
    ~GradAveragerImpl() {
        struct Dropping {
            const Dropped* outer = dropping;
            explicit Dropping(const Dropped* d) { dropping = d; }
            ~Dropping() { dropping = outer; }
        } mark(number.id ? &number : nullptr);
        overlap.reset();
        if (!views.buckets.empty()) release_views(views);
        // Freed as the views' buckets are: after an agreement mpiml sees (a
        // rank that destroys it while another waits in a collective meets a
        // mismatch, the watchdog or the exit guard, not a silent MPI_Win_free).
        if (packed.shared)
            free_or_keep({std::shared_ptr<SharedBucket>(std::move(packed.shared))}, packed.shared_comm,
                         "mpiml::GradAverager");
    }
};
}  // namespace detail

namespace {

// True when the ranks of comm span more than one node (as the shared-memory
// path groups them: MPIML_NODE_SPLIT's simulated nodes count). Collective.
bool spans_nodes(MPI_Comm comm) {
    const std::vector<int> node = detail::node_numbers(comm, kAveragerCall);
    return std::any_of(node.begin(), node.end(), [](int n) { return n > 0; });
}

/// "parameter #3 '1.weight'", or "parameter #3" without a name.
std::string param_label(std::size_t index, const std::string& name) {
    return "parameter #" + std::to_string(index) + (name.empty() ? "" : " '" + name + "'");
}

/// names: params[i]'s name ("" where not known), for messages.
std::unique_ptr<detail::GradAveragerImpl> make_averager(const std::vector<at::Tensor>& params,
                                                        const AvgGradsOptions& asked, MPI_Comm comm,
                                                        const std::vector<std::string>& descs,
                                                        const std::vector<std::string>& names) {
    const int size = num_procs(comm);
    Dropped number;
    if (size > 1) {
        agree_averager(asked, descs, comm, kAveragerCall);
        number.members = members_of(comm);
        number.id = number_and_reclaim(comm, number.members, kAveragerCall);
    }
    AvgGradsOptions opts = asked;  // alike on every rank (agreed)
    if (opts.overlap) {  // alike on every rank (agreed): before any other collective
        int provided = MPI_THREAD_SINGLE;
        MPI_Query_thread(&provided);
        if (size > 1 && provided < MPI_THREAD_SERIALIZED)
            detail::fail(kAveragerCall,
                         "overlap needs MPI_THREAD_SERIALIZED or MPI_THREAD_MULTIPLE, but MPI "
                         "provides " + std::string(provided == MPI_THREAD_FUNNELED ? "MPI_THREAD_FUNNELED"
                                                                                   : "MPI_THREAD_SINGLE") +
                             ": start MPI with mpiml::Session(argc, argv, {.thread_level = "
                             "MPI_THREAD_SERIALIZED})");
    }
    if (opts.overlap && size > 1 && !opts.overlap_on_one_node && !spans_nodes(comm))
        opts.overlap = false;  // one node: nothing to hide (see AvgGradsOptions::overlap)
    auto impl = std::make_unique<detail::GradAveragerImpl>();
    impl->number = std::move(number);
    impl->comm = comm;
    impl->size = size;
    const auto label = [&](std::size_t i) { return param_label(i, i < names.size() ? names[i] : ""); };
    for (std::size_t i = 0; i < params.size(); ++i) {
        const at::Tensor& p = params[i];
        if (!p.defined()) continue;
        if (!p.requires_grad() && has_gradients(p.scalar_type())) {
            impl->frozen.push_back(impl->made.size());
            impl->frozen_labels.push_back(label(i));
        }
        impl->made.push_back(p);
        impl->made_names.push_back(i < names.size() ? names[i] : "");
    }
    std::vector<Eligible> ps;
    eligible_params(params, ps);
    std::vector<std::string> view_labels;
    if (opts.gradient_as_bucket_view && !opts.overlap) {  // overlap keeps views in its own buckets
        std::vector<Eligible> rest;
        for (Eligible& p : ps) {
            if (view_eligible(p.tensor)) {
                impl->view_params.push_back(p.tensor);
                view_labels.push_back(label(p.index));
            } else {
                rest.push_back(std::move(p));
            }
        }
        ps = std::move(rest);
    }
    plan_packed(impl->packed, ps, opts, kAveragerCall);
    for (GradEntry& e : impl->packed.entries) e.label = label(e.index);
    if (impl->size > 1 && !impl->view_params.empty()) {
        plan_views(impl->views, impl->view_params, opts.bucket_cap_bytes, comm);
        impl->views.signature = view_signature(impl->view_params);
        impl->views.labels = std::move(view_labels);
    }
    if (opts.overlap && impl->size > 1)
        impl->overlap = std::make_unique<Overlap>(impl->packed, comm, impl->size, opts.quiet_wait,
                                                  opts.bucket_cap_bytes, opts.gradient_as_bucket_view);
    return impl;
}
/// Why the model no longer has the parameters the averager was made with
/// (empty: it has): one that did not require grad then and does now, or,
/// where the model is known, one added, removed or replaced. Local.
std::string model_changed(const detail::GradAveragerImpl& im) {
    for (std::size_t k = 0; k < im.frozen.size(); ++k)
        if (im.made[im.frozen[k]].requires_grad())
            return im.frozen_labels[k] + " did not require grad when this GradAverager was made and does now: its "
                   "gradient is not averaged; make a new GradAverager after changing requires_grad";
    const auto m = im.module.lock();
    if (!m) return {};
    thread_local std::vector<at::Tensor> now;  // capacity reused across calls
    now.clear();
    collect_params(*m, now);
    std::string why = detail::parameters_changed(im.made, now);
    now.clear();  // hold no tensors between calls
    if (why.empty()) return why;
    std::vector<at::Tensor> named;  // again, with names, for the message
    std::vector<std::string> names;
    for (const auto& e : module_entries(*m, /*with_buffers=*/false)) {
        named.push_back(e.tensor);
        names.push_back(e.name);
    }
    return detail::parameters_changed(im.made, named, im.made_names, names);
}
}  // namespace

GradAverager::GradAverager(torch::nn::Module& module, const AvgGradsOptions& opts, Comm comm,
                           std::source_location loc) {
    detail::SiteMark site(loc);
    const MPI_Comm c = comm.get(kAveragerCall);
    std::vector<at::Tensor> params;
    std::vector<std::string> descs, names;
    for (const auto& e : module_entries(module, /*with_buffers=*/false)) {
        descs.push_back(describe_grad(e.kind, e.name, e.tensor));
        params.push_back(e.tensor);
        names.push_back(e.name);
    }
    impl_ = make_averager(params, opts, c, descs, names);
    try {  // a module not held by a shared_ptr is not checked
        impl_->module = module.shared_from_this();
    } catch (const std::bad_weak_ptr&) {
    }
}

GradAverager::GradAverager(const std::vector<torch::Tensor>& params, const AvgGradsOptions& opts,
                           Comm comm, std::source_location loc) {
    detail::SiteMark site(loc);
    const MPI_Comm c = comm.get(kAveragerCall);
    std::vector<std::string> descs, names(params.size());
    for (std::size_t i = 0; i < params.size(); ++i)
        if (params[i].defined()) {
            const Named e = list_name(i, params[i]);
            descs.push_back(describe_grad(e.kind, e.name, e.tensor));
            if (std::string_view(e.kind) != "tensor") names[i] = e.name;  // named by a binding
        }
    impl_ = make_averager(params, opts, c, descs, names);
}

GradAverager::~GradAverager() = default;

void GradAverager::close() { impl_.reset(); }
GradAverager::GradAverager(GradAverager&&) noexcept = default;
GradAverager& GradAverager::operator=(GradAverager&&) noexcept = default;

std::vector<std::vector<std::size_t>> GradAverager::bucket_plan() const {
    if (!impl_ || !impl_->overlap) return {};
    return impl_->overlap->plan();
}

GradAverager::OverlapStats GradAverager::overlap_stats() const {
    if (!impl_ || !impl_->overlap) return {};
    return impl_->overlap->stats();
}

std::size_t GradAverager::size() const {
    return impl_ ? impl_->view_params.size() + impl_->packed.entries.size() : 0;
}

void GradAverager::operator()(std::source_location loc) {
    detail::SiteMark site(loc);
    if (!impl_) detail::fail(kAveragerCall, "used after close() or after being moved from");
    auto& im = *impl_;
    if (im.size == 1) return;
    const std::string changed = model_changed(im);  // local: thrown after the collectives
    if (im.overlap) {
        im.overlap->finish(kAveragerCall);
    } else {
        const OrderedSums ordered;
        std::exception_ptr deferred;
        if (!im.views.buckets.empty()) {
            try {
                run_views(im.views, im.view_params, kAveragerCall);
            } catch (const Error&) {  // local: the packed collectives still run
                deferred = std::current_exception();
            }
        }
        run_packed(im.packed, im.comm, im.size, kAveragerCall);
        if (deferred) std::rethrow_exception(deferred);
    }
    if (!changed.empty()) detail::fail(kAveragerCall, changed);
}

std::string detail::parameters_changed(const std::vector<torch::Tensor>& made,
                                       const std::vector<torch::Tensor>& now,
                                       const std::vector<std::string>& made_names,
                                       const std::vector<std::string>& now_names) {
    const std::string remedy = ": make a new GradAverager after changing the model's parameters";
    const auto name = [](const std::vector<std::string>& names, std::size_t i) {
        return i < names.size() && !names[i].empty() ? " '" + names[i] + "'" : std::string();
    };
    const auto removed = [&](std::size_t k) {
        return "the model no longer has parameter #" + std::to_string(k) + name(made_names, k) +
               " of those this GradAverager was made with (removed since)" + remedy;
    };
    const auto among = [&](std::size_t from, std::size_t to, const c10::TensorImpl* t) {
        return std::any_of(made.begin() + static_cast<std::ptrdiff_t>(from),
                           made.begin() + static_cast<std::ptrdiff_t>(to),
                           [&](const at::Tensor& m) { return m.unsafeGetTensorImpl() == t; });
    };
    std::size_t k = 0;  // parameters of the model matched so far
    for (std::size_t j = 0; j < now.size(); ++j) {
        const at::Tensor& t = now[j];
        if (!t.defined()) continue;
        const c10::TensorImpl* p = t.unsafeGetTensorImpl();
        if (k < made.size() && made[k].unsafeGetTensorImpl() == p) {
            ++k;
        } else if (!among(0, k, p)) {  // else tied: listed before
            if (among(k, made.size(), p)) return removed(k);
            return "the model's parameter #" + std::to_string(k) + name(now_names, j) +
                   " is not one this GradAverager was made with (" +
                   (k < made.size() ? "added or replaced" : "added") +
                   " since), so its gradient would not be averaged" + remedy;
        }
    }
    if (k < made.size()) return removed(k);
    return {};
}

GradAverager::NoSync::NoSync(GradAverager& avg) : impl_(avg.impl_.get()), was_(true) {
    if (!impl_) detail::fail(kAveragerCall, "no_sync() on an averager moved from");
    if (impl_->overlap) was_ = impl_->overlap->set_sync(false);
}

GradAverager::NoSync::~NoSync() {
    if (impl_->overlap) impl_->overlap->set_sync(was_);
}

void mpi_avg_grads(torch::nn::Module& module, const AvgGradsOptions& opts, Comm comm,
                   std::source_location loc) {
    detail::SiteMark site(loc);
    const MPI_Comm c = comm.get("mpiml::mpi_avg_grads");
    if (check_enabled()) {
        const std::vector<Named> entries = module_entries(module, /*with_buffers=*/false);
        std::vector<std::string> descs;
        std::vector<at::Tensor> params;
        for (const auto& e : entries) {
            descs.push_back(describe_grad(e.kind, e.name, e.tensor));
            params.push_back(e.tensor);
        }
        return avg_grads(params, opts, c, &descs);
    }
    thread_local std::vector<at::Tensor> params;  // capacity reused across calls
    struct Release {
        ~Release() { params.clear(); }  // hold no tensors between calls
    } release;
    collect_params(module, params);
    avg_grads(params, opts, c, nullptr);
}

void mpi_avg_grads(const std::vector<torch::Tensor>& params, const AvgGradsOptions& opts,
                   Comm comm, std::source_location loc) {
    detail::SiteMark site(loc);
    const MPI_Comm c = comm.get("mpiml::mpi_avg_grads");
    if (check_enabled()) {
        std::vector<std::string> descs;
        for (std::size_t i = 0; i < params.size(); ++i)
            if (params[i].defined()) {
                const Named e = list_name(i, params[i]);
                descs.push_back(describe_grad(e.kind, e.name, e.tensor));
            }
        return avg_grads(params, opts, c, &descs);
    }
    avg_grads(params, opts, c, nullptr);
}

}  // namespace mpiml
