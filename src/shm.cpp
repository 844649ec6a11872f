// Shared-memory allreduce and broadcast over MPI-3 shared windows.
//
// Per communicator, a context holds the node communicator (ranks sharing
// memory), a leader communicator (node rank 0 of every node) and one window
// in which every node rank owns a flag line and two chunk-sized buffer sets.
// Large buffers go through the sets chunk by chunk; chunk k uses set k % 2.
// Every round has a node barrier that each rank enters after its reads of the
// previous round and before its writes of the next one, so a set is never
// rewritten while a peer still reads it.
//
// allreduce round, p node ranks, rank r owns slice r of the chunk:
//   1. r copies its slices q != r into its own set.
//   2. barrier; r reduces slice r over all ranks in rank order (its own part
//      straight from its send buffer) into its set, and into recv.
//   3. barrier; r copies the reduced slices q != r into recv.
// With several nodes of one size, rank r exchanges its reduced slice with
// node rank r of the other nodes (a peer communicator, in node order) and
// folds the node results in node order before step 3 (run_allreduce_peers).
// Nodes of unequal size: the leader gathers the reduced slices, reduces
// across leaders (deterministic reduce-scatter + allgather over MPI),
// barrier, and every rank copies the chunk from the leader's set.
#include "shm.hpp"

#include "config.hpp"
#include "agreement.hpp"
#include "call.hpp"
#include "state.hpp"
#include "types.hpp"

#include <mpiml/error.hpp>
#include <mpiml/shm.hpp>

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <climits>
#include <complex>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

