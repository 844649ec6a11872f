// The MPI backend: the collectives the shared-memory backend declines, on the
// MPI library, with mpiml's replacements for the ops it computes wrongly.
#include "core/backend.hpp"
#include "core/state.hpp"
#include "core/types.hpp"
#include "backends/mpi/pace.hpp"

#include <mpiml/collectives.hpp>
#include <mpiml/error.hpp>

#include <algorithm>
#include <chrono>
#include <climits>
#include <complex>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace mpiml::detail {
namespace {
constexpr std::size_t max_chunk = std::size_t{1} << 30;  // elements per MPI call

// ------------------------------------------------------------- quiet waits

thread_local bool quiet = false;
thread_local bool ordered = false;

thread_local WaitPace pace;  // the longest sleep of this thread's quiet waits

// One quiet wait's sleeps: from WaitPace::kFirstSleep, doubling up to the
// thread's cap; at the end its bytes and time pace the later waits.
class QuietSleep {
public:
    void operator()() {
        std::this_thread::sleep_for(pause_);
        pause_ = std::min(pause_ * 2, cap_);
    }
    void timed(std::size_t bytes) const {
        pace.timed(bytes, std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
    }

private:
    std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
    std::chrono::microseconds cap_ = pace.cap();
    std::chrono::microseconds pause_ = WaitPace::kFirstSleep;
};

void quiet_wait(int n, MPI_Request* req, std::size_t bytes, const char* call) {
    QuietSleep sleep;
    for (;;) {
        int done = 0;
        check_mpi(MPI_Testall(n, req, &done, MPI_STATUSES_IGNORE), call);
        if (done) break;
        sleep();
    }
    sleep.timed(bytes);
}

// GradAverager's sums travel on a duplicate of the user's communicator,
// never mixed with the user's own messages; it is cached as the user's
// communicator's attribute with the ranks of each node, nodes in node order.
// The mutex guards the cache against several averagers' threads
// (MPI_THREAD_MULTIPLE); neither is destroyed: the duplicates are freed
// inside MPI_Finalize, which may run from atexit.
struct Own {
    MPI_Comm dup = MPI_COMM_NULL;
    std::vector<std::vector<int>> nodes;
    std::vector<int> node_of;  // rank q's node
    bool one_a_node = false;   // every node has one rank: node k is rank k
};
std::mutex& own_mutex() {
    static auto* m = new std::mutex;
    return *m;
}
int own_keyval = MPI_KEYVAL_INVALID;
std::vector<Own*>& own_comms() {
    static auto* v = new std::vector<Own*>;
    return *v;
}

int delete_own(MPI_Comm, int, void* value, void*) {
    std::lock_guard lock(own_mutex());
    auto* o = static_cast<Own*>(value);
    if (o->dup != MPI_COMM_NULL) MPI_Comm_free(&o->dup);
    auto& v = own_comms();
    v.erase(std::remove(v.begin(), v.end(), o), v.end());
    delete o;
    return MPI_SUCCESS;
}

void finalize_own_comms() {  // before MPI_COMM_WORLD's attributes go
    std::lock_guard lock(own_mutex());
    for (Own* o : own_comms())
        if (o->dup != MPI_COMM_NULL) MPI_Comm_free(&o->dup);
}

// Collective the first time on comm (the collectives outside the lock: the
// ranks' other threads may be creating theirs on other communicators).
const Own& own_comm(MPI_Comm comm, const char* call) {
    {
        std::lock_guard lock(own_mutex());
        if (own_keyval == MPI_KEYVAL_INVALID) {
            check_mpi(MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, delete_own, &own_keyval, nullptr), call);
            register_finalize_hook(&finalize_own_comms);
        }
        void* v = nullptr;
        int flag = 0;
        check_mpi(MPI_Comm_get_attr(comm, own_keyval, &v, &flag), call);
        if (flag) return *static_cast<Own*>(v);
    }
    auto o = std::make_unique<Own>();
    const std::vector<int> node = node_numbers(comm, call);
    o->node_of = node;
    for (std::size_t q = 0; q < node.size(); ++q) {
        if (o->nodes.size() <= static_cast<std::size_t>(node[q])) o->nodes.resize(node[q] + 1);
        o->nodes[node[q]].push_back(static_cast<int>(q));
    }
    o->one_a_node = std::all_of(o->nodes.begin(), o->nodes.end(),
                                [](const std::vector<int>& n) { return n.size() == 1; });
    check_mpi(MPI_Comm_dup(comm, &o->dup), call);
    std::lock_guard lock(own_mutex());
    const int rc = MPI_Comm_set_attr(comm, own_keyval, o.get());
    if (rc != MPI_SUCCESS) MPI_Comm_free(&o->dup);
    check_mpi(rc, call);
    own_comms().push_back(o.get());
    return *o.release();
}

// Bytes of buf reduced per round of ordered_allreduce (bounds its scratch).
constexpr std::size_t kOrderedPiece = std::size_t{32} << 20;

// Between nodes ordered_allreduce sends in messages of at most this many
// bytes: below the eager limits of Open MPI's TCP transport (64 KiB) and
// MPICH's (128 KiB), so the data goes without a rendezvous, whose
// acknowledgement would wait behind the megabytes this rank has queued on
// the same connection the other way while the peer's direction idles.
constexpr std::size_t kEagerPiece = 64000;

// In place, count elements at buf over the p ranks of comm, every element
// summed in the shared-memory path's order however the buffer is cut: in
// chunks of kOrderedPiece bytes, rank q owns slice q of a chunk, gets the
// other ranks' parts of it (reduce-scatter), sums them (each node's in rank
// order, then the nodes' sums in node order) and sends the sum to every rank
// (allgather): a ring's traffic, 2 (p - 1) / p of the buffer each way per
// rank. With several nodes every message goes in eager pieces, and the two
// halves overlap: a piece is summed as soon as every rank's part of it is in and
// sent on at once, so the link carries the allgather while the
// reduce-scatter's last pieces still arrive. Waited quietly when the thread
// asked.
void ordered_allreduce(char* buf, std::size_t count, MPI_Datatype type, std::size_t tsize,
                       MPI_Op op, MPI_Comm comm, int p, const char* call) {
    const Own& own = own_comm(comm, call);
    const MPI_Comm oc = own.dup;
    int r = 0;
    check_mpi(MPI_Comm_rank(oc, &r), call);
    const bool pieces = own.nodes.size() > 1;
    const std::size_t per = std::max<std::size_t>(kOrderedPiece / tsize, static_cast<std::size_t>(p));
    const std::size_t grid = pieces ? std::max<std::size_t>(kEagerPiece / tsize, 1) : 0;
    enum { kRecv1, kSend1, kRecv2, kSend2, kKinds };  // the reduce-scatter's and allgather's messages
    thread_local std::vector<char> got;  // slot q: rank q's part of this rank's slice
    thread_local std::vector<MPI_Request> req;
    thread_local std::vector<int> idx;
    // base[kind * p + q]: rank q's first request of that kind; ready[q]:
    // pieces in from q; posted2[q]: receives of the allgather posted.
    thread_local std::vector<std::size_t> base, ready, posted2;
    thread_local std::vector<char> done;
    thread_local std::vector<std::uint64_t> told, tell;
    for (std::size_t at = 0; at < count; at += per) {
        const std::size_t m = std::min(per, count - at);
        char* b = buf + at * tsize;
        const auto off = [&](int q) { return m * static_cast<std::size_t>(q) / static_cast<std::size_t>(p); };
        const auto len = [&](int q) { return off(q + 1) - off(q); };
        const std::size_t mine = len(r), slot = (m / p + 1) * tsize;
        got.resize(slot * p);
        const auto part = [&](int q) { return got.data() + static_cast<std::size_t>(q) * slot; };
        char* my = b + off(r) * tsize;
        // Messages of n elements: pieces of `grid` elements with several
        // nodes, else one.
        const auto cut = [&](std::size_t n) { return pieces ? grid : std::max<std::size_t>(n, 1); };
        const auto count_of = [&](std::size_t n) { return (n + cut(n) - 1) / cut(n); };
        const auto peer_len = [&](int kind, int q) { return kind == kRecv1 || kind == kSend2 ? mine : len(q); };

        // In pieces each way first carries its count: pieces of ranks that
        // disagree on it would match wrongly or never, where one message
        // would have failed as truncated.
        if (pieces) {
            told.assign(p, 0);
            tell.assign(p, 0);
            req.clear();
            for (int q = 0; q < p; ++q) {
                if (q == r) continue;
                tell[q] = len(q);
                check_mpi(MPI_Irecv(&told[q], 1, MPI_UINT64_T, q, 3, oc, &req.emplace_back()), call);
                check_mpi(MPI_Isend(&tell[q], 1, MPI_UINT64_T, q, 3, oc, &req.emplace_back()), call);
            }
            wait_all(static_cast<int>(req.size()), req.data(), call, 0);
            for (int k = 1; k < p; ++k) {
                const int from = (r + p - k) % p;
                if (told[from] != mine)
                    fail(call, "ranks passed different counts: rank " + std::to_string(from) + " sends " +
                                   std::to_string(told[from]) + " elements of this rank's part, which has " +
                                   std::to_string(mine));
            }
        }

        base.assign(static_cast<std::size_t>(kKinds) * p + 1, 0);
        std::size_t total = 0;
        for (int kind = 0; kind < kKinds; ++kind)
            for (int q = 0; q < p; ++q) {
                base[kind * p + q] = total;
                if (q != r) total += count_of(peer_len(kind, q));
            }
        base[kKinds * p] = total;
        req.assign(total, MPI_REQUEST_NULL);
        done.assign(total, 0);
        idx.resize(std::max<std::size_t>(total, 1));
        ready.assign(p, 0);
        posted2.assign(p, 0);
        const auto piece = [&](int kind, int q, std::size_t j) {
            const std::size_t n = peer_len(kind, q), c = cut(n), o = j * c;
            return std::pair{o, std::min(c, n - o)};
        };
        // Round 1 (tag 1): from every rank its part of this slice into
        // slot q; to every rank its slice of b, piece by piece across ranks.
        for (int k = 1; k < p; ++k) {
            const int q = (r + p - k) % p;
            for (std::size_t j = 0; j < count_of(mine); ++j) {
                const auto [o, n] = piece(kRecv1, q, j);
                check_mpi(MPI_Irecv(part(q) + o * tsize, static_cast<int>(n), type, q, 1, oc,
                                    &req[base[kRecv1 * p + q] + j]),
                          call);
            }
        }
        std::size_t most = 0;
        for (int q = 0; q < p; ++q)
            if (q != r) most = std::max(most, count_of(len(q)));
        for (std::size_t j = 0; j < most; ++j)
            for (int k = 1; k < p; ++k) {
                const int q = (r + k) % p;
                if (j >= count_of(len(q))) continue;
                const auto [o, n] = piece(kSend1, q, j);
                check_mpi(MPI_Isend(b + (off(q) + o) * tsize, static_cast<int>(n), type, q, 1, oc,
                                    &req[base[kSend1 * p + q] + j]),
                          call);
            }

        // into = from + into (elements [s, e) of this slice), which has the
        // bits of into + from.
        const auto fold = [&](const char* from, char* into, std::size_t s, std::size_t e) {
            check_mpi(MPI_Reduce_local(from + s * tsize, into + s * tsize, static_cast<int>(e - s), type, op),
                      call);
        };
        const auto sum = [&](std::size_t s, std::size_t e) {
            if (own.one_a_node) {  // ((x0 + x1) + x2) + ..., with no copies
                if (r <= 1) {
                    for (int q = 0; q < p; ++q)
                        if (q != r) fold(part(q), my, s, e);
                } else {
                    for (int q = 1; q < r; ++q) fold(part(q), part(0), s, e);
                    fold(part(0), my, s, e);
                    for (int q = r + 1; q < p; ++q) fold(part(q), my, s, e);
                }
            } else {  // each node's sum in its first part
                std::memcpy(part(r) + s * tsize, my + s * tsize, (e - s) * tsize);
                for (std::size_t k = 0; k < own.nodes.size(); ++k) {
                    const std::vector<int>& node = own.nodes[k];
                    for (std::size_t j = 1; j < node.size(); ++j) fold(part(node[j]), part(node[0]), s, e);
                    if (k == 0) std::memcpy(my + s * tsize, part(node[0]) + s * tsize, (e - s) * tsize);
                    else fold(part(node[0]), my, s, e);
                }
            }
        };

        // Round 2 (tag 2): piece j of the sum goes to every rank once summed;
        // rank q's piece j of its slice is received into b once this rank's
        // send of that piece to q (the same bytes) is complete.
        std::size_t summed = 0, sent2 = 0, left = total;
        const auto post2 = [&](std::size_t upto) {  // sum pieces [sent2, upto), send them
            if (upto > sent2) sum(summed, std::min(mine, upto * cut(mine)));
            for (; sent2 < upto; ++sent2)
                for (int k = 1; k < p; ++k) {
                    const int q = (r + k) % p;
                    const auto [o, n] = piece(kSend2, q, sent2);
                    check_mpi(MPI_Isend(my + o * tsize, static_cast<int>(n), type, q, 2, oc,
                                        &req[base[kSend2 * p + q] + sent2]),
                              call);
                }
            summed = std::min(mine, sent2 * cut(mine));
        };
        QuietSleep sleep;
        while (left > 0) {
            int n = 0;
            if (quiet) {
                check_mpi(MPI_Testsome(static_cast<int>(total), req.data(), &n, idx.data(), MPI_STATUSES_IGNORE),
                          call);
            } else {
                check_mpi(MPI_Waitsome(static_cast<int>(total), req.data(), &n, idx.data(), MPI_STATUSES_IGNORE),
                          call);
            }
            if (n == MPI_UNDEFINED) fail(call, "internal: no request left with " + std::to_string(left) + " open");
            for (int i = 0; i < n; ++i) {
                const std::size_t e = static_cast<std::size_t>(idx[i]);
                done[e] = 1;
                --left;
            }
            // Receives from a rank are posted in piece order (MPI matches
            // them in that order): rank q's next piece once this rank's send
            // of it is complete, and every leading piece so completed.
            std::size_t upto = count_of(mine);  // the pieces in from every rank
            for (int q = 0; q < p; ++q) {
                if (q == r) continue;
                const std::size_t s1 = base[kSend1 * p + q], nq = count_of(len(q));
                while (posted2[q] < nq && done[s1 + posted2[q]]) {
                    const std::size_t j = posted2[q]++;
                    const auto [o, n2] = piece(kRecv2, q, j);
                    check_mpi(MPI_Irecv(b + (off(q) + o) * tsize, static_cast<int>(n2), type, q, 2, oc,
                                        &req[base[kRecv2 * p + q] + j]),
                              call);
                }
                const std::size_t r1 = base[kRecv1 * p + q];
                while (ready[q] < count_of(mine) && done[r1 + ready[q]]) ++ready[q];
                upto = std::min(upto, ready[q]);
            }
            if (upto > sent2) {
                post2(upto);
            } else if (quiet && n == 0) {
                sleep();
            }
        }
        std::size_t each_way = 0;  // elements, in and out alike
        for (int q = 0; q < p; ++q)
            if (q != r) each_way += len(q) + mine;
        if (quiet) sleep.timed(each_way * tsize);
    }
}
bool inter_comm(MPI_Comm comm) {
    int inter = 0;
    return MPI_Comm_test_inter(comm, &inter) != MPI_SUCCESS || inter;
}
}  // namespace

