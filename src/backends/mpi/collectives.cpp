// The MPI backend: the collectives the shared-memory backend declines, on the
// MPI library, with mpiml's replacements for the ops it computes wrongly.
#include "core/backend.hpp"
#include "core/state.hpp"
#include "core/types.hpp"

#include <mpiml/collectives.hpp>
#include <mpiml/error.hpp>

#include <algorithm>
#include <chrono>
#include <climits>
#include <complex>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

namespace mpiml::detail {
namespace {
constexpr std::size_t max_chunk = std::size_t{1} << 30;  // elements per MPI call

// ------------------------------------------------------------- quiet waits

thread_local bool quiet = false;

// The sleeps between two tests: short at first (a message about to complete
// costs little), doubling up to a limit short enough that the TCP transport,
// which moves data only inside MPI calls, still fills a 1-10 Gbit/s link.
constexpr auto kFirstSleep = std::chrono::microseconds(20);
constexpr auto kLongestSleep = std::chrono::microseconds(250);

void quiet_wait(int n, MPI_Request* req, const char* call) {
    auto pause = kFirstSleep;
    for (;;) {
        int done = 0;
        check_mpi(MPI_Testall(n, req, &done, MPI_STATUSES_IGNORE), call);
        if (done) return;
        std::this_thread::sleep_for(pause);
        pause = std::min(pause * 2, kLongestSleep);
    }
}

// The ring's messages travel on a duplicate of the user's communicator
// (cached as its attribute), never mixed with the user's own. The mutex
// guards the cache against several averagers' threads (MPI_THREAD_MULTIPLE);
// neither is destroyed: the duplicates are freed inside MPI_Finalize, which
// may run from atexit.
std::mutex& ring_mutex() {
    static auto* m = new std::mutex;
    return *m;
}
int ring_keyval = MPI_KEYVAL_INVALID;
std::vector<MPI_Comm*>& ring_comms() {
    static auto* v = new std::vector<MPI_Comm*>;
    return *v;
}

void free_ring_comm(MPI_Comm* d) {
    if (*d != MPI_COMM_NULL) MPI_Comm_free(d);
    auto& v = ring_comms();
    v.erase(std::remove(v.begin(), v.end(), d), v.end());
    delete d;
}

int delete_ring_comm(MPI_Comm, int, void* value, void*) {
    std::lock_guard lock(ring_mutex());
    free_ring_comm(static_cast<MPI_Comm*>(value));
    return MPI_SUCCESS;
}

void finalize_ring_comms() {  // before MPI_COMM_WORLD's attributes go
    std::lock_guard lock(ring_mutex());
    for (MPI_Comm* d : ring_comms())
        if (*d != MPI_COMM_NULL) MPI_Comm_free(d);
}

// Collective the first time on comm.
MPI_Comm ring_comm(MPI_Comm comm, const char* call) {
    std::lock_guard lock(ring_mutex());
    if (ring_keyval == MPI_KEYVAL_INVALID) {
        check_mpi(MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, delete_ring_comm, &ring_keyval, nullptr),
                  call);
        register_finalize_hook(&finalize_ring_comms);
    }
    void* v = nullptr;
    int flag = 0;
    check_mpi(MPI_Comm_get_attr(comm, ring_keyval, &v, &flag), call);
    if (flag) return *static_cast<MPI_Comm*>(v);
    auto* d = new MPI_Comm(MPI_COMM_NULL);
    const int rc = MPI_Comm_dup(comm, d);
    if (rc != MPI_SUCCESS) delete d;
    check_mpi(rc, call);
    ring_comms().push_back(d);
    check_mpi(MPI_Comm_set_attr(comm, ring_keyval, d), call);
    return *d;
}

// In place, n elements at buf over the ranks of comm: a reduce-scatter, then
// an allgather, each step one nonblocking exchange with the ring neighbours
// waited quietly (one message each way at a time, as MPI's own ring). Every
// slice is reduced by one rank and copied to the others, so all ranks get
// the same bits; with 2 ranks the same bits as MPI_Allreduce (a + b).
void ring_allreduce(char* buf, int n, MPI_Datatype type, int tsize, MPI_Op op, MPI_Comm comm,
                    int p, const char* call) {
    const MPI_Comm rc = ring_comm(comm, call);
    int r = 0;
    check_mpi(MPI_Comm_rank(rc, &r), call);
    const int right = (r + 1) % p, left = (r + p - 1) % p;
    const auto off = [&](int q) { return static_cast<std::size_t>(n) * static_cast<std::size_t>(q) / p; };
    const auto len = [&](int q) { return static_cast<int>(off(q + 1) - off(q)); };
    thread_local std::vector<char> got;
    got.resize((static_cast<std::size_t>(n) / p + 1) * tsize);
    auto exchange = [&](int out, char* in, int in_slice) {
        MPI_Request req[2];
        check_mpi(MPI_Irecv(in, len(in_slice), type, left, 0, rc, &req[0]), call);
        check_mpi(MPI_Isend(buf + off(out) * tsize, len(out), type, right, 0, rc, &req[1]), call);
        quiet_wait(2, req, call);
    };
    for (int k = 0; k < p - 1; ++k) {  // slice r - k out, r - k - 1 in and reduced
        const int in = (r - k - 1 + 2 * p) % p;
        exchange((r - k + p) % p, got.data(), in);
        check_mpi(MPI_Reduce_local(got.data(), buf + off(in) * tsize, len(in), type, op), call);
    }
    for (int k = 0; k < p - 1; ++k) {  // rank r holds slice r + 1 reduced; pass them on
        const int in = (r - k + p) % p;
        exchange((r + 1 - k + p) % p, buf + off(in) * tsize, in);
    }
}
bool inter_comm(MPI_Comm comm) {
    int inter = 0;
    return MPI_Comm_test_inter(comm, &inter) != MPI_SUCCESS || inter;
}
}  // namespace

void set_quiet_waits(bool on) { quiet = on; }

void wait_all(int n, MPI_Request* req, const char* call) {
    if (quiet) return quiet_wait(n, req, call);
    check_mpi(MPI_Waitall(n, req, MPI_STATUSES_IGNORE), call);
}

void mpi_allreduce(const void* send, void* recv, std::size_t count, MPI_Datatype type,
                   int tsize, const ReduceOp& op, MPI_Comm comm, const char* call) {
    const MPI_Op native = mpi_op_for(type, op);
    int size = 1;
    if (quiet) check_mpi(MPI_Comm_size(comm, &size), call);
    // Quiet: sums in place on an intra-communicator (the averaging of gradients).
    const bool ring = quiet && size > 1 && send == MPI_IN_PLACE && op.known() == Op::sum &&
                      !inter_comm(comm);
    std::size_t done = 0;
    do {
        const std::size_t n = std::min(count - done, max_chunk);
        const void* s = send == MPI_IN_PLACE ? MPI_IN_PLACE
                                             : static_cast<const char*>(send) + done * tsize;
        void* r = static_cast<char*>(recv) + done * tsize;
        if (ring && n >= static_cast<std::size_t>(size))
            ring_allreduce(static_cast<char*>(r), static_cast<int>(n), type, tsize, native, comm, size, call);
        else
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
