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

#include <mpiml/checkpoint.hpp>
#include <mpiml/report.hpp>
#include <mpiml/session.hpp>

#include <ATen/core/Generator.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <cstddef>
#include <memory>
#include <source_location>
#include <string>
#include <vector>

namespace mpiml {

/// Gives each rank a fair share of intra-op threads: max(1, cpus / ranks on
/// this node that share them). Unbound ranks: cores / ranks on this node; ranks
/// a launcher bound to disjoint cores keep the cores they were given. Collective
/// over the default communicator; leaves the thread count alone when it is
/// already 1. Sets the same count in OpenBLAS or BLIS when libblas.so.3 is one
/// of them (their own thread pools ignore LibTorch's setting).
void setup_pytorch_for_mpi();

/// Makes every rank's parameters and buffers equal to root's: one broadcast per
/// dtype (a bit copy, so float16/bfloat16/int64 buffers are exact). First
/// verifies across ranks, in one small allreduce, that the modules match
/// (count, order, names, shapes, dtypes, root); on a mismatch every rank throws
/// the same mpiml::Error naming the first differing parameter or buffer, the
/// ranks that differ and what each has. Tensors registered twice (tied weights)
/// are synced once. loc: the call site its collectives are recorded with (in
/// the report's history and mismatch errors), the caller's by default.
void sync_params(torch::nn::Module& module, int root = 0, Comm comm = {},
                 std::source_location loc = std::source_location::current());
void sync_params(const torch::Tensor& tensor, int root = 0, Comm comm = {},
                 std::source_location loc = std::source_location::current());
void sync_params(const std::vector<torch::Tensor>& tensors, int root = 0, Comm comm = {},
                 std::source_location loc = std::source_location::current());
template <class M>
void sync_params(const torch::nn::ModuleHolder<M>& holder, int root = 0, Comm comm = {},
                 std::source_location loc = std::source_location::current()) {
    sync_params(*holder.ptr(), root, comm, loc);  // ptr(): operator* is const
}
template <class M>
    requires std::derived_from<M, torch::nn::Module>
void sync_params(const std::shared_ptr<M>& module, int root = 0, Comm comm = {},
                 std::source_location loc = std::source_location::current()) {
    sync_params(*module, root, comm, loc);
}

struct AvgGradsOptions {
    /// Gradients are packed into buckets of at most this many bytes, one
    /// allreduce per bucket (a larger tensor gets a bucket of its own).
    /// That larger tensor is reduced in its own memory when it is contiguous
    /// and its dtype travels as is (float32, float64, complex): no copy.
    std::size_t bucket_cap_bytes = 25u << 20;
    /// Gradients live in node-shared buckets (as PyTorch DDP's
    /// gradient_as_bucket_view): the first call moves each float32, float64
    /// or complex gradient of a contiguous CPU parameter into a shared bucket
    /// and makes .grad a view of it; later calls average the views in place,
    /// with no packing (see mpiml::SharedBucket). A gradient that is no longer
    /// a view (set_to_none, replaced) is copied straight into the bucket and
    /// becomes a view again. Other parameters take the packed path. Buckets
    /// are rebuilt (collectively) when the parameter list changes.
    bool gradient_as_bucket_view = false;
    /// GradAverager only: average while backward() still runs. Buckets are
    /// planned in reverse parameter order, each closed once it holds 1 MiB
    /// (the first) or bucket_cap_bytes (as DDP), towards the end half of
    /// what is left (at least 1 MiB, so the last bucket is small), or once
    /// the next two tensors would take it past bucket_cap_bytes; the plan is rebuilt once
    /// at the first call in the order rank 0's gradients became final (as
    /// DDP), and each bucket is averaged on a communication thread as
    /// soon as every gradient in it is final (a post-hook on each
    /// parameter's gradient accumulator); the call after backward() averages
    /// what is left (parameters that got no gradient: zeros) and waits.
    /// Results are bit-identical to the averaging without overlap on every
    /// path, at any number of ranks (see GradAverager: one summation order).
    /// Needs MPI_THREAD_SERIALIZED or higher; from a parameter's first
    /// gradient to the end of the call, only the communication thread may
    /// call MPI. With gradient_as_bucket_view, each overlap bucket gets
    /// memory of its own at the first call and, from the second step on, the
    /// gradients live there as views: averaged in place, with no packing
    /// during backward(); destroying the averager gives them their own
    /// memory back.
    /// When every rank of comm is on one node, overlap averages at the call
    /// instead (as without overlap), unless overlap_on_one_node: there the
    /// averaging is memory-bound work on the cores backward() uses, so it
    /// cannot be hidden (BENCHMARKS.md: about 80 of 1100 ms were).
    bool overlap = false;
    /// With overlap: overlap on one node too (for nodes whose cores backward()
    /// leaves idle, or to test the overlapped path on one host).
    bool overlap_on_one_node = false;
    /// With overlap: the communication thread waits for the network by
    /// testing its requests with short sleeps in between (its core goes to
    /// backward()); on MPI's path it sums with GradAverager's own
    /// reduce-scatter and allgather at 2 ranks too. false: MPI's polling
    /// waits (and MPI's allreduce at 2 ranks, the same bits).
    bool quiet_wait = true;
};

/// Averages every parameter's gradient across ranks, in place, with one
/// allreduce per bucket: parameters grouped by dtype in order of first
/// appearance, module order within, so every rank issues the same collectives
/// and results are reproducible. The sum is divided by the number of ranks.
/// - dtype is preserved; float16 and bfloat16 are summed in float32 and
///   converted back. Parameters that do not require grad, and integer or bool
///   parameters, are skipped (as DDP does).
/// - An undefined gradient counts as zeros on that rank and becomes defined;
///   a gradient undefined on every rank stays undefined (as in one process).
/// - Non-contiguous, expanded (replaced by a tensor of their own), sparse
///   (stay sparse, over the rows any rank had) and non-CPU gradients work.
/// - One rank: no-op. Tied parameters are averaged once.
/// - A bad gradient on one rank (wrong element count) throws there after the
///   collectives, so the other ranks do not hang.
/// - With mpiml::check_enabled(), first verifies that the modules match, as
///   sync_params does (one extra small allreduce).
/// - loc: the call site its collectives are recorded with (as sync_params).
void mpi_avg_grads(torch::nn::Module& module, const AvgGradsOptions& opts = {}, Comm comm = {},
                   std::source_location loc = std::source_location::current());
/// Same, for the gradients of a list of tensors (parameters).
void mpi_avg_grads(const std::vector<torch::Tensor>& params, const AvgGradsOptions& opts = {},
                   Comm comm = {}, std::source_location loc = std::source_location::current());
template <class M>
void mpi_avg_grads(const torch::nn::ModuleHolder<M>& holder, const AvgGradsOptions& opts = {},
                   Comm comm = {}, std::source_location loc = std::source_location::current()) {
    mpi_avg_grads(*holder.ptr(), opts, comm, loc);
}
template <class M>
    requires std::derived_from<M, torch::nn::Module>
void mpi_avg_grads(const std::shared_ptr<M>& module, const AvgGradsOptions& opts = {},
                   Comm comm = {}, std::source_location loc = std::source_location::current()) {
    mpi_avg_grads(*module, opts, comm, loc);
}

namespace detail {
struct GradAveragerImpl;
/// Why a model whose parameters are `now` (tied ones listed once or more)
/// no longer has the list `made` (one added, removed or replaced); empty if
/// it has. GradAverager's check at each call (and the Python binding's).
/// The names, where given (parallel to made and now), name the parameter.
std::string parameters_changed(const std::vector<torch::Tensor>& made, const std::vector<torch::Tensor>& now,
                               const std::vector<std::string>& made_names = {},
                               const std::vector<std::string>& now_names = {});
/// While one is alive on this thread, the tensor-list overloads of
/// sync_params, mpi_avg_grads and GradAverager call tensor i names[i] in
/// their cross-rank checks and messages, a parameter for i < parameters and a
/// buffer after (otherwise "tensor" and i): for bindings that pass a module's
/// tensors as a list. names must outlive it.
class TensorNames {
public:
    TensorNames(const std::vector<std::string>& names, std::size_t parameters) noexcept;
    ~TensorNames();
    TensorNames(const TensorNames&) = delete;
    TensorNames& operator=(const TensorNames&) = delete;
    /// The innermost alive on this thread, or null.
    static const TensorNames* current() noexcept;

