// LibTorch data-parallel utilities: the seed's mpi_pytorch module.
//
//   mpiml::setup_pytorch_for_mpi();
//   mpiml::sync_params(model);
//   ...
//   optimizer.zero_grad();
//   loss.backward();
//   mpiml::mpi_avg_grads(model);
//   optimizer.step();
#pragma once

#include <mpiml/session.hpp>

#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstddef>
#include <vector>

namespace mpiml {

/// Gives each rank a fair share of intra-op threads:
/// max(1, cores / ranks on this node). No-op when already at 1 thread.
void setup_pytorch_for_mpi();

/// Makes every rank's parameters and buffers equal to root's, fused per dtype.
/// First verifies across ranks that the modules match (count, names, shapes,
/// dtypes); on a mismatch every rank throws mpiml::Error naming the first
/// differing parameter and the ranks that differ.
void sync_params(torch::nn::Module& module, int root = 0, Comm comm = {});
void sync_params(const torch::Tensor& tensor, int root = 0, Comm comm = {});
void sync_params(const std::vector<torch::Tensor>& tensors, int root = 0, Comm comm = {});
template <class M>
void sync_params(const torch::nn::ModuleHolder<M>& holder, int root = 0, Comm comm = {}) {
    sync_params(*holder.ptr(), root, comm);  // ptr(): operator* is const
}
template <class M>
    requires std::derived_from<M, torch::nn::Module>
void sync_params(const std::shared_ptr<M>& module, int root = 0, Comm comm = {}) {
    sync_params(*module, root, comm);
}

struct AvgGradsOptions {
    /// Gradients are packed into buckets of at most this many bytes, one
    /// allreduce per bucket (a larger tensor gets a bucket of its own).
    std::size_t bucket_cap_bytes = 25u << 20;
};

/// Averages every parameter's gradient across ranks, in place. Undefined
/// gradients count as zeros (and become defined). dtype is preserved.
void mpi_avg_grads(torch::nn::Module& module, const AvgGradsOptions& opts = {}, Comm comm = {});
/// Same, for the gradients of a list of tensors (parameters).
void mpi_avg_grads(const std::vector<torch::Tensor>& params, const AvgGradsOptions& opts = {},
                   Comm comm = {});
template <class M>
void mpi_avg_grads(const torch::nn::ModuleHolder<M>& holder, const AvgGradsOptions& opts = {},
                   Comm comm = {}) {
    mpi_avg_grads(*holder.ptr(), opts, comm);
}
template <class M>
    requires std::derived_from<M, torch::nn::Module>
void mpi_avg_grads(const std::shared_ptr<M>& module, const AvgGradsOptions& opts = {},
                   Comm comm = {}) {
    mpi_avg_grads(*module, opts, comm);
}

/// Elementwise average of a tensor over all ranks, as a new tensor of the
/// same dtype and shape (e.g. PPO's approximate KL for early stopping).
torch::Tensor mpi_avg(const torch::Tensor& x, Comm comm = {});

}  // namespace mpiml