namespace mpiml {
namespace detail {
namespace {

// Defaults of the thresholds and chunk: src/config.cpp. Across nodes, small
// messages pay node barriers and a peer exchange instead of one
// MPI_Allreduce, so auto mode leaves those to MPI. Nodes of unequal size take
// the leader path (one leader per node exchanges, serialized with the node
// work): on the 2-host test bed it lost to MPI_Allreduce above 4 MiB
// (BENCHMARKS.md, "Across hosts"), so auto leaves larger messages to MPI there.
constexpr std::size_t kMultiNodeMinimum = std::size_t{64} << 10;
constexpr std::size_t kLeaderPathMaximum = std::size_t{4} << 20;
constexpr std::size_t kLine = 64;     // slice alignment, bytes
constexpr int kPeerDepth = 4;         // exchanges in flight at once across 2 nodes
constexpr std::size_t kHeader = 128;  // flag line (+ the adjacent line)
constexpr std::size_t kBlock = 4096;  // reduction block, bytes (stays in L1)

// MPI_Win_allocate_shared guarantees no alignment (Open MPI's segments can be
// 8 mod 16), so windows are kLine bytes larger and every segment is used
// from its first kLine-aligned byte. Pages map at the same offsets in every
// process, so all ranks agree on the adjustment.
char* align_line(void* p) {
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    return static_cast<char*>(p) + (kLine - a % kLine) % kLine;
}

// ------------------------------------------------------------ configuration

shm::Config& config_ref() {
    static shm::Config c = env_config().shm;  // MPIML_SHM* (src/config.cpp)
    return c;
}

// ------------------------------------------------------------------ kernels

template <class T>
struct is_complex : std::false_type {};
template <class U>
struct is_complex<std::complex<U>> : std::true_type {};

template <class T>
constexpr bool is_int = std::is_integral_v<T> && !std::is_same_v<T, bool>;

// Integer arithmetic wraps (in unsigned, at least unsigned int wide), as MPI's
// built-in ops do in practice, without signed overflow.
template <class T>
using wide_unsigned_t =
    std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;

template <class T, Op O>
struct Fn;
template <class T>
struct Fn<T, Op::sum> {
    static T apply(T a, T b) {
        if constexpr (is_int<T>) {
            using U = wide_unsigned_t<T>;
            return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
        } else {
            return a + b;
        }
    }
};
template <class T>
struct Fn<T, Op::prod> {
    static T apply(T a, T b) {
        if constexpr (is_int<T>) {
            using U = wide_unsigned_t<T>;
            return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
        } else {
            return a * b;
        }
    }
};
template <class T>
struct Fn<T, Op::min> {
    static T apply(T a, T b) { return b < a ? b : a; }
};
template <class T>
struct Fn<T, Op::max> {
    static T apply(T a, T b) { return a < b ? b : a; }
};
template <class T>
struct Fn<T, Op::land> {
    static T apply(T a, T b) { return static_cast<T>((a != T{}) & (b != T{})); }
};
template <class T>
struct Fn<T, Op::lor> {
    static T apply(T a, T b) { return static_cast<T>((a != T{}) | (b != T{})); }
};
template <class T>
struct Fn<T, Op::lxor> {
    static T apply(T a, T b) { return static_cast<T>((a != T{}) ^ (b != T{})); }
};
template <class T>
struct Fn<T, Op::band> {
    static T apply(T a, T b) { return static_cast<T>(a & b); }
};
template <class T>
struct Fn<T, Op::bor> {
    static T apply(T a, T b) { return static_cast<T>(a | b); }
};
template <class T>
struct Fn<T, Op::bxor> {
    static T apply(T a, T b) { return static_cast<T>(a ^ b); }
};

template <class T, Op O>
constexpr bool allowed() {
    return op_allowed(O, class_of<T>());
}

using CombineFn = void (*)(void* out, const void* const* in, int p, std::size_t m);
using DivideFn = void (*)(void* buf, std::size_t m, int p);

// out[i] = in[0][i] op in[1][i] op ... op in[p-1][i], in this order.
template <class T, Op O>
void combine(void* out_, const void* const* in, int p, std::size_t m) {
    T* __restrict out = static_cast<T*>(out_);
    const T* a = static_cast<const T*>(in[0]);
    if (p == 1) {
        std::memcpy(out, a, m * sizeof(T));
        return;
    }
    const T* b = static_cast<const T*>(in[1]);
    for (std::size_t i = 0; i < m; ++i) out[i] = Fn<T, O>::apply(a[i], b[i]);
    for (int q = 2; q < p; ++q) {
        const T* c = static_cast<const T*>(in[q]);
        for (std::size_t i = 0; i < m; ++i) out[i] = Fn<T, O>::apply(out[i], c[i]);
    }
}

template <class T>
void divide(void* buf, std::size_t m, int p) {
    T* __restrict x = static_cast<T*>(buf);
    if constexpr (is_complex<T>::value) {
        const typename T::value_type d = static_cast<typename T::value_type>(p);
        for (std::size_t i = 0; i < m; ++i) x[i] = x[i] / d;
    } else {
        const T d = static_cast<T>(p);
        for (std::size_t i = 0; i < m; ++i) x[i] = x[i] / d;
    }
}

struct Kernel {
    CombineFn combine = nullptr;
    DivideFn divide = nullptr;  // floating and complex types only
    std::size_t tsize = 0;
};

template <class T, Op O>
CombineFn combine_for() {
    if constexpr (allowed<T, O>()) return &combine<T, O>;
    else return nullptr;
}

template <class T>
Kernel kernel_of(Op op) {
    Kernel k;
    k.tsize = sizeof(T);
    if constexpr (std::is_floating_point_v<T> || is_complex<T>::value) k.divide = &divide<T>;
    switch (op) {
        case Op::sum: k.combine = combine_for<T, Op::sum>(); break;
        case Op::prod: k.combine = combine_for<T, Op::prod>(); break;
        case Op::min: k.combine = combine_for<T, Op::min>(); break;
        case Op::max: k.combine = combine_for<T, Op::max>(); break;
        case Op::land: k.combine = combine_for<T, Op::land>(); break;
        case Op::lor: k.combine = combine_for<T, Op::lor>(); break;
        case Op::lxor: k.combine = combine_for<T, Op::lxor>(); break;
        case Op::band: k.combine = combine_for<T, Op::band>(); break;
        case Op::bor: k.combine = combine_for<T, Op::bor>(); break;
        case Op::bxor: k.combine = combine_for<T, Op::bxor>(); break;
    }
    return k;
}

// The kernel for a built-in datatype and op; combine == nullptr when unsupported
// (types the registry leaves to MPI, such as MPI_WCHAR, and illegal ops).
Kernel resolve(MPI_Datatype t, Op op) {
    const TypeInfo* e = find_type(t);
    if (!e) return {};
    Kernel k = with_rep(e->rep, [&]<class T>(std::type_identity<T>) -> Kernel {
        if constexpr (std::is_void_v<T>) return {};
        else return kernel_of<T>(op);
    });
    int size = 0;
    if (!k.combine || MPI_Type_size(t, &size) != MPI_SUCCESS || static_cast<std::size_t>(size) != k.tsize)
        return {};
    return k;
}

// out1 (and out2 if not null) = the reduction of in[0..p) over m elements,
// divided by divide_by when it is > 1. Outputs may alias inputs: each block is
// reduced into a private buffer first.
void reduce_slice(const Kernel& k, const char* const* in, int p, std::size_t m, char* out1,
                  char* out2, int divide_by) {
    alignas(64) static thread_local char tmp[kBlock];
    static thread_local std::vector<const void*> ptrs;
    ptrs.resize(static_cast<std::size_t>(p));
    const std::size_t per = kBlock / k.tsize;
    for (std::size_t b = 0; b < m; b += per) {
        const std::size_t mb = std::min(per, m - b);
        const std::size_t off = b * k.tsize, nb = mb * k.tsize;
        for (int q = 0; q < p; ++q) ptrs[q] = in[q] + off;
        k.combine(tmp, ptrs.data(), p, mb);
        if (divide_by > 1) k.divide(tmp, mb, divide_by);
        std::memcpy(out1 + off, tmp, nb);
        if (out2) std::memcpy(out2 + off, tmp, nb);
    }
}

// m elements split into p slices aligned to cache lines.
struct Slices {
    Slices(std::size_t m_, int p_, std::size_t tsize)
        : m(m_), p(p_), unit(std::max<std::size_t>(1, kLine / tsize)),
          units((m_ + unit - 1) / unit) {}
    std::size_t off(int q) const { return std::min(m, units * q / p * unit); }
    std::size_t len(int q) const { return off(q + 1) - off(q); }
    std::size_t m;
    int p;
    std::size_t unit, units;
};

// Copy for destinations not read again soon (large results): non-temporal
// stores skip reading the destination lines first. Plain memcpy elsewhere.
constexpr std::size_t kStreamMin = std::size_t{1} << 20;
void stream_copy(char* dst, const char* src, std::size_t n) {
#if defined(__SSE2__)
    if (n >= kStreamMin) {
        const std::size_t head = (16 - reinterpret_cast<std::uintptr_t>(dst) % 16) % 16;
        std::memcpy(dst, src, head);
        dst += head;
        src += head;
        n -= head;
        const std::size_t body = n / 64 * 64;
        for (std::size_t i = 0; i < body; i += 64) {
            const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
            const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
            const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
            const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
            _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
            _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
            _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
            _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
        }
        _mm_sfence();  // order the streaming stores before the barrier's flag
        std::memcpy(dst + body, src + body, n - body);
        return;
    }
#endif
    std::memcpy(dst, src, n);
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

}  // namespace

// ------------------------------------------------------------------ context

struct ShmContext {
    MPI_Comm node = MPI_COMM_NULL;     // ranks of comm sharing memory (owned)
    MPI_Comm leaders = MPI_COMM_NULL;  // node rank 0 of every node (owned; null elsewhere)
    MPI_Comm peers = MPI_COMM_NULL;    // same node rank on every node, in node order (owned;
                                       // only with several nodes all of one size)
    int peer_rank = -1;                // this node's place in the node order
    int rank = 0, size = 1;            // in the user's communicator
    int node_rank = 0, node_size = 1, num_nodes = 1, leader_rank = -1, max_node_size = 1;
    std::vector<int> leader_of;        // comm rank -> leader rank of its node
    std::vector<int> node_rank_of;     // comm rank -> its node rank
    MPI_Win win = MPI_WIN_NULL;
    std::size_t chunk = 0;             // bytes per buffer set
    std::vector<char*> data;           // node rank -> its two buffer sets
    std::vector<std::uint64_t*> flag;  // node rank -> its barrier flag
    std::uint64_t epoch = 0;
    std::uint64_t round = 0;
    int spin_limit = 64;               // pauses before yielding (see barrier)
    std::vector<char> scratch;         // leader reduce-scatter
    std::vector<char> inbox;           // slices received from the other node (kPeerDepth)
    bool alive = false;