    const std::vector<std::string>& names;
    const std::size_t parameters;

private:
    const TensorNames* outer_;
};
}  // namespace detail

/// Per-model gradient averaging that holds its plan, buffers and shared
/// buckets (as c10d's Reducer): `GradAverager avg(model, opts); ... avg();`.
/// The parameter list is captured at construction (the parameters are kept
/// alive); construction and destruction are collective over comm, as is each
/// call. The model must keep the parameters it had then, of the same dtypes
/// and sizes, and those that did not require grad must not start to (the
/// buckets are planned for them): otherwise the call still takes part in the
/// collectives, then throws naming the parameter. Make a new GradAverager
/// after changing the model. Each call averages the gradients as
/// mpi_avg_grads does, but sums
/// every element across ranks in one fixed order on every path: each node's
/// ranks in rank order, then the nodes' sums in node order (one node, or one
/// rank a node: ((g0 + g1) + g2) + ...), as mpiml's shared-memory path does;
/// on MPI's path (one rank a node, nodes of unequal size, MPIML_SHM=off)
/// with its own reduce-scatter and allgather instead of MPI's allreduce,
/// whose order depends on the size. So results do not depend on how the
/// buckets are cut: the same bits with overlap and without, and with
/// shared memory on or off. Collectives are recorded with the call site of the call (loc), those
/// during backward() (overlap) with the construction's.
/// Buckets a gradient still views at destruction (or that a binding drops
/// without a collective, detail::DeferFrees) are kept, and freed by the next
/// GradAverager made on the same ranks once no rank views or holds them.
class GradAverager {
public:
    explicit GradAverager(torch::nn::Module& module, const AvgGradsOptions& opts = {},
                          Comm comm = {}, std::source_location loc = std::source_location::current());
    explicit GradAverager(const std::vector<torch::Tensor>& params,
                          const AvgGradsOptions& opts = {}, Comm comm = {},
                          std::source_location loc = std::source_location::current());
    template <class M>
    explicit GradAverager(const torch::nn::ModuleHolder<M>& holder,
                          const AvgGradsOptions& opts = {}, Comm comm = {},
                          std::source_location loc = std::source_location::current())
        : GradAverager(*holder.ptr(), opts, comm, loc) {}
    template <class M>
        requires std::derived_from<M, torch::nn::Module>
    explicit GradAverager(const std::shared_ptr<M>& module, const AvgGradsOptions& opts = {},
                          Comm comm = {}, std::source_location loc = std::source_location::current())
        : GradAverager(static_cast<torch::nn::Module&>(*module), opts, comm, loc) {}
    ~GradAverager();
    GradAverager(GradAverager&&) noexcept;
    GradAverager& operator=(GradAverager&&) noexcept;
    GradAverager(const GradAverager&) = delete;
    GradAverager& operator=(const GradAverager&) = delete;