void set_quiet_waits(bool on) { quiet = on; }

bool set_ordered_sums(bool on) { return std::exchange(ordered, on); }

void wait_all(int n, MPI_Request* req, const char* call, std::size_t bytes) {
    if (quiet) return quiet_wait(n, req, bytes, call);
    check_mpi(MPI_Waitall(n, req, MPI_STATUSES_IGNORE), call);
}

void mpi_allreduce(const void* send, void* recv, std::size_t count, MPI_Datatype type,
                   int tsize, const ReduceOp& op, MPI_Comm comm, const char* call) {
    const MPI_Op native = mpi_op_for(type, op);
    if ((quiet || ordered) && send == MPI_IN_PLACE && op.known() == Op::sum && count > 0) {
        int size = 1;
        check_mpi(MPI_Comm_size(comm, &size), call);
        // GradAverager's sums in place: in order where the order changes the
        // bits (floating types, 3 ranks or more); always when waited quietly.
        const TypeInfo* info = find_type(type);
        const bool order_matters = info && (info->cls == TypeClass::floating ||
                                            info->cls == TypeClass::complex);
        if ((quiet ? size > 1 : size > 2 && order_matters) && !inter_comm(comm))
            return ordered_allreduce(static_cast<char*>(recv), count, type,
                                     static_cast<std::size_t>(tsize), native, comm, size, call);
    }
    std::size_t done = 0;
    do {
        const std::size_t n = std::min(count - done, max_chunk);
        const void* s = send == MPI_IN_PLACE ? MPI_IN_PLACE
                                             : static_cast<const char*>(send) + done * tsize;
        void* r = static_cast<char*>(recv) + done * tsize;
        check_mpi(MPI_Allreduce(s, r, static_cast<int>(n), type, native, comm), call);
        done += n;
    } while (done < count);
}

