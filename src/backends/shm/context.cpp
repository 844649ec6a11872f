// Shared-memory contexts (creation, caches, finalize), the path decision and
// the hooks detail::allreduce / detail::broadcast call (src/shm.hpp).
#include "context.hpp"

#include "core/agreement.hpp"
#include "core/config.hpp"
#include "core/backend.hpp"
#include "core/state.hpp"
#include "core/types.hpp"

#include <mpiml/error.hpp>

#include <algorithm>
#include <mutex>
#include <string>

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

}  // namespace

// ------------------------------------------------------------ configuration

shm::Config& config_ref() {
    static shm::Config c = env_config().shm;  // MPIML_SHM* (src/config.cpp)
    return c;
}

// ------------------------------------------------------------------ context

namespace {

// Guards the registries below: contexts and buckets are made by several
// threads at once (one per torch.distributed group). Never destroyed:
// buckets may be released from static destructors.
std::mutex& registry_mutex() {
    static auto* m = new std::mutex;
    return *m;
}

std::map<std::size_t, BucketWindow>& bucket_windows() {
    static auto* m = new std::map<std::size_t, BucketWindow>;
    return *m;
}
std::size_t next_bucket_id = 0;
std::atomic<std::int64_t> next_proposal{0};

int ctx_keyval = MPI_KEYVAL_INVALID;
bool hook_registered = false;

// Never destroyed: buckets may be released from static destructors.
std::vector<std::weak_ptr<ShmContext>>& contexts() {
    static auto* v = new std::vector<std::weak_ptr<ShmContext>>;
    return *v;
}

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

// Inside MPI_Finalize: every bucket's and context's window freed in free
// key order, the same on every rank.
void finalize_shm() {
    ctx_generation.fetch_add(1, std::memory_order_acq_rel);
    std::lock_guard lock(registry_mutex());
    struct Item {
        const std::vector<std::int64_t>* key;
        MPI_Win* bucket;
        ShmContext* ctx;
    };
    std::vector<std::shared_ptr<ShmContext>> alive;
    std::vector<Item> items;
    for (auto& [id, b] : bucket_windows()) items.push_back({&b.key, &b.win, nullptr});
    for (auto& w : contexts())
        if (auto c = w.lock()) {
            alive.push_back(c);
            items.push_back({&c->free_key, nullptr, c.get()});
        }
    // A context's key comes before its buckets' (made after it on its comm).
    std::stable_sort(items.begin(), items.end(),
                     [](const Item& a, const Item& b) { return *a.key < *b.key; });
    for (auto& it : items) {
        if (it.bucket) {
            MPI_Win_unlock_all(*it.bucket);
            MPI_Win_free(it.bucket);
        } else {
            it.ctx->release();
        }
    }
    bucket_windows().clear();
    forget_bucket_memory();
    contexts().clear();
}

}  // namespace

std::vector<std::int64_t> free_order_key(MPI_Comm comm, const char* call) {
    int world = 0, size = 0;
    check_mpi(MPI_Comm_rank(MPI_COMM_WORLD, &world), call);
    check_mpi(MPI_Comm_size(comm, &size), call);
    // A number of this rank's own, never given twice; with the world rank, a
    // communicator's (rank, number) pairs differ from those of any other
    // communicator this rank belongs to.
    const std::int64_t mine[2] = {world, next_proposal.fetch_add(1, std::memory_order_relaxed)};
    std::vector<std::int64_t> all(2 * static_cast<std::size_t>(size));
    check_mpi(MPI_Allgather(mine, 2, MPI_INT64_T, all.data(), 2, MPI_INT64_T, comm), call);
    std::vector<std::pair<std::int64_t, std::int64_t>> pairs;
    std::int64_t top = 0;
    for (int r = 0; r < size; ++r) {
        pairs.emplace_back(all[2 * r], all[2 * r + 1]);
        top = std::max(top, all[2 * r + 1]);
    }
    std::sort(pairs.begin(), pairs.end());
    std::vector<std::int64_t> key{top};
    for (const auto& [w, p] : pairs) key.insert(key.end(), {w, p});
    return key;
}

