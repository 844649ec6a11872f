// mpiml::ReduceOp: an Op, or a raw MPI_Op recognized as one when it is built in.
#include "core/op.hpp"

#include <mpiml/error.hpp>
#include <mpiml/op.hpp>

#include <cstring>

namespace mpiml {

namespace detail {
OpInfo op_info(Op op) {
    switch (op) {
#define MPIML_OP(NAME, MPI, ...) \
    case Op::NAME: return {#NAME, MPI};
#include <mpiml/ops.def>
    }
    return {"invalid op", MPI_OP_NULL};
}

const Op* op_by_name(const char* name) {
    for (const Op& o : all_ops)
        if (std::strcmp(op_info(o).name, name) == 0) return &o;
    return nullptr;
}

std::string op_names() {
    std::string out;
    for (Op o : all_ops) out += (out.empty() ? "" : ", ") + std::string(op_info(o).name);
    return out;
}
}  // namespace detail

const char* op_name(Op op) { return detail::op_info(op).name; }

ReduceOp::ReduceOp(Op op) : known_(op) {
    native_ = detail::op_info(op).native;
    if (native_ == MPI_OP_NULL) detail::fail("mpiml::ReduceOp", "invalid mpiml::Op value");
}

ReduceOp::ReduceOp(MPI_Op op) : native_(op) {
    for (Op o : all_ops)
        if (detail::op_info(o).native == op) known_ = o;
}

const char* ReduceOp::name() const {
    if (known_) return op_name(*known_);
    return native_ == MPI_OP_NULL ? "MPI_OP_NULL" : "user-defined MPI_Op";
}

}  // namespace mpiml
