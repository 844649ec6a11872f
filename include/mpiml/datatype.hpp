// C++ element types -> MPI datatypes, resolved at compile time.
#pragma once

#include <mpi.h>

#include <complex>
#include <concepts>
#include <cstdint>
#include <type_traits>

namespace mpiml {

/// What reductions an element type allows (MPI 4.0, section 6.9.2).
enum class TypeClass { integer, floating, complex, logical };

template <class T>
struct mpi_type_traits;  // no definition: not an MPI type

#define MPIML_TYPE(T, DT, CLS)                                                 \
    template <>                                                                \
    struct mpi_type_traits<T> {                                                \
        static MPI_Datatype get() { return DT; }                               \
        static constexpr TypeClass type_class = TypeClass::CLS;               \
        static constexpr const char* name = #T;                                \
    };
MPIML_TYPE(char, (std::is_signed_v<char> ? MPI_SIGNED_CHAR : MPI_UNSIGNED_CHAR), integer)
MPIML_TYPE(signed char, MPI_SIGNED_CHAR, integer)
MPIML_TYPE(unsigned char, MPI_UNSIGNED_CHAR, integer)
MPIML_TYPE(short, MPI_SHORT, integer)
MPIML_TYPE(unsigned short, MPI_UNSIGNED_SHORT, integer)
MPIML_TYPE(int, MPI_INT, integer)
MPIML_TYPE(unsigned int, MPI_UNSIGNED, integer)
MPIML_TYPE(long, MPI_LONG, integer)
MPIML_TYPE(unsigned long, MPI_UNSIGNED_LONG, integer)
MPIML_TYPE(long long, MPI_LONG_LONG, integer)
MPIML_TYPE(unsigned long long, MPI_UNSIGNED_LONG_LONG, integer)
MPIML_TYPE(wchar_t, MPI_WCHAR, integer)
MPIML_TYPE(float, MPI_FLOAT, floating)
MPIML_TYPE(double, MPI_DOUBLE, floating)
MPIML_TYPE(long double, MPI_LONG_DOUBLE, floating)
MPIML_TYPE(bool, MPI_CXX_BOOL, logical)
MPIML_TYPE(std::complex<float>, MPI_CXX_FLOAT_COMPLEX, complex)
MPIML_TYPE(std::complex<double>, MPI_CXX_DOUBLE_COMPLEX, complex)
#undef MPIML_TYPE

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
