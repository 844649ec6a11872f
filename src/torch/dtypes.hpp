// The LibTorch dtype table, the one both torch doors use (the LibTorch layer
// and the torch.distributed backend): per torch dtype, its name and the
// registry's element type, derived from <mpiml/types.def> by kind and size.
#pragma once

#include "core/types.hpp"

#include <c10/core/ScalarType.h>

#include <cstddef>
#include <string>

namespace mpiml::torch_detail {

struct TorchDtype {
    at::ScalarType scalar;
    std::string name;  // "float32", "int64", "bool", "bfloat16", ...
    char kind;         // as detail::TypeInfo::kind; 0: none (quantized, ...)
    std::size_t size;  // bytes per element
    /// The registry's element type of the same kind and size; nullptr: none.
    const detail::TypeInfo* elem;
    /// What reductions compute in: elem, else a wider element of the same
    /// kind (float16 and bfloat16 in float32, complex32 in complex64);
    /// nullptr: none. reduced_scalar is its torch dtype.
    const detail::TypeInfo* reduced;
    at::ScalarType reduced_scalar;
};

/// The entry of dtype s (one table lookup); nullptr for a dtype outside
/// torch's list.
const TorchDtype* torch_dtype(at::ScalarType s);
/// The torch dtype of a registry element type; nullptr when torch has none.
const TorchDtype* torch_dtype_of(const detail::TypeInfo* e);

}  // namespace mpiml::torch_detail
