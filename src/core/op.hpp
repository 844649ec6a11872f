// The reduce ops (op.cpp), derived from <mpiml/ops.def>: names, MPI's
// predefined ops, which type classes each op accepts, what each means on
// bool, and the element function the kernels and the op fixes apply.
#pragma once

#include <mpiml/datatype.hpp>
#include <mpiml/op.hpp>

#include <cstddef>
#include <iterator>
#include <string>
#include <type_traits>

namespace mpiml::detail {

/// Type classes as bits, for ops.def's "integer | floating" columns.
namespace class_bits {
inline constexpr unsigned integer = 1u << static_cast<unsigned>(TypeClass::integer);
inline constexpr unsigned floating = 1u << static_cast<unsigned>(TypeClass::floating);
inline constexpr unsigned complex = 1u << static_cast<unsigned>(TypeClass::complex);
inline constexpr unsigned logical = 1u << static_cast<unsigned>(TypeClass::logical);
}  // namespace class_bits

/// Whether op is defined for elements of class cls: the one legality rule
/// (ops.def, after MPI 4.0, section 6.9.2).
constexpr bool op_allowed(Op op, TypeClass cls) {
    using namespace class_bits;
    const unsigned bit = 1u << static_cast<unsigned>(cls);
    switch (op) {
#define MPIML_OP(NAME, MPI, CLASSES, ...) \
    case Op::NAME: return ((CLASSES) & bit) != 0;
#include <mpiml/ops.def>
    }
    return false;
}

/// The op that equals op on bool values (ops.def's "on bool" column).
constexpr Op op_on_bool(Op op) {
    switch (op) {
#define MPIML_OP(NAME, MPI, CLASSES, ON_BOOL, ...) \
    case Op::NAME: return Op::ON_BOOL;
#include <mpiml/ops.def>
    }
    return op;
}

inline constexpr std::size_t op_count = std::size(all_ops);

/// An mpiml::Op's name and MPI's predefined op for it (name "invalid op",
/// MPI_OP_NULL for a value outside the enum).
struct OpInfo {
    const char* name;
    MPI_Op native;
};
OpInfo op_info(Op op);
/// The op with this name ("sum", ...); nullptr when there is none.
const Op* op_by_name(const char* name);
/// Every op's name, comma-separated ("sum, prod, ...").
std::string op_names();

/// Integer arithmetic wraps (in unsigned, at least unsigned int wide), as
/// MPI's built-in ops do in practice, without signed overflow.
template <class T>
constexpr T plus(T a, T b) {
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
        using U = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;
        return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
    } else {
        return a + b;
    }
}
template <class T>
constexpr T times(T a, T b) {
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
        using U = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;
        return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
    } else {
        return a * b;
    }
}

/// One element of op O over a and b (ops.def's last column); instantiate it
/// only where op_allowed(O, the class of T).
template <Op O, class T>
constexpr T apply_op(T a, T b) {
#define MPIML_OP(NAME, MPI, CLASSES, ON_BOOL, TORCH, ...) \
    if constexpr (O == Op::NAME) return static_cast<T>(__VA_ARGS__); else
#include <mpiml/ops.def>
    return a;
}

}  // namespace mpiml::detail