std::size_t add_bucket_window(MPI_Win win, std::vector<std::int64_t> key) {
    std::lock_guard lock(registry_mutex());
    const std::size_t id = next_bucket_id++;
    bucket_windows()[id] = {win, std::move(key)};
    return id;
}

bool remove_bucket_window(std::size_t id) {
    std::lock_guard lock(registry_mutex());
    return bucket_windows().erase(id) > 0;
}

namespace {

int delete_ctx(MPI_Comm, int, void* value, void*) {
    ctx_generation.fetch_add(1, std::memory_order_acq_rel);
    auto* holder = static_cast<std::shared_ptr<ShmContext>*>(value);
    (*holder)->release();
    delete holder;
    return MPI_SUCCESS;
}

}  // namespace

MPI_Info noncontig_info() {
    MPI_Info info;
    MPI_Info_create(&info);
    MPI_Info_set(info, "alloc_shared_noncontig", "true");
    return info;
}

namespace {

// The ranks of comm on this rank's node (MPIML_NODE_SPLIT: on its simulated
// node), in rank order.
MPI_Comm node_comm(MPI_Comm comm, int rank, const char* call) {
    MPI_Comm shared = MPI_COMM_NULL;
    check_mpi(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &shared), call);
    const int split = config_ref().node_split;
    if (split <= 0) return shared;
    MPI_Comm node = MPI_COMM_NULL;
    const int rc = MPI_Comm_split(shared, rank / split, rank, &node);
    MPI_Comm_free(&shared);
    check_mpi(rc, call);
    return node;
}

std::shared_ptr<ShmContext> create_context(MPI_Comm comm, const char* call) {
    const auto& cfg = config_ref();
    auto c = std::make_shared<ShmContext>();
    c->comm = comm;
    check_mpi(MPI_Comm_rank(comm, &c->rank), call);
    check_mpi(MPI_Comm_size(comm, &c->size), call);
    c->node = node_comm(comm, c->rank, call);
    c->alive = true;  // from here on, release() frees what exists
    check_mpi(MPI_Comm_rank(c->node, &c->node_rank), call);
    check_mpi(MPI_Comm_size(c->node, &c->node_size), call);
    check_mpi(MPI_Comm_split(comm, c->node_rank == 0 ? 0 : MPI_UNDEFINED, c->rank, &c->leaders),
              call);
    c->free_key = free_order_key(comm, call);
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
    c->crowded = !(cpus > 0 && c->node_size <= cpus);
    c->spin_limit = c->crowded ? 64 : 4096;
    return c;
}

}  // namespace

std::vector<int> node_numbers(MPI_Comm comm, const char* call) {
    int rank = 0, size = 0;
    check_mpi(MPI_Comm_rank(comm, &rank), call);
    check_mpi(MPI_Comm_size(comm, &size), call);
    MPI_Comm node = node_comm(comm, rank, call);
    int lowest = rank;  // node rank 0 is the node's lowest rank
    const int rc = MPI_Bcast(&lowest, 1, MPI_INT, 0, node);
    MPI_Comm_free(&node);
    check_mpi(rc, call);
    std::vector<int> of(static_cast<std::size_t>(size));
    check_mpi(MPI_Allgather(&lowest, 1, MPI_INT, of.data(), 1, MPI_INT, comm), call);
    std::vector<int> lows = of;
    std::sort(lows.begin(), lows.end());
    lows.erase(std::unique(lows.begin(), lows.end()), lows.end());
    for (int& n : of) n = static_cast<int>(std::lower_bound(lows.begin(), lows.end(), n) - lows.begin());
    return of;
}

// The context of comm, created collectively on first use.
std::shared_ptr<ShmContext> context(MPI_Comm comm, const char* call) {
    {
        std::lock_guard lock(registry_mutex());
        if (ctx_keyval == MPI_KEYVAL_INVALID)
            check_mpi(MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, delete_ctx, &ctx_keyval, nullptr),
                      "MPI_Comm_create_keyval");
    }
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
    std::lock_guard lock(registry_mutex());
    contexts().push_back(c);
    if (!hook_registered) {
        register_finalize_hook(&finalize_shm);
        hook_registered = true;
    }
    return c;
}

bool usable_comm(MPI_Comm comm) {
    int inter = 0;
    return MPI_Comm_test_inter(comm, &inter) == MPI_SUCCESS && !inter;
}

