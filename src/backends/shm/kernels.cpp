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
               [a, b](const T*, std::size_t i) { return Fn<T, O>::apply(a[i], b[i]); });
    for (int q = 2; q < p; ++q) {
        const T* c = static_cast<const T*>(in[q]);
        store_each(out, m, q == p - 1 ? divide_by : 0,
                   [c](const T* o, std::size_t i) { return Fn<T, O>::apply(o[i], c[i]); });
    }
}

template <class T>
void divide(void* buf, std::size_t m, int p) {
    store_each(static_cast<T*>(buf), m, p, [](const T* x, std::size_t i) { return x[i]; });
}

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

}  // namespace

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
    k.type_id = e->id;
    return k;
}

}  // namespace mpiml::detail
