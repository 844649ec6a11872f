// Element-wise reduction kernels of the shared-memory path, per type and op
// (only where the registry's rule, op_allowed, defines the op).
#include "kernels.hpp"

#include "core/op.hpp"
#include "core/types.hpp"

#include <complex>
#include <type_traits>

namespace mpiml::detail {
namespace {

template <class T>
struct is_complex : std::false_type {};
template <class U>
struct is_complex<std::complex<U>> : std::true_type {};

using DivideFn = void (*)(void* buf, std::size_t m, int p);

// Dividing by p: for p a power of two, multiplying by 1 / p, which is exact,
// so the product is the same correctly rounded value as the quotient, and a
// multiply is several times cheaper than a divide.
template <class T>
struct Divisor {
    using R = typename std::conditional_t<is_complex<T>::value, T, std::complex<T>>::value_type;
    explicit Divisor(int p) : d(static_cast<R>(p)), r(R(1) / d), pow2((p & (p - 1)) == 0) {}
    R d, r;
    bool pow2;
};

// out[i] = f(out, i), divided by divide_by when it is > 1 (floating and
// complex T). f reads out only through the pointer it is given.
template <class T, class F>
inline void store_each(T* __restrict out, std::size_t m, int divide_by, F f) {
    if constexpr (std::is_floating_point_v<T> || is_complex<T>::value) {
        if (divide_by > 1) {
            const Divisor<T> v(divide_by);
            if (v.pow2)
                for (std::size_t i = 0; i < m; ++i) out[i] = f(out, i) * v.r;
            else
                for (std::size_t i = 0; i < m; ++i) out[i] = f(out, i) / v.d;
            return;
        }
    }
    for (std::size_t i = 0; i < m; ++i) out[i] = f(out, i);
}

// out[i] = in[0][i] op in[1][i] op ... op in[p-1][i], in this order, divided
// by divide_by (> 1) in the same pass as the last op.
template <class T, Op O>
void combine(void* out_, const void* const* in, int p, std::size_t m, int divide_by) {
    T* __restrict out = static_cast<T*>(out_);
    const T* a = static_cast<const T*>(in[0]);
    if (p == 1) {
        store_each(out, m, divide_by, [a](const T*, std::size_t i) { return a[i]; });
        return;
    }
    const T* b = static_cast<const T*>(in[1]);
    store_each(out, m, p == 2 ? divide_by : 0,
               [a, b](const T*, std::size_t i) { return apply_op<O>(a[i], b[i]); });
    for (int q = 2; q < p; ++q) {
        const T* c = static_cast<const T*>(in[q]);
        store_each(out, m, q == p - 1 ? divide_by : 0,
                   [c](const T* o, std::size_t i) { return apply_op<O>(o[i], c[i]); });
    }
}

template <class T>
void divide(void* buf, std::size_t m, int p) {
    store_each(static_cast<T*>(buf), m, p, [](const T* x, std::size_t i) { return x[i]; });
}

template <class T, TypeClass C, Op O>
CombineFn combine_for() {
    if constexpr (op_allowed(O, C)) return &combine<T, O>;
    else return nullptr;
}

template <class T, TypeClass C>
Kernel kernel_of(Op op) {
    Kernel k;
    k.tsize = sizeof(T);
    if constexpr (C == TypeClass::floating || C == TypeClass::complex) k.divide = &divide<T>;
    switch (op) {
#define MPIML_OP(NAME, ...) \
    case Op::NAME: k.combine = combine_for<T, C, Op::NAME>(); break;
#include <mpiml/ops.def>
    }
    return k;
}

}  // namespace

Kernel resolve(MPI_Datatype t, Op op) {
    const TypeInfo* e = find_type(t);
    if (!e) return {};
    Kernel k = with_elem<Kernel>(*e, [&]<class E>(E) -> Kernel {
        using T = typename E::type;
        if constexpr (std::is_void_v<T> || E::cls == TypeClass::character) return {};
        else return kernel_of<T, E::cls>(op);
    });
    int size = 0;
    if (!k.combine || MPI_Type_size(t, &size) != MPI_SUCCESS || static_cast<std::size_t>(size) != k.tsize)
        return {};
    k.type_id = e->id;
    return k;
}

}  // namespace mpiml::detail
