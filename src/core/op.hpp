// The reduce ops (op.cpp): names, MPI's predefined ops, and which type
// classes each op accepts.
#pragma once

#include <mpiml/datatype.hpp>
#include <mpiml/op.hpp>

namespace mpiml::detail {

/// The one legality rule (MPI 4.0, section 6.9.2).
constexpr bool op_allowed(Op op, TypeClass cls) {
    switch (op) {
        case Op::sum:
        case Op::prod: return cls != TypeClass::logical;
        case Op::min:
        case Op::max: return cls == TypeClass::integer || cls == TypeClass::floating;
        case Op::land:
        case Op::lor:
        case Op::lxor: return cls == TypeClass::integer || cls == TypeClass::logical;
        case Op::band:
        case Op::bor:
        case Op::bxor: return cls == TypeClass::integer;
    }
    return false;
}

/// Every mpiml::Op, in order.
inline constexpr Op all_ops[] = {Op::sum, Op::prod, Op::min,  Op::max, Op::land,
                                 Op::lor, Op::lxor, Op::band, Op::bor, Op::bxor};
/// An mpiml::Op's name and MPI's predefined op for it (name "invalid op",
/// MPI_OP_NULL for a value outside the enum).
struct OpInfo {
    const char* name;
    MPI_Op native;
};
OpInfo op_info(Op op);

}  // namespace mpiml::detail
