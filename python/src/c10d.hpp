// The torch.distributed backend "mpiml" (c10d.cpp): a c10d::ProcessGroup that
// adapts torch's calls to mpiml's core. Each operation is checked on the
// calling thread, then queued as a lambda on the group's one worker queue
// (worker_queue.hpp); the core runs the collective (shared-memory path, fixed
// reduction order), its agreement check and its watchdog.
#pragma once

#include "worker_queue.hpp"

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <ATen/ATen.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace mpiml_c10d {

/// An operation's Work: its future completes with the output tensors.
class MpimlWork : public c10d::Work {
public:
    // title: the profiler's name of the op ("mpiml:all_reduce"); inputs: the
    // tensors whose shapes the profiler records.
    MpimlWork(c10d::OpType type, std::vector<at::Tensor> outputs, const char* title,
              const std::vector<at::Tensor>& inputs);

    /// The runner, as the op starts: opens its profiler event (Work::finish
    /// closes it). The event is async, as Gloo's: started on the runner
    /// thread, ended on whichever completes the Work.
    void profile_start();
    /// Completes the future, then the Work (with e, if any).
    void complete(std::exception_ptr e);
    void set_source(int r) { source_.store(r); }
    /// The queue that may let a waiting thread run this op itself.
    void set_queue(std::weak_ptr<WorkerQueue> q) { queue_ = std::move(q); }

    /// Without a timeout, a thread about to block runs the op itself when the
    /// worker is idle (WorkerQueue::run_here), then waits as c10d's Work does.
    bool wait(std::chrono::milliseconds timeout = ::kNoTimeout) override;

    std::vector<at::Tensor> result() override { return outputs_; }
    c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
    int sourceRank() const override { return source_.load(); }

private:
    void record_profile(const char* title, const std::vector<at::Tensor>& inputs);

    std::function<void()> profile_start_;
    std::vector<at::Tensor> outputs_;
    c10::intrusive_ptr<c10::ivalue::Future> future_;
    std::atomic<int> source_{-1};
    std::weak_ptr<WorkerQueue> queue_;
};

class ProcessGroupMpiml : public c10d::ProcessGroup {
public:
    /// timeout_s: torch's timeout (the shorter of it and MPIML_TIMEOUT bounds
    /// every operation); global_ranks: the group's ranks in MPI_COMM_WORLD
    /// (empty: all of them, the default group).
    ProcessGroupMpiml(int rank, int size, double timeout_s, std::vector<int64_t> global_ranks,
                      std::string group_id);
    ~ProcessGroupMpiml() override;

    const std::string getBackendName() const override { return "mpiml"; }

    c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                             const c10d::BroadcastOptions& opts) override;
    c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                             const c10d::AllreduceOptions& opts) override;
    c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
        std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
    c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                          const c10d::ReduceOptions& opts) override;
    c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                             std::vector<at::Tensor>& inputs,
                                             const c10d::AllgatherOptions& opts) override;
    c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                   const c10d::AllgatherOptions& opts) override;
    c10::intrusive_ptr<c10d::Work> allgather_coalesced(
        std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
        const c10d::AllgatherOptions& opts) override;
    c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::GatherOptions& opts) override;
    c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                           std::vector<std::vector<at::Tensor>>& inputs,
                                           const c10d::ScatterOptions& opts) override;
    c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                  std::vector<std::vector<at::Tensor>>& inputs,
                                                  const c10d::ReduceScatterOptions& opts) override;
    c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
        at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
    c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                                 std::vector<int64_t>& output_splits,
                                                 std::vector<int64_t>& input_splits,
                                                 const c10d::AllToAllOptions& opts) override;
    c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                            std::vector<at::Tensor>& inputs,
                                            const c10d::AllToAllOptions& opts) override;
    c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst,
                                        int tag) override;
    c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src,
                                        int tag) override;
    c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors,
                                                 int tag) override;
    c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;

    /// Runs what is queued and stops the worker (idempotent).
    void shutdown();
    double timeout_seconds() const { return timeout_s_; }
    bool check_enabled() const { return check_.load(); }
    void set_check(bool on) { check_.store(on); }

private:
    /// What every rank of a collective must agree on: its OpType, element
    /// count, dtype, and reduce op or root (-1: not compared; reduce: op * 65536 + root).
    using Sig = std::array<std::int64_t, 4>;

    /// Queues a collective: body runs on the worker inside the core's scope
    /// for it (agreement round, watchdog, exit guard).
    c10::intrusive_ptr<c10d::Work> collective(const std::string& name, c10d::OpType type,
                                              const char* title, const std::vector<at::Tensor>& inputs,
                                              std::vector<at::Tensor> outputs, Sig sig,
                                              std::function<void()> body);
    c10::intrusive_ptr<c10d::Work> p2p(std::vector<at::Tensor>& tensors, int peer, int tag,
                                       bool is_send, bool any_source);
    int check_root(const std::string& call, int64_t root) const;
    void check_alltoall(const std::string& call, const std::vector<int>& send,
                        const std::vector<int>& recv);
    void reduce_inplace(at::Tensor& contig, c10d::ReduceOp::RedOpType op, const std::string& call);

    MPI_Comm comm_ = MPI_COMM_NULL;
    std::string group_id_;
    std::string where_;       // the watchdog's words for this group
    double timeout_s_ = 0;
    std::atomic<bool> check_{true};  // set from Python, read when an operation is issued
    std::shared_ptr<WorkerQueue> queue_;
};

/// Initializes MPI (MPI_THREAD_MULTIPLE) if nobody has; throws if it runs
/// below MPI_THREAD_MULTIPLE.
void ensure_mpi();
/// Python exit: drains every group's worker before MPI is finalized.
void at_exit();
/// The agreement check's default for groups created from now on.
void set_check_default(bool on);

}  // namespace mpiml_c10d
