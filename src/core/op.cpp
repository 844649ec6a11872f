// mpiml::ReduceOp: an Op, or a raw MPI_Op recognized as one when it is built in.
#include "core/op.hpp"

#include <mpiml/error.hpp>
#include <mpiml/op.hpp>

namespace mpiml {

namespace detail {
OpInfo op_info(Op op) {
    switch (op) {
        case Op::sum: return {"sum", MPI_SUM};
        case Op::prod: return {"prod", MPI_PROD};
        case Op::min: return {"min", MPI_MIN};
        case Op::max: return {"max", MPI_MAX};
        case Op::land: return {"land", MPI_LAND};
        case Op::lor: return {"lor", MPI_LOR};
        case Op::lxor: return {"lxor", MPI_LXOR};
        case Op::band: return {"band", MPI_BAND};
        case Op::bor: return {"bor", MPI_BOR};
        case Op::bxor: return {"bxor", MPI_BXOR};
    }
    return {"invalid op", MPI_OP_NULL};
}
}  // namespace detail

const char* op_name(Op op) { return detail::op_info(op).name; }

ReduceOp::ReduceOp(Op op) : known_(op) {
    native_ = detail::op_info(op).native;
    if (native_ == MPI_OP_NULL) detail::fail("mpiml::ReduceOp", "invalid mpiml::Op value");
}

ReduceOp::ReduceOp(MPI_Op op) : native_(op) {
    for (Op o : detail::all_ops)
        if (detail::op_info(o).native == op) known_ = o;
}

const char* ReduceOp::name() const {
    if (known_) return op_name(*known_);
    return native_ == MPI_OP_NULL ? "MPI_OP_NULL" : "user-defined MPI_Op";
}

}  // namespace mpiml
