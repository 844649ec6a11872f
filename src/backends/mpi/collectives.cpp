// The MPI backend: the collectives the shared-memory backend declines, on the
// MPI library, with mpiml's replacements for the ops it computes wrongly.
#include "core/backend.hpp"
#include "core/types.hpp"

#include <mpiml/collectives.hpp>
#include <mpiml/error.hpp>

#include <algorithm>
#include <climits>
#include <complex>
#include <string>
#include <type_traits>

namespace mpiml::detail {
namespace {
constexpr std::size_t max_chunk = std::size_t{1} << 30;  // elements per MPI call
}

void mpi_allreduce(const void* send, void* recv, std::size_t count, MPI_Datatype type,
                   int tsize, const ReduceOp& op, MPI_Comm comm, const char* call) {
    const MPI_Op native = mpi_op_for(type, op);
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