void mpi_average(void* buf, std::size_t count, MPI_Datatype type, int tsize, MPI_Comm comm,
                 const char* call) {
    mpi_allreduce(MPI_IN_PLACE, buf, count, type, tsize, Op::sum, comm, call);
    int size = 1;
    check_mpi(MPI_Comm_size(comm, &size), call);
    if (size == 1) return;
    // x / n: for a power of two the same bits as the shared path's x * (1 / n).
    const TypeInfo* info = find_type(type);
    bool done = false;
    if (info)
        with_elem<void>(*info, [&]<class E>(E) {
            using T = typename E::type;
            if constexpr (E::cls == TypeClass::floating || E::cls == TypeClass::complex) {
                using R = decltype(std::abs(T{}));  // complex: both parts divided by n
                T* x = static_cast<T*>(buf);
                const R n = static_cast<R>(size);
                for (std::size_t i = 0; i < count; ++i) x[i] /= n;
                done = true;
            }
        });
    if (!done)
        fail(call, std::string("averaging needs a floating or complex type, not ") + datatype_name(type));
}

void mpi_broadcast(void* buf, std::size_t count, MPI_Datatype type, int tsize, int root,
                   MPI_Comm comm, const char* call) {
    std::size_t done = 0;
    do {
        const std::size_t n = std::min(count - done, max_chunk);
        check_mpi(MPI_Bcast(static_cast<char*>(buf) + done * tsize, static_cast<int>(n), type,
                            root, comm),
                  call);
        done += n;
    } while (done < count);
}

void mpi_allgather(const void* send, void* recv, std::size_t count, MPI_Datatype type,
                   MPI_Comm comm, const char* call) {
    check_mpi(MPI_Allgather(send, static_cast<int>(count), type, recv, static_cast<int>(count),
                            type, comm),
              call);
}

void mpi_barrier(MPI_Comm comm, const char* call) { check_mpi(MPI_Barrier(comm), call); }

}  // namespace mpiml::detail
