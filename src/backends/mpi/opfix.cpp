// Integer reductions the MPI library computes wrongly, replaced by mpiml's own.
//
// Found on Debian 12: Open MPI 4.1.4's AVX op component saturates 8- and
// 16-bit integer sums and products instead of wrapping (open-mpi/ompi#8045),
// and compares MPI_UNSIGNED_LONG as signed in MPI_MIN/MPI_MAX; MPICH 4.0.2
// compares every unsigned type as signed in MPI_MIN/MPI_MAX. Each (type, op)
// pair is probed once per process with MPI_Reduce_local on values that expose
// these faults; a wrong answer switches that pair to a user-defined MPI_Op
// with the C++ semantics (wrap-around, unsigned order).
#include "core/state.hpp"
#include "core/op.hpp"
#include "core/types.hpp"

#include <mpiml/collectives.hpp>

#include <cstdint>
#include <cstring>
#include <limits>
#include <mutex>
#include <type_traits>
#include <vector>

namespace mpiml::detail {
namespace {

template <class T, Op O>
void user_fn(void* in, void* inout, int* len, MPI_Datatype*) {
    const T* a = static_cast<const T*>(in);
    T* b = static_cast<T*>(inout);
    for (int i = 0; i < *len; ++i) b[i] = apply_op<O>(a[i], b[i]);
}

// Values that overflow (sum, prod) or have the top bit set (min, max); long
// enough for vectorized paths and with a scalar tail.
template <class T, Op O>
bool native_is_exact(MPI_Datatype type, MPI_Op native) {
    constexpr int n = 259;
    constexpr T top = std::numeric_limits<T>::max();
    std::vector<T> in(n), io(n), want(n);
    for (int i = 0; i < n; ++i) {
        const T small = static_cast<T>(5 + i % 13);
        if constexpr (O == Op::sum) {
            in[i] = static_cast<T>(top - i % 7);
            io[i] = static_cast<T>(100 + i % 11);
        } else if constexpr (O == Op::prod) {
            in[i] = static_cast<T>(top / 2 + i % 9);
            io[i] = static_cast<T>(3 + i % 4);
        } else if constexpr (std::is_unsigned_v<T>) {
            in[i] = static_cast<T>(top - i % 17);  // top bit set
            io[i] = small;
        } else {
            in[i] = static_cast<T>(std::numeric_limits<T>::min() + i % 17);
            io[i] = small;
        }
        want[i] = apply_op<O>(in[i], io[i]);
    }
    if (MPI_Reduce_local(in.data(), io.data(), n, type, native) != MPI_SUCCESS) return true;
    return std::memcmp(io.data(), want.data(), sizeof(T) * n) == 0;
}

template <class T, Op O>
MPI_Op probe(MPI_Datatype type, MPI_Op native) {
    if (native_is_exact<T, O>(type, native)) return native;
    MPI_Op own = MPI_OP_NULL;
    if (MPI_Op_create(&user_fn<T, O>, 1, &own) != MPI_SUCCESS) return native;
    return own;
}

template <class T>
MPI_Op probe_type(MPI_Datatype type, Op op, MPI_Op native) {
    int size = 0;
    if (MPI_Type_size(type, &size) != MPI_SUCCESS || static_cast<std::size_t>(size) != sizeof(T))
        return native;
    switch (op) {
        case Op::sum: return probe<T, Op::sum>(type, native);
        case Op::prod: return probe<T, Op::prod>(type, native);
        case Op::min: return probe<T, Op::min>(type, native);
        case Op::max: return probe<T, Op::max>(type, native);
        default: return native;
    }
}

MPI_Op probe_any(MPI_Datatype t, Op op, MPI_Op native) {
    const TypeInfo* e = find_type(t);
    if (!e) return native;
    return with_elem<MPI_Op>(*e, [&]<class E>(E) -> MPI_Op {
        if constexpr (E::cls == TypeClass::integer && !std::is_void_v<typename E::type>)
            return probe_type<typename E::type>(t, op, native);
        else return native;
    });
}

struct Entry {
    MPI_Datatype type;
    Op op;
    MPI_Op native;
    MPI_Op use;
};

// Never destroyed: free_own_ops runs inside MPI_Finalize, which may be called
// from atexit after function-local statics have been destroyed.
std::mutex& table_mutex() {
    static auto* m = new std::mutex;
    return *m;
}
std::vector<Entry>& table() {
    static auto* t = new std::vector<Entry>;
    return *t;
}

void free_own_ops() {
    std::lock_guard lock(table_mutex());
    for (Entry& e : table())
        if (e.use != e.native) MPI_Op_free(&e.use);
    table().clear();
}

}  // namespace

MPI_Op mpi_op_for(MPI_Datatype type, const ReduceOp& op) {
    const auto known = op.known();
    if (!known || (*known != Op::sum && *known != Op::prod && *known != Op::min && *known != Op::max))
        return op.native();
    std::lock_guard lock(table_mutex());
    for (const Entry& e : table())
        if (e.type == type && e.op == *known) return e.use;
    if (table().empty()) register_finalize_hook(&free_own_ops);
    const MPI_Op use = probe_any(type, *known, op.native());
    table().push_back({type, *known, op.native(), use});
    return use;
}

}  // namespace mpiml::detail
