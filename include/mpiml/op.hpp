// Reduce operations: mpiml::Op, and ReduceOp, the argument every reduction
// takes (an Op or a raw MPI_Op).
#pragma once

#include <mpi.h>

#include <optional>

namespace mpiml {

/// Reduction operations (MPI's built-ins; the list: <mpiml/ops.def>).
enum class Op {
#define MPIML_OP(NAME, ...) NAME,
#include <mpiml/ops.def>
};

/// Every Op, in order.
inline constexpr Op all_ops[] = {
#define MPIML_OP(NAME, ...) Op::NAME,
#include <mpiml/ops.def>
};

/// An operation argument: an mpiml::Op or a raw MPI_Op. Raw built-in MPI ops
/// are recognized, so they get the same type checks as Op.
class ReduceOp {
public:
    ReduceOp(Op op);      // NOLINT: implicit on purpose
    ReduceOp(MPI_Op op);  // NOLINT: implicit on purpose
    MPI_Op native() const { return native_; }
    std::optional<Op> known() const { return known_; }
    const char* name() const;

private:
    MPI_Op native_;
    std::optional<Op> known_;
};

const char* op_name(Op op);

}  // namespace mpiml