    char* set(int q) const { return data[q] + (round % 2) * chunk; }

    // Flags in shared memory: a seq_cst store on arrival, acquire on every
    // peer. A waiter spins (long when every rank has a core of its own,
    // briefly when ranks outnumber cores), yields for kYieldTime, then sleeps
    // on a futex on the low half of the peer's flag after counting itself in
    // the peer's waiter word; an arriving rank wakes only when that count is
    // non-zero, so the uncontended path stays a store. Store-then-load on
    // both sides (seq_cst) means either the waiter sees the new epoch or the
    // arriving rank sees the waiter; FUTEX_WAIT re-checks the word itself.
    void barrier() {
        ++epoch;
        std::atomic_ref<std::uint64_t>(*flag[node_rank]).store(epoch, std::memory_order_seq_cst);
        if (std::atomic_ref<std::uint32_t>(*waiters(node_rank)).load(std::memory_order_seq_cst) != 0)
            futex_wake(futex_word(node_rank));
        for (int q = 0; q < node_size; ++q) {
            if (q == node_rank) continue;
            std::atomic_ref<std::uint64_t> f(*flag[q]);
            std::chrono::steady_clock::time_point yielding;
            for (int spins = 0; f.load(std::memory_order_acquire) < epoch; ++spins) {
                if (spins < spin_limit) {
                    cpu_relax();
                    continue;
                }
                const auto now = std::chrono::steady_clock::now();
                if (spins == spin_limit) {
                    yielding = now;
                } else if (now - yielding > kYieldTime) {
                    sleep_on(q);
                    break;
                }
                sched_yield();
            }
        }
    }

    // Yielding before sleeping: a peer that is about to arrive (ranks
    // outnumbering cores) costs no wake-up.
    static constexpr auto kYieldTime = std::chrono::microseconds(100);
    std::uint32_t* waiters(int q) const {
        return reinterpret_cast<std::uint32_t*>(reinterpret_cast<char*>(flag[q]) + 8);
    }
    std::uint32_t* futex_word(int q) const {  // low half of the 64-bit flag
        static_assert(std::endian::native == std::endian::little);
        return reinterpret_cast<std::uint32_t*>(flag[q]);
    }
    static void futex_wake(std::uint32_t* word) {
        // Not FUTEX_PRIVATE: the word is in memory shared between processes.
        syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
    }
    // Blocks until peer q's flag reaches epoch. The timeout is only a safety
    // net; a job stuck here is ended by the watchdog, from its own thread.
    void sleep_on(int q) {
        std::atomic_ref<std::uint64_t> f(*flag[q]);
        std::atomic_ref<std::uint32_t> w(*waiters(q));
        w.fetch_add(1, std::memory_order_seq_cst);
        for (;;) {
            const std::uint64_t v = f.load(std::memory_order_seq_cst);
            if (v >= epoch) break;
            const timespec limit{0, 50'000'000};
            syscall(SYS_futex, futex_word(q), FUTEX_WAIT, static_cast<std::uint32_t>(v), &limit,
                    nullptr, 0);
        }
        w.fetch_sub(1, std::memory_order_relaxed);
    }