    /// Averages the gradients of the captured parameters across comm. With
    /// overlap: finishes the averaging backward() started, then rethrows the
    /// first failure of the communication thread (naming the rank), or a
    /// parameter whose gradient was accumulated again after it was averaged.
    void operator()(std::source_location loc = std::source_location::current());

    /// While it lives, backward() passes only accumulate gradients (as DDP's
    /// no_sync): with overlap, nothing is averaged until the first
    /// backward() after it ends, and the call after that averages the sum.
    /// Without overlap, nothing changes (averaging happens at the call).
    class NoSync {
    public:
        explicit NoSync(GradAverager& avg);
        ~NoSync();
        NoSync(const NoSync&) = delete;
        NoSync& operator=(const NoSync&) = delete;

    private:
        detail::GradAveragerImpl* impl_;
        bool was_;
    };
    [[nodiscard]] NoSync no_sync() { return NoSync(*this); }

    /// Releases the plan and buckets now, as the destructor does: collective
    /// (every rank at the same point). The averager cannot be called after.
    void close();

    /// Parameters whose gradients are averaged.
    std::size_t size() const;

    /// With overlap: the buckets in the order they are averaged, each as the
    /// positions of its parameters in the parameter list (module order).
    /// Planned in reverse parameter order, then rebuilt once, at the first
    /// call, in the order rank 0's gradients became final in that step (the
    /// same plan on every rank). Empty without overlap (or on one node, see
    /// AvgGradsOptions::overlap_on_one_node) or with one rank.
    std::vector<std::vector<std::size_t>> bucket_plan() const;