namespace {


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

}  // namespace

// ----------------------------------------------------- argument agreement

namespace {

std::string describe(const Signature& s) {
    const TypeInfo* t = type_by_id(s.type);
    std::string d = "count=" + std::to_string(s.count) + ", type=" + (t ? t->name : "MPI datatype");
    if (s.kind == Signature::broadcast) d += ", root=" + std::to_string(s.root);
    else if (s.op < 10) d += std::string(", op=") + op_name(static_cast<Op>(s.op));
    switch (s.kind) {
        case Signature::allreduce: return d + " (allreduce)";
        case Signature::broadcast: return d + " (broadcast)";
        case Signature::bucket_allreduce: return d + " (SharedBucket::allreduce)";
        case Signature::bucket_average: return d + " (SharedBucket::average)";
    }
    return d;
}

[[noreturn]] void mismatch(const std::vector<Signature>& by_rank, const char* call) {
    std::vector<std::string> said(by_rank.size());
    for (std::size_t r = 0; r < by_rank.size(); ++r) said[r] = describe(by_rank[r]);
    fail(call, "mismatched calls (shared-memory path): " + group_ranks(said, 0, "passed", "passed"));
}

// A mismatch on a single node: every signature is in the flag lines.
[[noreturn, gnu::noinline, gnu::cold]] void node_mismatch(ShmContext& c, const Signature& mine,
                                                         const char* call) {
    std::vector<Signature> by_rank(static_cast<std::size_t>(c.size));
    for (int r = 0; r < c.size; ++r) {
        const int q = c.node_rank_of[r];
        by_rank[r] = q == c.node_rank ? mine : *c.signature(q, c.epoch);
    }
    mismatch(by_rank, call);
}

// Several nodes: node_same says whether this node's ranks agree; one small
// reduction over the peers (nodes of one size) or the communicator (leader
// path) tells whether the nodes do. Every rank of the communicator reaches
// the same verdict: a node that disagrees within marks every peer group.
[[gnu::noinline]] void nodes_check(ShmContext& c, const Signature& s, bool node_same,
                                   const char* call) {
    const bool bcast = s.kind == Signature::broadcast;
    const std::int64_t w[7] = {static_cast<std::int64_t>(bcast ? 0 : s.count),
                               static_cast<std::int64_t>(s.bytes), s.kind, s.op,
                               bcast ? 0 : s.type, s.root, node_same ? 0 : 1};
    const MPI_Comm group = c.peers != MPI_COMM_NULL ? c.peers : c.comm;
    if (agree(w, 7, group, call) && node_same) return;
    std::vector<Signature> by_rank(static_cast<std::size_t>(c.size));
    check_mpi(MPI_Allgather(&s, sizeof s, MPI_BYTE, by_rank.data(), sizeof s, MPI_BYTE, c.comm),
              call);
    mismatch(by_rank, call);
}

}  // namespace

void checked_barrier(ShmContext& c, const Signature& sig, const char* call) {
    *c.signature(c.node_rank, c.epoch + 1) = sig;
    c.barrier();
    bool same = true;
    for (int q = 0; q < c.node_size; ++q)
        if (q != c.node_rank) same = same && same_call(*c.signature(q, c.epoch), sig);
    if (c.num_nodes > 1) return nodes_check(c, sig, same, call);
    if (!same) [[unlikely]] node_mismatch(c, sig, call);
}

// ------------------------------------------------------------ path decision

// The one path decision: the context of comm when a collective of bytes
// bytes takes the shared-memory path (mode; in auto mode, at least threshold
// bytes and worth_sharing), else nullptr. Collective the first time on comm
// (it creates the context); the same answer on every rank.
ShmContext* shared_context_for(std::size_t bytes, std::size_t threshold, MPI_Comm comm,
                               const char* call) {
    if (!may_share(bytes, threshold)) return nullptr;
    ShmContext* c = cached_context(comm, call);
    if (!c) return nullptr;
    if (config_ref().mode == shm::Mode::automatic && !worth_sharing(*c, bytes)) return nullptr;
    return c;
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
    return detail::shm_takes(bytes, c, call);
}
}  // namespace shm

}  // namespace mpiml