    void release() noexcept {
        if (!alive) return;
        alive = false;
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (finalized) return;
        if (win != MPI_WIN_NULL) {
            MPI_Win_unlock_all(win);
            MPI_Win_free(&win);
        }
        if (peers != MPI_COMM_NULL) MPI_Comm_free(&peers);
        if (leaders != MPI_COMM_NULL) MPI_Comm_free(&leaders);
        if (node != MPI_COMM_NULL) MPI_Comm_free(&node);
    }
};

namespace {

int ctx_keyval = MPI_KEYVAL_INVALID;
bool hook_registered = false;

// Never destroyed: buckets may be released from static destructors.
std::vector<std::weak_ptr<ShmContext>>& contexts() {
    static auto* v = new std::vector<std::weak_ptr<ShmContext>>;
    return *v;
}

// Shared buckets still alive, by creation number (freed in that order).
std::map<std::size_t, MPI_Win>& bucket_windows() {
    static auto* m = new std::map<std::size_t, MPI_Win>;
    return *m;
}
std::size_t next_bucket_id = 0;

// Per-thread cache of the last communicator's context: looking the attribute
// up costs Open MPI a lock and a hash lookup on every call. Any context
// deletion bumps the generation, so a freed (and possibly reused) handle is
// never served from the cache.
std::atomic<std::uint64_t> ctx_generation{0};
struct ContextCache {
    MPI_Comm comm = MPI_COMM_NULL;
    ShmContext* ctx = nullptr;
    std::uint64_t generation = ~std::uint64_t{0};
};
thread_local ContextCache ctx_cache;

// Inside MPI_Finalize, in creation order on every rank (so collectively).
void finalize_shm() {
    ctx_generation.fetch_add(1, std::memory_order_acq_rel);
    for (auto& [id, w] : bucket_windows()) {
        MPI_Win_unlock_all(w);
        MPI_Win_free(&w);
    }
    bucket_windows().clear();
    for (auto& w : contexts())
        if (auto c = w.lock()) c->release();
    contexts().clear();
}

int delete_ctx(MPI_Comm, int, void* value, void*) {
    ctx_generation.fetch_add(1, std::memory_order_acq_rel);
    auto* holder = static_cast<std::shared_ptr<ShmContext>*>(value);
    (*holder)->release();
    delete holder;
    return MPI_SUCCESS;
}

MPI_Info noncontig_info() {
    MPI_Info info;
    MPI_Info_create(&info);
    MPI_Info_set(info, "alloc_shared_noncontig", "true");
    return info;
}

std::shared_ptr<ShmContext> create_context(MPI_Comm comm, const char* call) {
    const auto& cfg = config_ref();
    auto c = std::make_shared<ShmContext>();
    check_mpi(MPI_Comm_rank(comm, &c->rank), call);
    check_mpi(MPI_Comm_size(comm, &c->size), call);
    MPI_Comm shared = MPI_COMM_NULL;
    check_mpi(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, c->rank, MPI_INFO_NULL, &shared),
              call);
    if (cfg.node_split > 0) {
        check_mpi(MPI_Comm_split(shared, c->rank / cfg.node_split, c->rank, &c->node), call);
        MPI_Comm_free(&shared);
    } else {
        c->node = shared;
    }
    c->alive = true;  // from here on, release() frees what exists
    check_mpi(MPI_Comm_rank(c->node, &c->node_rank), call);
    check_mpi(MPI_Comm_size(c->node, &c->node_size), call);
    check_mpi(MPI_Comm_split(comm, c->node_rank == 0 ? 0 : MPI_UNDEFINED, c->rank, &c->leaders),
              call);
    int lead[2] = {-1, 0};  // leader rank, number of nodes
    if (c->leaders != MPI_COMM_NULL) {
        check_mpi(MPI_Comm_rank(c->leaders, &lead[0]), call);
        check_mpi(MPI_Comm_size(c->leaders, &lead[1]), call);
        c->leader_rank = lead[0];
    }
    check_mpi(MPI_Bcast(lead, 2, MPI_INT, 0, c->node), call);
    c->num_nodes = lead[1];
    const int mine[3] = {lead[0], c->node_rank, c->node_size};
    std::vector<int> all(3 * static_cast<std::size_t>(c->size));
    check_mpi(MPI_Allgather(mine, 3, MPI_INT, all.data(), 3, MPI_INT, comm), call);
    c->leader_of.resize(c->size);
    c->node_rank_of.resize(c->size);
    int min_node_size = c->size;
    for (int r = 0; r < c->size; ++r) {
        c->leader_of[r] = all[3 * r];
        c->node_rank_of[r] = all[3 * r + 1];
        c->max_node_size = std::max(c->max_node_size, all[3 * r + 2]);
        min_node_size = std::min(min_node_size, all[3 * r + 2]);
    }
    // Nodes of one size: node rank q of every node exchanges slice q with
    // its peers, ordered by their node's leader rank (the node order).
    if (c->num_nodes > 1 && min_node_size == c->max_node_size) {
        check_mpi(MPI_Comm_split(comm, c->node_rank, c->leader_of[c->rank], &c->peers), call);
        check_mpi(MPI_Comm_rank(c->peers, &c->peer_rank), call);
    }

