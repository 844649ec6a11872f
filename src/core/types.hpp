// The registry of element types (types.cpp, from <mpiml/types.def>): names,
// classes, and the C++ type a datatype's reductions compute in, for the
// kernels and the op fixes. The ops: core/op.hpp.
#pragma once

#include <mpiml/datatype.hpp>

#include <complex>
#include <cstdint>
#include <type_traits>

namespace mpiml::detail {

/// The C++ representation mpiml reduces a datatype in; none: left to MPI.
enum class Rep : std::uint8_t { none, i8, u8, i16, u16, i32, u32, i64, u64, f32, f64, f80, boolean, c64, c128 };

struct TypeInfo {
    MPI_Datatype type;
    const char* name;
    TypeClass cls;
    Rep rep;
    int id;  // position in the registry: the same on every rank
};

/// The registry's entry for a datatype; nullptr when it is not built in.
const TypeInfo* find_type(MPI_Datatype type);
/// The entry with this id; nullptr when there is none.
const TypeInfo* type_by_id(std::int64_t id);

template <class T>
constexpr Rep rep_of() {
    if constexpr (std::is_same_v<T, bool>) return Rep::boolean;
    else if constexpr (std::is_same_v<T, wchar_t>) return Rep::none;
    else if constexpr (std::is_same_v<T, std::complex<float>>) return Rep::c64;
    else if constexpr (std::is_same_v<T, std::complex<double>>) return Rep::c128;
    else if constexpr (std::is_same_v<T, float>) return Rep::f32;
    else if constexpr (std::is_same_v<T, double>) return Rep::f64;
    else if constexpr (std::is_same_v<T, long double>) return Rep::f80;
    else if constexpr (std::is_integral_v<T>) {
        constexpr bool s = std::is_signed_v<T>;
        if constexpr (sizeof(T) == 1) return s ? Rep::i8 : Rep::u8;
        else if constexpr (sizeof(T) == 2) return s ? Rep::i16 : Rep::u16;
        else if constexpr (sizeof(T) == 4) return s ? Rep::i32 : Rep::u32;
        else if constexpr (sizeof(T) == 8) return s ? Rep::i64 : Rep::u64;
        else return Rep::none;
    } else {
        return Rep::none;
    }
}

template <class T>
constexpr TypeClass class_of() {
    if constexpr (std::is_same_v<T, bool>) return TypeClass::logical;
    else if constexpr (std::is_same_v<T, std::complex<float>> || std::is_same_v<T, std::complex<double>>)
        return TypeClass::complex;
    else if constexpr (std::is_floating_point_v<T>) return TypeClass::floating;
    else return TypeClass::integer;
}

/// Calls f(std::type_identity<T>{}) with the C++ type of rep (void for none).
template <class F>
decltype(auto) with_rep(Rep rep, F&& f) {
    switch (rep) {
        case Rep::i8: return f(std::type_identity<std::int8_t>{});
        case Rep::u8: return f(std::type_identity<std::uint8_t>{});
        case Rep::i16: return f(std::type_identity<std::int16_t>{});
        case Rep::u16: return f(std::type_identity<std::uint16_t>{});
        case Rep::i32: return f(std::type_identity<std::int32_t>{});
        case Rep::u32: return f(std::type_identity<std::uint32_t>{});
        case Rep::i64: return f(std::type_identity<std::int64_t>{});
        case Rep::u64: return f(std::type_identity<std::uint64_t>{});
        case Rep::f32: return f(std::type_identity<float>{});
        case Rep::f64: return f(std::type_identity<double>{});
        case Rep::f80: return f(std::type_identity<long double>{});
        case Rep::boolean: return f(std::type_identity<bool>{});
        case Rep::c64: return f(std::type_identity<std::complex<float>>{});
        case Rep::c128: return f(std::type_identity<std::complex<double>>{});
        case Rep::none: break;
    }
    return f(std::type_identity<void>{});
}

}  // namespace mpiml::detail