    /// With overlap: where this rank's averaging of the last step went, in
    /// seconds. Overlap pays when most of it was hidden behind backward().
    struct OverlapStats {
        std::size_t steps = 0;    ///< steps averaged so far (calls that ended a step)
        std::size_t buckets = 0;  ///< buckets averaged in the last step
        double averaging = 0;     ///< the communication thread's time in them
        double hidden = 0;        ///< of that, before the call after backward() began
        double left = 0;          ///< the call's own wait for the rest
    };
    /// All zero without overlap (or on one node, see
    /// AvgGradsOptions::overlap_on_one_node) or with one rank.
    OverlapStats overlap_stats() const;

private:
    std::unique_ptr<detail::GradAveragerImpl> impl_;
};

/// Elementwise average of a tensor over all ranks, as a new tensor of the
/// same shape, device and dtype (e.g. PPO's approximate KL for early stopping).
/// float16/bfloat16 are summed in float32; integer and bool tensors average
/// to float64, like mpiml::mpi_avg of integers. Not tracked by autograd.
torch::Tensor mpi_avg(const torch::Tensor& x, Comm comm = {});

// ------------------------------------------------------------ checkpoints
//
// LibTorch state in an mpiml::Checkpointer's StateMap, serialized with
// torch::save into memory:
//
//   st.shared.put("model", model).put("optimizer", optimizer);
//   st.per_rank.put("torch_rng", at::detail::getDefaultCPUGenerator());
//   ...
//   st.shared.get("model", model);          // into an existing module / optimizer
//   st.shared.get("optimizer", optimizer);  // over the same parameters
//   auto t = st.shared.get<torch::Tensor>("ema");

namespace detail {
void checkpoint_encode(const torch::nn::Module& m, std::string& out);
void checkpoint_decode(std::string_view in, torch::nn::Module& m);
void checkpoint_encode(const torch::optim::Optimizer& o, std::string& out);
void checkpoint_decode(std::string_view in, torch::optim::Optimizer& o);
void checkpoint_encode(const torch::Tensor& t, std::string& out);
void checkpoint_decode(std::string_view in, torch::Tensor& t);
void checkpoint_encode(const std::vector<torch::Tensor>& t, std::string& out);
void checkpoint_decode(std::string_view in, std::vector<torch::Tensor>& t);
void checkpoint_encode(const at::Generator& g, std::string& out);
void checkpoint_decode(std::string_view in, at::Generator& g);
}  // namespace detail

/// A module's parameters and buffers by name (kind "torch.module"); loads
/// into a module of the same structure.
template <class M>
    requires std::derived_from<M, torch::nn::Module>
struct CheckpointCodec<M> {
    static std::string kind() { return "torch.module"; }
    static void encode(const M& m, std::string& out) { detail::checkpoint_encode(m, out); }
    static void decode(std::string_view in, M& m) { detail::checkpoint_decode(in, m); }
};
/// Module holders: torch::nn::Linear, TORCH_MODULE(Net) types.
template <class H>
    requires std::derived_from<H, torch::nn::ModuleHolder<typename H::ContainedType>>
struct CheckpointCodec<H> {
    static std::string kind() { return "torch.module"; }
    static void encode(const H& m, std::string& out) { detail::checkpoint_encode(*m.ptr(), out); }
    static void decode(std::string_view in, H& m) { detail::checkpoint_decode(in, *m.ptr()); }
};
template <class M>
    requires std::derived_from<M, torch::nn::Module>
struct CheckpointCodec<std::shared_ptr<M>> {
    static std::string kind() { return "torch.module"; }
    static void encode(const std::shared_ptr<M>& m, std::string& out) { detail::checkpoint_encode(*m, out); }
    static void decode(std::string_view in, std::shared_ptr<M>& m) { detail::checkpoint_decode(in, *m); }
};
/// An optimizer's state (Adam's moments and step counts, param groups' options)
/// (kind "torch.optimizer"); loads into an optimizer over the same parameters.
template <class O>
    requires std::derived_from<O, torch::optim::Optimizer>
struct CheckpointCodec<O> {
    static std::string kind() { return "torch.optimizer"; }
    static void encode(const O& o, std::string& out) { detail::checkpoint_encode(o, out); }
    static void decode(std::string_view in, O& o) { detail::checkpoint_decode(in, o); }
};
/// A tensor (kind "torch.tensor"), any dtype; loaded on the device it was saved from.
template <>
struct CheckpointCodec<torch::Tensor> {
    static std::string kind() { return "torch.tensor"; }
    static void encode(const torch::Tensor& t, std::string& out) { detail::checkpoint_encode(t, out); }
    static void decode(std::string_view in, torch::Tensor& t) { detail::checkpoint_decode(in, t); }
};
/// A list of tensors (kind "torch.tensors").
template <>
struct CheckpointCodec<std::vector<torch::Tensor>> {
    static std::string kind() { return "torch.tensors"; }
    static void encode(const std::vector<torch::Tensor>& t, std::string& out) {
        detail::checkpoint_encode(t, out);
    }
    static void decode(std::string_view in, std::vector<torch::Tensor>& t) {
        detail::checkpoint_decode(in, t);
    }
};
/// A random generator's state, e.g. at::detail::getDefaultCPUGenerator()
/// (kind "torch.generator"); loading sets the state of the generator given.
template <>
struct CheckpointCodec<at::Generator> {
    static std::string kind() { return "torch.generator"; }
    static void encode(const at::Generator& g, std::string& out) { detail::checkpoint_encode(g, out); }
    static void decode(std::string_view in, at::Generator& g) { detail::checkpoint_decode(in, g); }
};

}  // namespace mpiml