    c->chunk = cfg.chunk;
    void* base = nullptr;
    MPI_Info info = noncontig_info();
    const int rc = MPI_Win_allocate_shared(static_cast<MPI_Aint>(kLine + kHeader + 2 * c->chunk), 1, info,
                                           c->node, &base, &c->win);
    MPI_Info_free(&info);
    check_mpi(rc, call);
    MPI_Win_set_errhandler(c->win, MPI_ERRORS_RETURN);
    check_mpi(MPI_Win_lock_all(MPI_MODE_NOCHECK, c->win), call);
    c->data.resize(c->node_size);
    c->flag.resize(c->node_size);
    for (int q = 0; q < c->node_size; ++q) {
        MPI_Aint sz = 0;
        int disp = 0;
        void* ptr = nullptr;
        check_mpi(MPI_Win_shared_query(c->win, q, &sz, &disp, &ptr), call);
        char* const seg = align_line(ptr);
        c->flag[q] = reinterpret_cast<std::uint64_t*>(seg);
        c->data[q] = seg + kHeader;
    }
    std::atomic_ref<std::uint64_t>(*c->flag[c->node_rank]).store(0, std::memory_order_release);
    std::atomic_ref<std::uint32_t>(*c->waiters(c->node_rank)).store(0, std::memory_order_release);
    check_mpi(MPI_Barrier(c->node), call);
    if (c->num_nodes > 1) c->scratch.resize(c->chunk + kLine * c->num_nodes);
    if (c->peers != MPI_COMM_NULL && c->num_nodes == 2) c->inbox.resize(kPeerDepth * (c->chunk + kLine));
    const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    c->spin_limit = cpus > 0 && c->node_size <= cpus ? 4096 : 64;
    return c;
}

// The context of comm, created collectively on first use.
std::shared_ptr<ShmContext> context(MPI_Comm comm, const char* call) {
    if (ctx_keyval == MPI_KEYVAL_INVALID)
        check_mpi(MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, delete_ctx, &ctx_keyval, nullptr),
                  "MPI_Comm_create_keyval");
    void* v = nullptr;
    int flag = 0;
    check_mpi(MPI_Comm_get_attr(comm, ctx_keyval, &v, &flag), call);
    if (flag) {
        auto c = *static_cast<std::shared_ptr<ShmContext>*>(v);
        if (!c->alive) fail(call, "shared-memory context used after MPI finalization began");
        return c;
    }
    auto c = create_context(comm, call);
    check_mpi(MPI_Comm_set_attr(comm, ctx_keyval, new std::shared_ptr<ShmContext>(c)), call);
    contexts().push_back(c);
    if (!hook_registered) {
        register_finalize_hook(&finalize_shm);
        hook_registered = true;
    }
    return c;
}

bool usable_comm(MPI_Comm comm);

// Automatic mode, past the size thresholds: a node with at least 2 ranks;
// across nodes from kMultiNodeMinimum, and on the leader path (nodes of
// unequal size) up to kLeaderPathMaximum.
bool worth_sharing(const ShmContext& c, std::size_t bytes) {
    if (c.max_node_size < 2) return false;
    if (c.num_nodes == 1) return true;
    return bytes >= kMultiNodeMinimum && (c.peers != MPI_COMM_NULL || bytes <= kLeaderPathMaximum);
}

// context(), through the per-thread cache; nullptr for an inter-communicator.
ShmContext* cached_context(MPI_Comm comm, const char* call) {
    const std::uint64_t gen = ctx_generation.load(std::memory_order_acquire);
    if (ctx_cache.comm == comm && ctx_cache.generation == gen) return ctx_cache.ctx;
    if (!usable_comm(comm)) return nullptr;
    ShmContext* c = context(comm, call).get();
    ctx_cache = {comm, c, gen};
    return c;
}

// The one path decision: the context of comm when a collective of bytes
// bytes takes the shared-memory path (mode; in auto mode, at least threshold
// bytes and worth_sharing), else nullptr. Collective the first time on comm
// (it creates the context); the same answer on every rank.
ShmContext* shared_context_for(std::size_t bytes, std::size_t threshold, MPI_Comm comm,
                               const char* call) {
    const shm::Mode mode = config_ref().mode;
    if (mode == shm::Mode::off) return nullptr;
    if (mode == shm::Mode::automatic && bytes < threshold) return nullptr;
    ShmContext* c = cached_context(comm, call);
    if (!c) return nullptr;
    if (mode == shm::Mode::automatic && !worth_sharing(*c, bytes)) return nullptr;
    return c;
}

// Deterministic allreduce of m elements of buf across the nodes, over group
// (leaders, or the peers of one node rank; rank me of L, in node order): rank
// j reduces slice j over all nodes in node order, then all gather.
void group_allreduce(ShmContext& c, MPI_Comm group, int me, char* buf, std::size_t m,
                     const Kernel& k, int divide_by, const char* call) {
    const int L = c.num_nodes;
    const std::size_t ts = k.tsize;
    const std::size_t piece = c.chunk / ts;
    std::vector<int> scount(L), sdispl(L), rcount(L), rdispl(L);
    std::vector<const char*> in(L);
    for (std::size_t done = 0; done < m; done += piece) {
        const std::size_t n = std::min(piece, m - done);
        char* b = buf + done * ts;
        const Slices sl(n, L, ts);
        const std::size_t mylen = sl.len(me);
        for (int j = 0; j < L; ++j) {
            scount[j] = static_cast<int>(sl.len(j) * ts);
            sdispl[j] = static_cast<int>(sl.off(j) * ts);
            rcount[j] = static_cast<int>(mylen * ts);
            rdispl[j] = static_cast<int>(j * mylen * ts);
            in[j] = c.scratch.data() + rdispl[j];
        }
        check_mpi(MPI_Alltoallv(b, scount.data(), sdispl.data(), MPI_BYTE, c.scratch.data(),
                                rcount.data(), rdispl.data(), MPI_BYTE, group),
                  call);
        reduce_slice(k, in.data(), L, mylen, b + sl.off(me) * ts, nullptr, divide_by);
        check_mpi(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, b, scount.data(),
                                 sdispl.data(), MPI_BYTE, group),
                  call);
    }
}

// Starts the exchange of bytes at out with the other node's peer (2 nodes),
// received into inbox slot i % kPeerDepth; returns where the peer's bytes land.
char* post_pair_exchange(ShmContext& c, std::size_t i, char* out, std::size_t bytes, int tag,
                         MPI_Request (&req)[2], const char* call) {
    char* got = c.inbox.data() + (i % kPeerDepth) * (c.chunk + kLine);
    const int other = 1 - c.peer_rank;
    const int n = static_cast<int>(bytes);
    check_mpi(MPI_Irecv(got, n, MPI_BYTE, other, tag, c.peers, &req[0]), call);
    check_mpi(MPI_Isend(out, n, MPI_BYTE, other, tag, c.peers, &req[1]), call);
    return got;
}

// The same across exactly 2 nodes with one peer (rank other of c.peers):
// buf goes out in chunk-sized pieces, kPeerDepth in flight, and each piece
// is folded in node order (then divided) as it arrives.
void pair_allreduce(ShmContext& c, char* buf, std::size_t m, const Kernel& k, int divide_by,
                    const char* call) {
    const std::size_t ts = k.tsize, per = c.chunk / ts;
    const std::size_t pieces = (m + per - 1) / per;
    const int other = 1 - c.peer_rank;
    MPI_Request req[kPeerDepth][2];
    const char* got[kPeerDepth] = {};
    auto post = [&](std::size_t i) {
        const std::size_t n = std::min(per, m - i * per);
        got[i % kPeerDepth] = post_pair_exchange(c, i, buf + i * per * ts, n * ts, 1, req[i % kPeerDepth], call);
    };
    for (std::size_t i = 0; i < std::min<std::size_t>(pieces, kPeerDepth); ++i) post(i);
    for (std::size_t i = 0; i < pieces; ++i) {
        check_mpi(MPI_Waitall(2, req[i % kPeerDepth], MPI_STATUSES_IGNORE), call);
        const std::size_t n = std::min(per, m - i * per);
        char* mine = buf + i * per * ts;
        const char* ins[2];
        ins[c.peer_rank] = mine;
        ins[other] = got[i % kPeerDepth];
        reduce_slice(k, ins, 2, n, mine, nullptr, divide_by);
        if (i + kPeerDepth < pieces) post(i + kPeerDepth);
    }
}

void leader_allreduce(ShmContext& c, char* buf, std::size_t m, const Kernel& k, int divide_by,
                      const char* call) {
    group_allreduce(c, c.leaders, c.leader_rank, buf, m, k, divide_by, call);
}

// Slice q of a chunk of m elements when every chunk is cut like the first
// one (base elements) and the last, shorter one clipped: rank q owns the same
// bytes of every set in every chunk, so a set's slice is never read by one
// rank while its owner writes it for a later chunk.
struct FixedSlices {
    FixedSlices(std::size_t base, std::size_t m_, int p, std::size_t ts) : full(base, p, ts), m(m_) {}
    std::size_t off(int q) const { return std::min(m, full.off(q)); }
    std::size_t len(int q) const { return off(q + 1) - off(q); }
    Slices full;
    std::size_t m;
};

// The hierarchical allreduce with nodes of one size. Node rank r, per chunk:
// reduces slice r over its node (shared memory) into recv, exchanges it with
// node rank r of every other node (every rank uses the network at once), folds
// the node results in node order into recv and into its set, and the node
// copies the slices from the sets. One node barrier per step: step t copies
// chunk t into the sets and writes the folded slice of chunk t - D, barrier,
// then reduces chunk t (and starts its exchange) and copies chunk t - D out.
// With 2 nodes D exchanges are in flight while the node works; with more,
// each exchange is a blocking reduce-scatter + allgather (D = 1).
void run_allreduce_peers(ShmContext& c, const char* send, char* recv, std::size_t count,
                         const Kernel& k, const char* call) {
    const std::size_t ts = k.tsize;
    const std::size_t per = c.chunk / ts;
    const int p = c.node_size, me = c.node_rank;
    const bool pair = c.num_nodes == 2;
    const std::size_t base = std::min(per, count);
    const std::size_t chunks = (count + per - 1) / per;
    const std::size_t depth = pair ? std::min<std::size_t>(kPeerDepth, chunks) : 1;
    std::vector<const char*> in(p);
    struct Exchange {
        char* out = nullptr;  // this rank's slice in recv (sent; the result goes here)
        char* got = nullptr;  // the other node's slice
        std::size_t len = 0;
        MPI_Request req[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    };
    Exchange ex[kPeerDepth];
    const int other = 1 - c.peer_rank;
    for (std::size_t t = 0; t < chunks + depth; ++t) {
        ++c.round;
        const bool reduce = t < chunks, fold = t >= depth;
        const std::size_t j = t - depth;  // chunk folded and copied out (if fold)
        const std::size_t m = reduce ? std::min(per, count - t * per) : 0;
        const char* s = reduce ? send + t * per * ts : send;
        char* r = reduce ? recv + t * per * ts : recv;
        const FixedSlices sl(base, m, p, ts);
        char* mine = c.set(me);
        if (reduce)
            for (int q = 0; q < p; ++q)
                if (q != me) std::memcpy(mine + sl.off(q) * ts, s + sl.off(q) * ts, sl.len(q) * ts);
        const std::size_t mj = fold ? std::min(per, count - j * per) : 0;
        const FixedSlices slj(base, mj, p, ts);
        Exchange& e = ex[j % kPeerDepth];
        if (fold) {
            char* shared = mine + slj.off(me) * ts;
            if (pair) {
                check_mpi(MPI_Waitall(2, e.req, MPI_STATUSES_IGNORE), call);
                const char* ins[2];
                ins[c.peer_rank] = e.out;
                ins[other] = e.got;
                reduce_slice(k, ins, 2, e.len, e.out, shared, 0);
            } else {
                std::memcpy(shared, e.out, e.len * ts);
            }
        }
        c.barrier();
        if (reduce) {
            const std::size_t o = sl.off(me) * ts, len = sl.len(me);
            for (int q = 0; q < p; ++q) in[q] = q == me ? s + o : c.set(q) + o;
            Exchange& n = ex[t % kPeerDepth];
            n.out = r + o;
            n.len = len;
            reduce_slice(k, in.data(), p, len, n.out, nullptr, 0);
            if (pair) {
                n.got = post_pair_exchange(c, t, n.out, len * ts, 0, n.req, call);
            } else {
                group_allreduce(c, c.peers, c.peer_rank, n.out, len, k, 0, call);
            }
        }
        if (fold) {
            char* rj = recv + j * per * ts;
            for (int q = 0; q < p; ++q)
                if (q != me)
                    std::memcpy(rj + slj.off(q) * ts, c.set(q) + slj.off(q) * ts, slj.len(q) * ts);
        }
    }
}

void run_allreduce(ShmContext& c, const char* send, char* recv, std::size_t count,
                   const Kernel& k, const char* call) {
    const std::size_t ts = k.tsize;
    const std::size_t per = c.chunk / ts;
    const int p = c.node_size, me = c.node_rank;
    const bool hier = c.num_nodes > 1;
    if (hier && c.peers != MPI_COMM_NULL) return run_allreduce_peers(c, send, recv, count, k, call);
    std::vector<const char*> in(p);
    for (std::size_t done = 0; done < count;) {
        const std::size_t m = std::min(per, count - done);
        const char* s = send + done * ts;
        char* r = recv + done * ts;
        ++c.round;
        const Slices sl(m, p, ts);
        char* mine = c.set(me);
        for (int q = 0; q < p; ++q)
            if (q != me) std::memcpy(mine + sl.off(q) * ts, s + sl.off(q) * ts, sl.len(q) * ts);
        c.barrier();
        const std::size_t o = sl.off(me) * ts;
        for (int q = 0; q < p; ++q) in[q] = q == me ? s + o : c.set(q) + o;
        reduce_slice(k, in.data(), p, sl.len(me), mine + o, hier ? nullptr : r + o, 0);
        c.barrier();
        if (!hier) {
            for (int q = 0; q < p; ++q)
                if (q != me)
                    std::memcpy(r + sl.off(q) * ts, c.set(q) + sl.off(q) * ts, sl.len(q) * ts);
        } else {
            char* lead = c.set(0);
            if (me == 0) {
                for (int q = 1; q < p; ++q)
                    std::memcpy(lead + sl.off(q) * ts, c.set(q) + sl.off(q) * ts, sl.len(q) * ts);
                leader_allreduce(c, lead, m, k, 0, call);
            }
            c.barrier();
            std::memcpy(r, lead, m * ts);
        }
        done += m;
    }
}

void run_broadcast(ShmContext& c, char* buf, std::size_t bytes, int root, const char* call) {
    const bool hier = c.num_nodes > 1;
    const bool root_here = c.leader_of[root] == c.leader_of[c.rank];
    const int src_rank = root_here ? c.node_rank_of[root] : 0;
    // Quarter-chunk rounds: the root fills one set while the others drain the other.
    const std::size_t piece = std::max<std::size_t>(kLine, c.chunk / 4);
    for (std::size_t done = 0; done < bytes;) {
        const std::size_t m = std::min(piece, bytes - done);
        char* b = buf + done;
        ++c.round;
        char* src = c.set(src_rank);
        if (c.rank == root) std::memcpy(src, b, m);
        c.barrier();
        if (hier) {
            if (c.leader_rank >= 0)
                check_mpi(MPI_Bcast(src, static_cast<int>(m), MPI_BYTE, c.leader_of[root],
                                    c.leaders),
                          call);
            c.barrier();
        }
        if (c.rank != root) std::memcpy(b, src, m);
        done += m;
    }
}

bool usable_comm(MPI_Comm comm) {
    int inter = 0;
    return MPI_Comm_test_inter(comm, &inter) == MPI_SUCCESS && !inter;
}

}  // namespace

bool shm_allreduce(const void* send, void* recv, std::size_t count, MPI_Datatype type,
                   std::size_t bytes, const ReduceOp& op, MPI_Comm comm, const char* call) {
    if (!op.known()) return false;
    const Kernel k = resolve(type, *op.known());
    if (!k.combine) return false;
    ShmContext* c = shared_context_for(bytes, config_ref().allreduce_threshold, comm, call);
    if (!c) return false;
    if (count == 0) return true;
    if (send == MPI_IN_PLACE) send = recv;
    run_allreduce(*c, static_cast<const char*>(send), static_cast<char*>(recv), count, k, call);
    return true;
}

bool shm_broadcast(void* buf, std::size_t count, MPI_Datatype type, int tsize, int root,
                   MPI_Comm comm, const char* call) {
    const std::size_t bytes = count * static_cast<std::size_t>(tsize);
    MPI_Aint lb = 0, extent = 0;
    check_mpi(MPI_Type_get_extent(type, &lb, &extent), call);
    if (lb != 0 || extent != tsize) return false;  // not contiguous bytes
    ShmContext* c = shared_context_for(bytes, config_ref().broadcast_threshold, comm, call);
    if (!c) return false;
    if (bytes == 0) return true;
    run_broadcast(*c, static_cast<char*>(buf), bytes, root, call);
    return true;
}

}  // namespace detail

