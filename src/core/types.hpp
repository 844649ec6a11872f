// The registry of element types (types.cpp), derived from <mpiml/types.def>:
// names, classes, the C++ type a datatype's reductions compute in, and the
// lookup by kind and size that numpy's and torch's dtypes use. The ops:
// core/op.hpp.
#pragma once

#include <mpiml/datatype.hpp>

#include <complex>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <string>
#include <type_traits>

namespace mpiml::detail {

struct TypeInfo {
    MPI_Datatype type;
    const char* name;
    TypeClass cls;
    /// 'i' signed integer, 'u' unsigned integer, 'f' floating, 'c' complex,
    /// 'b' bool (numpy's kind letters); 0: none (character and opaque lines).
    char kind;
    std::size_t size;  // bytes of the C++ type; 0 for opaque lines
    int id;            // position in the registry: the same on every rank
};

/// The registry's entry for a datatype; nullptr when it is not built in.
const TypeInfo* find_type(MPI_Datatype type);
/// The entry with this id; nullptr when there is none.
const TypeInfo* type_by_id(std::int64_t id);
/// The first entry of this kind and size (how numpy's and torch's dtypes find
/// their element type); nullptr when there is none.
const TypeInfo* find_kind(char kind, std::size_t size);
/// The entry values of this kind and size are reduced in: find_kind's, else,
/// for floating and complex kinds, the smallest wider entry of the same kind
/// (float16 in float); nullptr when there is none.
const TypeInfo* reduced_in(char kind, std::size_t size);
/// The smallest floating or complex entry of this kind wider than size bytes.
const TypeInfo* wider_than(char kind, std::size_t size);
/// "bool", "int8", "uint16", "float32", "complex64", ...: numpy's and torch's
/// name for a kind and size (for messages).
std::string kind_name(char kind, std::size_t size);
/// The names of every kind and size in the registry, comma-separated ("bool,
/// int8, ..."), for messages that say what is supported.
std::string kind_names();

// ---------------------------------------------------------- C++ types

/// A registry line's C++ type and class (void for opaque lines).
template <class T, TypeClass C>
struct Elem {
    using type = T;
    static constexpr TypeClass cls = C;
};

template <class... E>
struct ElemList {};

/// Every registry line's Elem, in registry order (ids), then a sentinel.
using registry_elems = ElemList<
#define MPIML_TYPE(T, DT, CLS, NAME) Elem<T, TypeClass::CLS>,
#define MPIML_ALIAS(T, DT, CLS, NAME) Elem<T, TypeClass::CLS>,
#define MPIML_OPAQUE(DT, CLS, NAME) Elem<void, TypeClass::CLS>,
#include <mpiml/types.def>
    Elem<void, TypeClass::character>>;

template <class E, class R, class F>
R call_with_elem(F& f) {
    return f(E{});
}

template <class R, class F, class... E>
R dispatch_elem(std::size_t id, F& f, ElemList<E...>) {
    static constexpr R (*table[])(F&) = {&call_with_elem<E, R, F>...};
    return table[id < sizeof...(E) ? id : sizeof...(E) - 1](f);
}

/// Calls f(Elem<T, class>{}) with the C++ type of entry e (void for opaque
/// lines): one table lookup.
template <class R, class F>
R with_elem(const TypeInfo& e, F&& f) {
    return dispatch_elem<R>(static_cast<std::size_t>(e.id), f, registry_elems{});
}

}  // namespace mpiml::detail
