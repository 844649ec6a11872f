#include "torch/dtypes.hpp"

#include <array>

namespace mpiml::torch_detail {
namespace {

constexpr auto n_dtypes = static_cast<std::size_t>(at::ScalarType::NumOptions);

char kind_of(at::ScalarType s) {
    if (s == at::kBool) return 'b';
    if (c10::isQIntType(s) || s == at::ScalarType::Undefined) return 0;
    if (c10::isComplexType(s)) return 'c';
    if (c10::isFloatingType(s)) return 'f';
    if (c10::isIntegralType(s, /*includeBool=*/false)) return c10::isSignedType(s) ? 'i' : 'u';
    return 0;
}

// Never destroyed: may be used from atexit.
const std::array<TorchDtype, n_dtypes>& table() {
    static const auto* t = [] {
        auto* t = new std::array<TorchDtype, n_dtypes>;
        for (std::size_t i = 0; i < n_dtypes; ++i) {
            const auto s = static_cast<at::ScalarType>(i);
            TorchDtype& d = (*t)[i];
            d.scalar = s;
            d.kind = kind_of(s);
            d.size = d.kind ? c10::elementSize(s) : 0;
            d.name = d.kind ? detail::kind_name(d.kind, d.size) : std::string(c10::toString(s));
            d.elem = detail::find_kind(d.kind, d.size);
            d.reduced = detail::reduced_in(d.kind, d.size);
            if (s == at::kBFloat16) {  // not IEEE's 16-bit format: no element of its size is it
                d.name = "bfloat16";
                d.elem = nullptr;
                d.reduced = detail::wider_than(d.kind, d.size);
            }
            d.reduced_scalar = at::ScalarType::Undefined;
        }
        for (TorchDtype& d : *t)
            for (const TorchDtype& w : *t)
                if (d.reduced && w.elem == d.reduced) {
                    d.reduced_scalar = w.scalar;
                    break;
                }
        return t;
    }();
    return *t;
}

}  // namespace

const TorchDtype* torch_dtype(at::ScalarType s) {
    const auto i = static_cast<std::size_t>(s);
    return i < n_dtypes ? &table()[i] : nullptr;
}

const TorchDtype* torch_dtype_of(const detail::TypeInfo* e) {
    if (!e) return nullptr;
    for (const TorchDtype& d : table())
        if (d.elem == e) return &d;
    return nullptr;
}

}  // namespace mpiml::torch_detail