// -------------------------------------------------------------- public API

namespace shm {
Config config() {
    ensure_initialized();
    return detail::config_ref();
}
void set_mode(Mode mode) {
    ensure_initialized();
    detail::config_ref().mode = mode;
}
bool takes_shared_path(std::size_t bytes, Comm comm) {
    constexpr const char* call = "mpiml::shm::takes_shared_path";
    ensure_initialized(call);
    const MPI_Comm c = comm.get(call);
    // shm_allreduce's decision for a built-in op on a type with a kernel.
    return detail::shared_context_for(bytes, detail::config_ref().allreduce_threshold, c, call) !=
           nullptr;
}
}  // namespace shm

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
    id_ = detail::next_bucket_id++;
    detail::bucket_windows()[id_] = win_;
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

void SharedBucket::release() noexcept {
    if (win_ == MPI_WIN_NULL) return;
    int finalized = 0;
    MPI_Finalized(&finalized);
    auto& live = detail::bucket_windows();
    const auto it = live.find(id_);
    if (!finalized && it != live.end()) {  // else mpiml's finalize freed it
        live.erase(it);
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
    check_op(op, cls, type, call);
    const Kernel k = op.known() ? resolve(type, *op.known()) : Kernel{};
    if (average && !k.divide)
        fail(call, std::string("averaging needs a floating or complex type, not ") +
                       datatype_name(type));
    ShmContext& c = *ctx_;
    if (!k.combine || config_ref().mode == shm::Mode::off) {
        // The core (its one scope, INT_MAX split, watchdog): mode off, a
        // user-defined op, or a type reduced by MPI alone.
        detail::allreduce(MPI_IN_PLACE, data_, count, type, cls, op, comm_, call);
        if (average && c.size > 1) k.divide(data_, count, c.size);
        return;
    }
    CollectiveScope scope({Kind::allreduce, call, count, type, static_cast<int>(*op.known()), -1, comm_});
    if (count == 0) return;
    const int p = c.node_size, me = c.node_rank;
    const bool hier = c.num_nodes > 1;
    const int div = average && !hier ? c.size : 0;
    char* mine = static_cast<char*>(data_);
    auto peer = [&](int q) { return static_cast<char*>(peers_[q]); };
    const Slices sl(count, p, ts);
    std::vector<const char*> in(p);
    const std::size_t o = sl.off(me) * ts;
    for (int q = 0; q < p; ++q) in[q] = peer(q) + o;
    c.barrier();  // every rank's bucket is ready
    reduce_slice(k, in.data(), p, sl.len(me), mine + o, nullptr, div);
    // Nodes of one size: every rank exchanges its slice with its peers.
    const bool peers = hier && c.peers != MPI_COMM_NULL;
    if (peers && c.num_nodes == 2) pair_allreduce(c, mine + o, sl.len(me), k, average ? c.size : 0, call);
    else if (peers) group_allreduce(c, c.peers, c.peer_rank, mine + o, sl.len(me), k, average ? c.size : 0, call);
    c.barrier();
    if (!hier || peers) {
        for (int q = 0; q < p; ++q)
            if (q != me) stream_copy(mine + sl.off(q) * ts, peer(q) + sl.off(q) * ts, sl.len(q) * ts);
    } else {
        if (me == 0) {
            for (int q = 1; q < p; ++q)
                std::memcpy(mine + sl.off(q) * ts, peer(q) + sl.off(q) * ts, sl.len(q) * ts);
            leader_allreduce(c, mine, count, k, average ? c.size : 0, call);
        }
        c.barrier();
        if (me != 0) stream_copy(mine, peer(0), count * ts);
    }
    c.barrier();  // peers are done reading this bucket
}

}  // namespace mpiml
