// What the LibTorch layer's files share (not installed): the dtype table,
// scratch buffers, the cross-rank module check and the module's tensors.
#pragma once

#include <mpiml/torch.hpp>

#include <mpiml/collectives.hpp>

#include "torch/dtypes.hpp"

#include <torch/types.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <new>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace mpiml::torch_detail {

// ------------------------------------------------------------ dtype table

/// How a dtype is summed (mpi_avg, mpi_avg_grads): MPI type and wire dtype,
/// from the dtype table (torch/dtypes.hpp).
struct Wire {
    MPI_Datatype mpi;
    TypeClass cls;
    at::ScalarType scalar;
    std::size_t size;  // bytes per element
};

std::string dtype_name(at::ScalarType s);
/// The wire for summing values of dtype s; nullopt when s cannot be summed.
/// Integers and bool are summed as float64 (only mpi_avg does that).
std::optional<Wire> sum_wire(at::ScalarType s);
bool has_gradients(at::ScalarType s);
/// MPI type and element multiplier for broadcasting dtype s (bit copy).
std::pair<MPI_Datatype, std::size_t> bcast_type(at::ScalarType s);

/// Calls f.template operator()<W, T>() for a gradient dtype stored as T and
/// summed on the wire as W (sum_wire's dtype); false for any other dtype.
template <class F>
bool with_grad_dtype(at::ScalarType s, F&& f) {
    switch (s) {
        case at::kFloat: f.template operator()<float, float>(); return true;
        case at::kDouble: f.template operator()<double, double>(); return true;
        case at::kHalf: f.template operator()<float, c10::Half>(); return true;
        case at::kBFloat16: f.template operator()<float, c10::BFloat16>(); return true;
        case at::kComplexFloat:
            f.template operator()<c10::complex<float>, c10::complex<float>>();
            return true;
        case at::kComplexDouble:
            f.template operator()<c10::complex<double>, c10::complex<double>>();
            return true;
        default: return false;
    }
}

/// True when t's elements can be read and written as a plain array of dtype s.
bool plain(const at::Tensor& t, at::ScalarType s);
/// Marks t (or its TensorImpl) as modified in place, as autograd expects;
/// inference tensors have no version counter.
void bump_version(c10::TensorImpl* t);
void bump_version(const at::Tensor& t);
/// A tensor of dtype `wire` over data (not owned).
at::Tensor wire_view(void* data, at::IntArrayRef sizes, at::ScalarType wire);

// ------------------------------------------------------- scratch buffers

/// Grows, never shrinks; 64-byte aligned. One per thread.
class Scratch {
public:
    void* get(std::size_t bytes) {
        if (bytes > cap_) {
            const std::size_t want = std::max<std::size_t>((bytes + 63) / 64 * 64, 4096);
            void* p = std::aligned_alloc(64, want);
            if (!p) throw std::bad_alloc();
            std::free(data_);
            data_ = p;
            cap_ = want;
        }
        return data_;
    }
    ~Scratch() { std::free(data_); }

private:
    void* data_ = nullptr;
    std::size_t cap_ = 0;
};

// ------------------------------------------------ cross-rank module check

/// One line per tensor: what must agree across ranks.
std::string describe(const char* kind, const std::string& name, const at::Tensor& t);
/// describe(), plus whether gradients are averaged for it.
std::string describe_grad(const char* kind, const std::string& name, const at::Tensor& t);

std::uint64_t fnv1a(const void* data, std::size_t n, std::uint64_t h);
constexpr std::uint64_t fnv_basis = 0xcbf29ce484222325ull;
/// Never 0: 0 means "absent".
std::uint64_t hash_desc(const std::string& d);

/// Verifies that every rank passed the same descriptions (and root, when
/// root >= 0), in one small allreduce; on a mismatch throws the same
/// mpiml::Error on every rank, naming the first differing entry and the ranks.
void verify_same(const std::vector<std::uint64_t>& hashes,
                 const std::function<std::string(std::size_t)>& desc_of, int root, MPI_Comm comm,
                 const char* call);
void verify_same(const std::vector<std::string>& descs, int root, MPI_Comm comm, const char* call);

/// " (rank 0 called at a.cpp:3; rank 1 called at b.cpp:9)", empty when no
/// rank knows its call site. Collective.
std::string called_from(int ref, MPI_Comm comm, const char* call);

/// An option that must be the same on every rank: its name, its value (a
/// flag: 0 or 1; otherwise shown unsigned), and the index of the flag it
/// matters under (-1: always; otherwise pass a fixed value where that flag is
/// off, and it is named only when that flag is on everywhere).
struct Setting {
    const char* name;
    std::int64_t value;
    bool flag = false;
    int only_if = -1;
};
/// Verifies in one small allreduce that every rank passed the same settings;
/// on a mismatch throws the same mpiml::Error on every rank, naming each
/// setting that differs, e.g. "ranks disagree on AvgGradsOptions.overlap:
/// rank 0 has true; rank 1 has false (ranks 0, 1 called at a.cpp:3)".
void verify_same_settings(const Setting* settings, int n, const char* what, MPI_Comm comm,
                          const char* call);

// ------------------------------------------------------------ collection

struct Named {
    const char* kind;  // "parameter" or "buffer"
    std::string name;
    at::Tensor tensor;
};

/// A module's parameters (and buffers), each tensor once.
std::vector<Named> module_entries(const torch::nn::Module& module, bool with_buffers);
/// module.parameters(true) in the same order, without building the names.
void collect_params(const torch::nn::Module& m, std::vector<at::Tensor>& out);
/// Kind and name of entry i of a tensor list: those a detail::TensorNames on
/// this thread gives, else "tensor" and i.
Named list_name(std::size_t i, const at::Tensor& t);
/// A tensor list as entries; throws naming `what` for an undefined tensor.
std::vector<Named> list_entries(const std::vector<torch::Tensor>& tensors, const char* what);

}  // namespace mpiml::torch_detail
