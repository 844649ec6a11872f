// C++ element types -> MPI datatypes, resolved at compile time.
#pragma once

#include <mpi.h>

#include <complex>
#include <concepts>
#include <cstdint>
#include <type_traits>

namespace mpiml {

/// What reductions an element type allows (MPI 4.0, section 6.9.2; which
/// op takes which class: <mpiml/ops.def>). character: none.
enum class TypeClass { integer, floating, complex, logical, character };

template <class T>
struct mpi_type_traits;  // no definition: not an MPI type

#define MPIML_TYPE(T, DT, CLS, NAME)                                           \
    template <>                                                                \
    struct mpi_type_traits<T> {                                                \
        static MPI_Datatype get() { return DT; }                               \
        static constexpr TypeClass type_class = TypeClass::CLS;               \
        static constexpr const char* name = NAME;                              \
    };
#include <mpiml/types.def>
// char is signed char or unsigned char, as the platform has it.
template <>
struct mpi_type_traits<char> {
    static MPI_Datatype get() { return std::is_signed_v<char> ? MPI_SIGNED_CHAR : MPI_UNSIGNED_CHAR; }
    static constexpr TypeClass type_class = TypeClass::integer;
    static constexpr const char* name = "char";
};

/// An element type with a built-in MPI datatype.
template <class T>
concept MpiType = requires { mpi_type_traits<std::remove_cv_t<T>>::type_class; };

template <MpiType T>
MPI_Datatype mpi_datatype() {
    return mpi_type_traits<std::remove_cv_t<T>>::get();
}

/// Printable name of an MPI datatype ("float", "int", ... or "MPI datatype").
const char* datatype_name(MPI_Datatype type);

}  // namespace mpiml
