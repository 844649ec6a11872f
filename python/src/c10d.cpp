// mpiml._c10d: the torch.distributed backend "mpiml", a c10d::ProcessGroup on
// mpiml's core (allreduce, broadcast, allgather, barrier: shared-memory path,
// fixed reduction order) and plain MPI for the rest (gather, scatter,
// alltoall, send/recv). One worker thread per group runs the operations in
// issue order (a spare takes over while it is held up in a future's
// callbacks); a watchdog thread ends the job when one outlives the timeout.
#include <mpiml/collectives.hpp>
#include <mpiml/error.hpp>
#include <mpiml/failure.hpp>
#include <mpiml/profile.hpp>
#include <mpiml/session.hpp>

#include "core/op.hpp"        // src/: the registry of ops
#include "torch/dtypes.hpp"   // the LibTorch dtype table

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/csrc/utils/pybind.h>

#include <ATen/ATen.h>
#include <ATen/ThreadLocalState.h>
#include <ATen/record_function.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include <sched.h>
#include <sys/prctl.h>

namespace py = pybind11;

namespace mpiml_c10d {
namespace {

using Clock = std::chrono::steady_clock;
using c10d::OpType;
using RedOp = c10d::ReduceOp::RedOpType;

[[noreturn]] void fail(const std::string& call, const std::string& what) {
    mpiml::detail::fail(("mpiml c10d " + call).c_str(), what);
}

void check(int rc, const std::string& call) {
    mpiml::detail::check_mpi(rc, ("mpiml c10d " + call).c_str());
}

// ------------------------------------------------------------ dtypes and ops
// From mpiml's registry (<mpiml/ops.def>: each op's c10d::ReduceOp) and the
// LibTorch dtype table the LibTorch layer uses too (torch/dtypes.hpp).
using mpiml::torch_detail::TorchDtype;
using mpiml::torch_detail::torch_dtype;

const char* op_name(RedOp op) {
    if (op == RedOp::AVG) return "AVG";
#define MPIML_OP(NAME, MPI, CLASSES, ON_BOOL, TORCH, ...) \
    if (RedOp::TORCH != RedOp::UNUSED && op == RedOp::TORCH) return #TORCH;
#include <mpiml/ops.def>
    return op == RedOp::PREMUL_SUM ? "PREMUL_SUM" : "UNUSED";
}

// The registry op of a torch op (AVG: a sum, then divided); none: unsupported.
std::optional<mpiml::Op> registry_op(RedOp op) {
    if (op == RedOp::AVG) return mpiml::Op::sum;
#define MPIML_OP(NAME, MPI, CLASSES, ON_BOOL, TORCH, ...) \
    if (RedOp::TORCH != RedOp::UNUSED && op == RedOp::TORCH) return mpiml::Op::NAME;
#include <mpiml/ops.def>
    return std::nullopt;
}

int dtype_id(at::ScalarType t) { return static_cast<int>(t); }

// Every dtype whose reductions have an element type to compute in.
bool supported_dtype(at::ScalarType t) {
    const TorchDtype* d = torch_dtype(t);
    return d && d->reduced;
}

// The registry op a reduction of dtype d runs: on bool, torch's ops mean
// their logical counterparts (SUM is or, PRODUCT is and, ...).
mpiml::Op mpiml_op(RedOp op, const TorchDtype& d) {
    const mpiml::Op o = *registry_op(op);
    if (d.reduced->cls == mpiml::TypeClass::logical && !mpiml::detail::op_allowed(o, mpiml::TypeClass::logical))
        return mpiml::detail::op_on_bool(o);
    return o;
}

void check_op_dtype(const std::string& call, RedOp op, at::ScalarType t) {
    const auto o = registry_op(op);
    if (!o) fail(call, std::string("reduce op ") + op_name(op) + " is not supported by the mpiml backend");
    const TorchDtype& d = *torch_dtype(t);  // check_tensor passed
    const auto cls = d.reduced->cls;
    const bool ok = op == RedOp::AVG ? cls != mpiml::TypeClass::logical
                                     : mpiml::detail::op_allowed(mpiml_op(op, d), cls);
    if (!ok) fail(call, std::string("reduce op ") + op_name(op) + " is not defined for " + d.name);
}

// -------------------------------------------------------------- validation

std::string describe(const at::Tensor& t) {
    std::string s = std::string(c10::toString(t.scalar_type())) + "[";
    for (int64_t i = 0; i < t.dim(); ++i) s += (i ? "," : "") + std::to_string(t.size(i));
    return s + "]";
}

void check_tensor(const std::string& call, const at::Tensor& t) {
    if (!t.defined()) fail(call, "got an undefined tensor");
    if (!t.device().is_cpu())
        fail(call, "tensor is on " + t.device().str() +
                       "; the mpiml backend takes CPU tensors only (use the nccl backend for CUDA)");
    if (t.layout() != at::kStrided)
        fail(call, "sparse tensors are not supported by the mpiml backend");
    if (!supported_dtype(t.scalar_type()))
        fail(call, "dtype " + std::string(c10::toString(t.scalar_type())) +
                       " is not supported by the mpiml backend");
}

void check_single(const std::string& call, const std::vector<at::Tensor>& ts) {
    if (ts.size() != 1)
        fail(call, "takes exactly one tensor per rank, got " + std::to_string(ts.size()));
    check_tensor(call, ts[0]);
}

void check_same(const std::string& call, const at::Tensor& want, const at::Tensor& got,
                const std::string& what) {
    check_tensor(call, got);
    if (got.scalar_type() != want.scalar_type() || got.numel() != want.numel())
        fail(call, what + " is " + describe(got) + " but must match the input " + describe(want));
}

std::size_t nbytes(const at::Tensor& t) { return static_cast<std::size_t>(t.nbytes()); }

int int_count(const std::string& call, std::size_t n) {
    if (n > static_cast<std::size_t>(INT_MAX))
        fail(call, "more than INT_MAX bytes in one message (" + std::to_string(n) + ")");
    return static_cast<int>(n);
}

// A contiguous tensor with t's data; written back by finish() if it is a copy.
struct Contig {
    at::Tensor orig, buf;
    explicit Contig(const at::Tensor& t) : orig(t), buf(t.is_contiguous() ? t : t.contiguous()) {}
    void finish() {
        if (!buf.is_same(orig)) orig.copy_(buf);
    }
    char* data() const { return static_cast<char*>(buf.data_ptr()); }
};

// ------------------------------------------------------------------- work

class MpimlWork : public c10d::Work {
public:
    // title: the profiler's name of the op ("mpiml:all_reduce"); inputs: the
    // tensors whose shapes the profiler records.
    MpimlWork(OpType type, std::vector<at::Tensor> outputs, const char* title,
              const std::vector<at::Tensor>& inputs)
        : c10d::Work(-1, type),
          outputs_(std::move(outputs)),
          future_(c10::make_intrusive<c10::ivalue::Future>(
              c10::ListType::create(c10::TensorType::get()))) {
        if (title) record_profile(title, inputs);
    }

    // The runner, as the op starts: opens its profiler event (Work::finish
    // closes it). The event is async, as Gloo's: started on the runner
    // thread, ended on whichever completes the Work.
    void profile_start() {
        if (profile_start_) {
            profile_start_();
            profile_start_ = nullptr;
        }
    }

    std::vector<at::Tensor> result() override { return outputs_; }
    c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
    int sourceRank() const override { return source_.load(); }

    void complete(std::exception_ptr e) {
        // The profiler event ends before anyone can see the op done (DDP
        // waits on the future): a profiler stopped right after still has it.
        {
            std::lock_guard lock(mutex_);
            if (recordFunctionEndCallback_) {
                recordFunctionEndCallback_();
                recordFunctionEndCallback_ = nullptr;
            }
        }
        // The future first: wait() returning means the future is done too.
        if (e) {
            future_->setError(e);
            finish(e);
        } else {
            future_->markCompleted(c10::IValue(outputs_));
            finish();
        }
    }
    void set_source(int r) { source_.store(r); }

private:
    // As ProcessGroupGloo's AsyncWork: only when a profiler (or another
    // RecordFunction callback) is on in the issuing thread, whose thread-local
    // state the runner takes on around the event's start and end.
    void record_profile(const char* title, const std::vector<at::Tensor>& inputs) {
        auto callbacks = at::getStepCallbacksUnlessEmpty(at::RecordScope::USER_SCOPE);
        if (!callbacks) return;
        auto rf = std::make_shared<at::RecordFunction>(std::move(*callbacks));
        profile_start_ = at::wrapPropagateTLSState([rf, title, inputs] {
            rf->_setAsync();
            std::vector<c10::IValue> args(inputs.begin(), inputs.end());
            rf->before(title, c10::ArrayRef<const c10::IValue>(args.data(), args.size()));
        });
        recordFunctionEndCallback_ = at::wrapPropagateTLSState([rf] { rf->end(); });
    }

    std::function<void()> profile_start_;
    std::vector<at::Tensor> outputs_;
    c10::intrusive_ptr<c10::ivalue::Future> future_;
    std::atomic<int> source_{-1};
};

// ------------------------------------------------------------ the group

std::atomic<bool> g_check_default{true};
std::atomic<bool> g_exiting{false};

// The exit guard's kind of a c10d operation (mpiml::detail::ExitMark).
int exit_kind(std::int64_t op) {
    switch (static_cast<c10d::OpType>(op)) {
        case c10d::OpType::ALLREDUCE:
        case c10d::OpType::ALLREDUCE_COALESCED: return 1;
        case c10d::OpType::BROADCAST: return 2;
        case c10d::OpType::ALLGATHER:
        case c10d::OpType::_ALLGATHER_BASE:
        case c10d::OpType::ALLGATHER_COALESCED: return 3;
        case c10d::OpType::BARRIER: return 4;
        default: return 5;
    }
}

class ProcessGroupMpiml;
// Live groups, so that exit can drain their workers before MPI_Finalize.
std::mutex g_groups_mutex;
std::vector<ProcessGroupMpiml*> g_groups;
// The group whose Works this thread is completing (running their callbacks).
thread_local const ProcessGroupMpiml* t_completing = nullptr;

// A signature every rank of a collective must agree on (kind, element
// size/count, dtype, op or root); -1 entries are not compared.
struct Sig {
    std::int64_t v[4] = {-1, -1, -1, -1};
};

class ProcessGroupMpiml : public c10d::ProcessGroup {
public:
    ProcessGroupMpiml(int rank, int size, double timeout_s, std::vector<int64_t> global_ranks,
                      std::string group_id);
    ~ProcessGroupMpiml() override {
        shutdown();
        std::lock_guard lock(g_groups_mutex);
        std::erase(g_groups, this);
    }

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

    void shutdown();
    double timeout_seconds() const { return timeout_s_; }
    bool check_enabled() const { return check_.load(); }
    void set_check(bool on) { check_.store(on); }
    MPI_Comm comm() const { return comm_; }

private:
    // An operation for the runner. A p2p op posts its request and returns
    // it; the runner completes the Work when the request completes.
    struct Entry {
        std::string name;
        std::function<MPI_Request(MpimlWork&)> run;
        c10::intrusive_ptr<MpimlWork> work;
        Sig sig;
        bool collective = true;
    };
    struct Pending {
        MPI_Request req;
        c10::intrusive_ptr<MpimlWork> work;
        std::function<void()> done;  // copies back a receive buffer
        std::string name;
        Clock::time_point start;
        bool any_source;
    };

    // title and inputs: the op's profiler event (MpimlWork).
    c10::intrusive_ptr<c10d::Work> enqueue(std::string name, OpType type, const char* title,
                                           const std::vector<at::Tensor>& inputs,
                                           std::vector<at::Tensor> outputs, Sig sig,
                                           std::function<MPI_Request(MpimlWork&)> run,
                                           bool collective = true);
    // A Work to complete, with its error if any.
    struct Done {
        c10::intrusive_ptr<MpimlWork> work;
        std::exception_ptr ep;
    };

    void loop(bool runner);
    bool complete_all(std::vector<Done>& done, std::unique_lock<std::mutex>& lock);
    bool hand_off_locked();
    void watchdog_loop();
    void verify(const Entry& e);
    // verify's wait: polls before yielding, and how long it yields before napping.
    static constexpr int kSpinPolls = 200;
    static constexpr auto kYieldTime = std::chrono::microseconds(500);
    void poll_pending(bool block_briefly, std::vector<Done>& done);
    void cancel_pending(std::vector<Done>& done);
    int check_root(const std::string& call, int64_t root) const;
    c10::intrusive_ptr<c10d::Work> p2p(std::vector<at::Tensor>& tensors, int peer, int tag,
                                       bool is_send, bool any_source);
    void reduce_inplace(at::Tensor& contig, RedOp op, const std::string& call);

    MPI_Comm comm_ = MPI_COMM_NULL;
    std::string group_id_;
    std::string ranks_text_;
    double timeout_s_ = 0;
    std::atomic<bool> check_{true};  // set from Python, read by the runner

    // Threads: one at a time holds the runner role: it runs the queue in
    // issue order, polls pending_ and completes the Works. Completing a Work
    // runs its future's callbacks (then(), DDP comm hooks) on that thread,
    // and a callback may block: PowerSGD's issue a collective on this group
    // and wait for it, which would wait behind them in the queue. So the role is given up around the callbacks; a
    // collective issued from inside them, or work left waiting past a
    // watchdog tick, hands it to a spare thread (started on first need), and
    // the thread back from its callbacks becomes a spare if the role was taken.
    std::mutex m_;
    std::condition_variable cv_;        // the runner: work queued, or stop
    std::condition_variable spare_cv_;  // spares: the role is free and work waits
    std::deque<Entry> queue_;
    bool stop_ = false;
    bool runner_ = true;        // some thread holds the runner role
    int idle_spares_ = 0;       // spares waiting on spare_cv_ (or starting)
    std::uint64_t releases_ = 0;  // times the role was given up for callbacks
    bool closed_ = false;       // shutdown joined every thread: start no more
    std::vector<std::thread> threads_;

    std::vector<Pending> pending_;  // the runner only

    // The operation in flight, for the watchdog.
    std::mutex wm_;
    std::condition_variable wcv_;
    bool wstop_ = false;
    bool busy_ = false;
    std::string current_;
    Clock::time_point started_;
    std::uint64_t seq_ = 0;
    std::size_t npending_ = 0;
    Clock::time_point oldest_pending_;
    std::string oldest_pending_name_;
    std::thread watchdog_;
};

void ensure_mpi() {
    if (!mpiml::is_initialized()) {
        // Leaked on purpose: mpiml finalizes MPI at exit.
        mpiml::SessionOptions o;
        o.thread_level = MPI_THREAD_MULTIPLE;
        new mpiml::Session(o);
    } else {
        mpiml::ensure_initialized("mpiml c10d");
    }
    int provided = 0;
    check(MPI_Query_thread(&provided), "init");
    if (provided < MPI_THREAD_MULTIPLE) {
        const char* names[] = {"MPI_THREAD_SINGLE", "MPI_THREAD_FUNNELED", "MPI_THREAD_SERIALIZED",
                               "MPI_THREAD_MULTIPLE"};
        fail("init", std::string("MPI was initialized with ") +
                         (provided >= 0 && provided <= 3 ? names[provided] : "an unknown level") +
                         " but the mpiml backend calls MPI from a worker thread and needs "
                         "MPI_THREAD_MULTIPLE; import mpiml.torch (or mpi4py, which asks for it) "
                         "before anything else initializes MPI");
    }
}

ProcessGroupMpiml::ProcessGroupMpiml(int rank, int size, double timeout_s,
                                     std::vector<int64_t> global_ranks, std::string group_id)
    : c10d::ProcessGroup(rank, size), group_id_(std::move(group_id)) {
    ensure_mpi();
    int wrank = 0, wsize = 0;
    check(MPI_Comm_rank(MPI_COMM_WORLD, &wrank), "init");
    check(MPI_Comm_size(MPI_COMM_WORLD, &wsize), "init");
    if (global_ranks.empty()) {
        if (rank != wrank || size != wsize)
            fail("init", "torch.distributed says rank " + std::to_string(rank) + " of " +
                             std::to_string(size) + " but MPI says rank " + std::to_string(wrank) +
                             " of " + std::to_string(wsize) +
                             "; launch with mpirun -n WORLD_SIZE and take RANK/WORLD_SIZE from MPI "
                             "(mpiml.torch.init_process_group does)");
        check(MPI_Comm_dup(MPI_COMM_WORLD, &comm_), "init (MPI_Comm_dup)");
        ranks_text_ = "all " + std::to_string(size) + " ranks";
    } else {
        if (static_cast<int>(global_ranks.size()) != size)
            fail("init", "group of " + std::to_string(size) + " ranks but " +
                             std::to_string(global_ranks.size()) + " global ranks given");
        std::vector<int> ranks;
        for (auto r : global_ranks) {
            if (r < 0 || r >= wsize)
                fail("init", "global rank " + std::to_string(r) + " is outside MPI_COMM_WORLD (" +
                                 std::to_string(wsize) + " ranks)");
            ranks.push_back(static_cast<int>(r));
            ranks_text_ += (ranks_text_.empty() ? "ranks " : ",") + std::to_string(r);
        }
        if (rank < 0 || rank >= size || ranks[rank] != wrank)
            fail("init", "this process is MPI rank " + std::to_string(wrank) +
                             " but torch.distributed placed it at group rank " +
                             std::to_string(rank) + " of " + ranks_text_ +
                             "; the default group's ranks must be MPI_COMM_WORLD's");
        MPI_Group world_group = MPI_GROUP_NULL, group = MPI_GROUP_NULL;
        check(MPI_Comm_group(MPI_COMM_WORLD, &world_group), "init (MPI_Comm_group)");
        check(MPI_Group_incl(world_group, size, ranks.data(), &group), "init (MPI_Group_incl)");
        // Only the members call this; the tag keeps concurrent creations apart.
        const int tag = static_cast<int>(std::hash<std::string>{}(group_id_) % 32768);
        const int rc = MPI_Comm_create_group(MPI_COMM_WORLD, group, tag, &comm_);
        MPI_Group_free(&group);
        MPI_Group_free(&world_group);
        check(rc, "init (MPI_Comm_create_group)");
    }
    check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "init");
    const std::string name = "mpiml c10d group " + group_id_;
    MPI_Comm_set_name(comm_, name.c_str());

    // Deadline: torch's timeout, or MPIML_TIMEOUT when that is shorter.
    timeout_s_ = timeout_s;
    const double env = mpiml::timeout();
    if (env > 0 && (timeout_s_ <= 0 || env < timeout_s_)) timeout_s_ = env;
    check_ = g_check_default.load();
    if (const auto v = mpiml::detail::env_c10d_check()) check_ = *v;

    threads_.emplace_back([this] { loop(/*runner=*/true); });
    watchdog_ = std::thread([this] { watchdog_loop(); });
    std::lock_guard lock(g_groups_mutex);
    g_groups.push_back(this);
}

// Python exit: finish every group's queued work and stop its threads. MPI is
// finalized after the interpreter, by mpiml's exit handler (or by mpi4py's,
// if it initialized MPI), which knows the exit status for the exit guard.
void at_exit() {
    g_exiting.store(true);
    std::vector<ProcessGroupMpiml*> groups;
    {
        std::lock_guard lock(g_groups_mutex);
        groups = g_groups;
    }
    for (auto* g : groups) g->shutdown();
}

void ProcessGroupMpiml::shutdown() {
    {
        std::lock_guard lock(m_);
        if (stop_) return;
        stop_ = true;
    }
    cv_.notify_all();
    spare_cv_.notify_all();
    // A thread may start while others drain: join until none is left.
    for (;;) {
        std::vector<std::thread> ts;
        {
            std::lock_guard lock(m_);
            ts.swap(threads_);
            if (ts.empty()) {
                closed_ = true;
                break;
            }
        }
        for (auto& t : ts) t.join();
    }
    {
        std::lock_guard lock(wm_);
        wstop_ = true;
    }
    wcv_.notify_all();
    if (watchdog_.joinable()) watchdog_.join();
    // Not at exit: freeing a communicator can be collective (its shared-memory
    // segment), and a peer may never come; MPI_Finalize, after the exit
    // guard, releases it.
    if (comm_ != MPI_COMM_NULL && !g_exiting.load() && mpiml::is_initialized() &&
        !mpiml::is_finalized())
        MPI_Comm_free(&comm_);
    comm_ = MPI_COMM_NULL;
}

int ProcessGroupMpiml::check_root(const std::string& call, int64_t root) const {
    if (root < 0 || root >= size_)
        fail(call, "root rank " + std::to_string(root) + " is outside the group of " +
                       std::to_string(size_) + " ranks");
    return static_cast<int>(root);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMpiml::enqueue(
    std::string name, OpType type, const char* title, const std::vector<at::Tensor>& inputs,
    std::vector<at::Tensor> outputs, Sig sig, std::function<MPI_Request(MpimlWork&)> run,
    bool collective) {
    auto work = c10::make_intrusive<MpimlWork>(type, std::move(outputs), title, inputs);
    {
        std::lock_guard lock(m_);
        if (stop_) fail(name, "the process group has been shut down");
        queue_.push_back(Entry{std::move(name), std::move(run), work, sig, collective});
        if (!runner_) {
            // The runner is in callbacks. Issued from one of them (this
            // thread), the op would wait behind the callback that waits for it.
            if (t_completing == this && !hand_off_locked()) {
                const std::string n = std::move(queue_.back().name);
                queue_.pop_back();
                fail(n, "issued from a future's callback, it needs a spare thread, which could "
                        "not be started");
            }
            return work;
        }
    }
    cv_.notify_one();
    return work;
}

// With m_ held: wakes a spare to take the free runner role, or starts one.
// False if a thread could not be started.
bool ProcessGroupMpiml::hand_off_locked() {
    if (idle_spares_ > 0) {
        spare_cv_.notify_one();
    } else if (!closed_) {
        ++idle_spares_;  // counted from its start, so that it is started once
        try {
            threads_.emplace_back([this] { loop(/*runner=*/false); });
        } catch (const std::system_error&) {
            --idle_spares_;
            return false;
        }
    }
    return true;
}

// Every rank agrees on the call's signature first, so that a mismatch (size,
// dtype, op, root) is an error on every rank instead of a hang or a wrong result.
void ProcessGroupMpiml::verify(const Entry& e) {
    std::int64_t buf[8];
    for (int i = 0; i < 4; ++i) {
        buf[i] = e.sig.v[i];
        buf[4 + i] = -e.sig.v[i];
    }
    // Non-blocking and polled: a rank that is ahead (say, its backward pass
    // finished first) spins briefly, then yields for kYieldTime (the core
    // goes to this process's backward pass or another rank when one is
    // runnable, else the poll goes on at once), then naps. Once all have
    // arrived, the collective itself runs with everyone present.
    MPI_Request req = MPI_REQUEST_NULL;
    check(MPI_Iallreduce(MPI_IN_PLACE, buf, 8, MPI_INT64_T, MPI_MAX, comm_, &req), e.name);
    int done = 0;
    auto nap = std::chrono::microseconds(10);
    Clock::time_point yielding;
    for (int polls = 0;; ++polls) {
        check(MPI_Test(&req, &done, MPI_STATUS_IGNORE), e.name);
        if (done) break;
        if (polls < kSpinPolls) continue;
        if (polls == kSpinPolls) yielding = Clock::now();
        if (Clock::now() - yielding < kYieldTime) {
            sched_yield();
        } else {
            std::this_thread::sleep_for(nap);
            nap = std::min(nap * 2, std::chrono::microseconds(200));
        }
    }
    bool same = true;
    for (int i = 0; i < 4; ++i) same = same && buf[i] == -buf[4 + i];
    if (same) return;
    std::vector<std::int64_t> all(4 * static_cast<std::size_t>(size_));
    check(MPI_Allgather(e.sig.v, 4, MPI_INT64_T, all.data(), 4, MPI_INT64_T, comm_), e.name);
    std::map<std::vector<std::int64_t>, std::vector<int>> groups;
    for (int r = 0; r < size_; ++r)
        groups[std::vector<std::int64_t>(all.begin() + 4 * r, all.begin() + 4 * r + 4)].push_back(r);
    std::string text = "ranks of group " + group_id_ + " disagree on the call: ";
    bool first = true;
    for (const auto& [s, ranks] : groups) {
        text += first ? "" : "; ";
        first = false;
        text += ranks.size() == 1 ? "rank " : "ranks ";
        for (std::size_t i = 0; i < ranks.size(); ++i) text += (i ? "," : "") + std::to_string(ranks[i]);
        text += " called " + c10d::opTypeToString(static_cast<OpType>(s[0]));
        if (s[1] >= 0) text += " of " + std::to_string(s[1]) + " elements";
        if (s[2] >= 0) text += ", dtype " + std::string(c10::toString(static_cast<at::ScalarType>(s[2])));
        if (s[3] >= 0) text += ", op/root " + std::to_string(s[3]);
    }
    fail(e.name, text + " (this rank is group rank " + std::to_string(rank_) + ")");
}

// Collects the finished requests' Works into done (completed by complete_all,
// after this thread is done with pending_).
void ProcessGroupMpiml::poll_pending(bool block_briefly, std::vector<Done>& done) {
    if (pending_.empty()) return;
    for (std::size_t i = 0; i < pending_.size();) {
        int flag = 0;
        MPI_Status st;
        auto& p = pending_[i];
        const int rc = MPI_Test(&p.req, &flag, &st);
        if (rc != MPI_SUCCESS || flag) {
            std::exception_ptr ep;
            try {
                check(rc, p.name);
                if (p.any_source) p.work->set_source(st.MPI_SOURCE);
                if (p.done) p.done();
            } catch (...) {
                ep = std::current_exception();
            }
            done.push_back(Done{p.work, ep});
            pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(i));
            continue;
        }
        ++i;
    }
    {
        std::lock_guard lock(wm_);
        npending_ = pending_.size();
        if (!pending_.empty()) {
            oldest_pending_ = pending_.front().start;
            oldest_pending_name_ = pending_.front().name;
        }
    }
    if (block_briefly && !pending_.empty()) std::this_thread::sleep_for(std::chrono::microseconds(20));
}

// At shutdown: sends and receives that never matched end with an error.
void ProcessGroupMpiml::cancel_pending(std::vector<Done>& done) {
    for (auto& p : pending_) {
        MPI_Cancel(&p.req);
        MPI_Request_free(&p.req);
        try {
            fail(p.name, "the process group was shut down before it completed");
        } catch (...) {
            done.push_back(Done{p.work, std::current_exception()});
        }
    }
    pending_.clear();
}

void ProcessGroupMpiml::loop(bool runner) {
    // The runner's naps are 10-200 us; Linux's default timer slack (50 us)
    // would add most of that again to each.
    prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL);
    std::vector<Done> done;
    std::unique_lock lock(m_);
    for (;;) {
        if (!runner) {
            // A spare: takes the role when it is free and work waits (or at stop).
            spare_cv_.wait(lock, [&] {
                return !runner_ && (stop_ || !queue_.empty() || !pending_.empty());
            });
            --idle_spares_;
            runner_ = runner = true;
        }
        if (pending_.empty()) cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) {
            if (stop_ && pending_.empty()) {
                // Drained: the spares take the role in turn, find the same and end.
                runner_ = false;
                spare_cv_.notify_all();
                return;
            }
            lock.unlock();
            if (stop_)
                cancel_pending(done);
            else
                poll_pending(true, done);
        } else {
            Entry e = std::move(queue_.front());
            queue_.pop_front();
            lock.unlock();
            {
                std::lock_guard wl(wm_);
                busy_ = true;
                current_ = e.name;
                started_ = Clock::now();
                ++seq_;
            }
            std::exception_ptr ep;
            MPI_Request req = MPI_REQUEST_NULL;
            e.work->profile_start();
            try {
                // The agreement round runs outside the core: mark it for the exit guard.
                std::optional<mpiml::detail::ExitMark> mark;
                if (e.collective && size_ > 1) mark.emplace(exit_kind(e.sig.v[0]), comm_, seq_);
                if (e.collective && check_.load(std::memory_order_relaxed) && size_ > 1) verify(e);
                req = e.run(*e.work);
            } catch (...) {
                ep = std::current_exception();
            }
            {
                std::lock_guard wl(wm_);
                busy_ = false;
            }
            if (ep || req == MPI_REQUEST_NULL) done.push_back(Done{std::move(e.work), ep});
            poll_pending(false, done);
        }
        runner = complete_all(done, lock);
    }
}

// Completes the Works in done (lock unlocked; returns it locked). Their
// futures' callbacks run here with the runner role given up. Returns whether
// this thread holds the role again; if a spare took it, this one is a spare.
bool ProcessGroupMpiml::complete_all(std::vector<Done>& done, std::unique_lock<std::mutex>& lock) {
    if (done.empty()) {
        lock.lock();
        return true;
    }
    lock.lock();
    runner_ = false;
    ++releases_;
    lock.unlock();
    const ProcessGroupMpiml* outer = t_completing;
    t_completing = this;
    for (auto& d : done) d.work->complete(d.ep);
    t_completing = outer;
    done.clear();
    lock.lock();
    if (runner_) {
        ++idle_spares_;
        return false;
    }
    runner_ = true;
    return true;
}

void ProcessGroupMpiml::watchdog_loop() {
    std::uint64_t stuck_release = UINT64_MAX;
    std::unique_lock lock(wm_);  // lock order: wm_, then m_
    while (!wstop_) {
        wcv_.wait_for(lock, std::chrono::milliseconds(100));
        if (wstop_) continue;
        {
            // The role given up for callbacks that have not returned for a
            // tick while work waits (say, a callback waits for an op issued
            // before it ran): a spare takes over.
            std::lock_guard ml(m_);
            const bool stuck = !runner_ && (!queue_.empty() || !pending_.empty());
            if (stuck && releases_ == stuck_release) hand_off_locked();
            stuck_release = stuck ? releases_ : UINT64_MAX;
        }
        if (timeout_s_ <= 0) continue;
        const auto now = Clock::now();
        std::string what;
        double waited = 0;
        if (busy_) {
            waited = std::chrono::duration<double>(now - started_).count();
            if (waited >= timeout_s_) what = current_;
        }
        if (what.empty() && npending_ > 0) {
            waited = std::chrono::duration<double>(now - oldest_pending_).count();
            if (waited >= timeout_s_) what = oldest_pending_name_;
        }
        if (what.empty()) continue;
        char head[200];
        std::snprintf(head, sizeof head, " waited %.1f s, past the timeout of %g s", waited,
                      timeout_s_);
        mpiml::abort_job("watchdog: mpiml c10d " + what + head + " (group " + group_id_ + ": " +
                         ranks_text_ + "; this is group rank " + std::to_string(rank_) +
                         "); a rank of the group did not arrive or failed");
    }
}

// In place: contig (contiguous) becomes op over the group's ranks.
void ProcessGroupMpiml::reduce_inplace(at::Tensor& contig, RedOp op, const std::string& call) {
    const TorchDtype& d = *torch_dtype(contig.scalar_type());  // check_tensor passed
    at::Tensor work = d.reduced_scalar == d.scalar ? contig : contig.to(d.reduced_scalar);
    // The profiler keeps the call's name past the call: a name that lives on.
    const char* c = mpiml::detail::profile_intern("mpiml c10d " + call);
    mpiml::detail::allreduce(MPI_IN_PLACE, work.data_ptr(), static_cast<std::size_t>(work.numel()),
                             d.reduced->type, d.reduced->cls, mpiml_op(op, d), comm_, c);
    if (op == RedOp::AVG) {
        if (d.reduced->cls == mpiml::TypeClass::integer)
            work.div_(size_, "trunc");
        else
            work.div_(size_);
    }
    if (!work.is_same(contig)) contig.copy_(work);
}

// ------------------------------------------------------------- operations

c10::intrusive_ptr<c10d::Work> ProcessGroupMpiml::broadcast(std::vector<at::Tensor>& tensors,
                                                            const c10d::BroadcastOptions& opts) {
    const std::string c = "broadcast";
    check_single(c, tensors);
    const int root = check_root(c, opts.rootRank);
    if (opts.rootTensor != 0) fail(c, "rootTensor must be 0 (one tensor per rank)");
    at::Tensor t = tensors[0];
    Sig sig{{static_cast<int64_t>(OpType::BROADCAST), t.numel(), dtype_id(t.scalar_type()), root}};
    return enqueue(c, OpType::BROADCAST, "mpiml:broadcast", tensors, tensors, sig,
                   [this, t, root](MpimlWork&) {
                       Contig b(t);
                       mpiml::detail::broadcast(b.data(), nbytes(b.buf), MPI_BYTE, root, comm_,
                                                "mpiml c10d broadcast");
                       if (rank_ != root) b.finish();
                       return MPI_REQUEST_NULL;
                   });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMpiml::allreduce(std::vector<at::Tensor>& tensors,
                                                            const c10d::AllreduceOptions& opts) {
    const std::string c = "all_reduce";
    check_single(c, tensors);
    const RedOp op = opts.reduceOp;
    at::Tensor t = tensors[0];
    check_op_dtype(c, op, t.scalar_type());
    Sig sig{{static_cast<int64_t>(OpType::ALLREDUCE), t.numel(), dtype_id(t.scalar_type()), op}};
    return enqueue(c, OpType::ALLREDUCE, "mpiml:all_reduce", tensors, tensors, sig,
                   [this, t, op, c](MpimlWork&) {
                       Contig b(t);
                       reduce_inplace(b.buf, op, c);
                       b.finish();
                       return MPI_REQUEST_NULL;
                   });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMpiml::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
    const std::string c = "all_reduce_coalesced";
    if (tensors.empty()) fail(c, "got no tensors");
    const RedOp op = opts.reduceOp;
    int64_t total = 0;
    for (const auto& t : tensors) {
        check_tensor(c, t);
        if (t.scalar_type() != tensors[0].scalar_type())
            fail(c, "all tensors must have the same dtype (got " + describe(tensors[0]) + " and " +
                        describe(t) + ")");
        total += t.numel();
    }
    check_op_dtype(c, op, tensors[0].scalar_type());
    Sig sig{{static_cast<int64_t>(OpType::ALLREDUCE_COALESCED), total,
             dtype_id(tensors[0].scalar_type()), op}};
    std::vector<at::Tensor> ts = tensors;
    return enqueue(c, OpType::ALLREDUCE_COALESCED, "mpiml:all_reduce", tensors, tensors, sig,
                   [this, ts, op, c](MpimlWork&) {
                       std::vector<at::Tensor> flat;
                       for (const auto& t : ts) flat.push_back(t.reshape({-1}));
                       at::Tensor buf = at::cat(flat);
                       reduce_inplace(buf, op, c);
                       int64_t off = 0;
                       for (const auto& t : ts) {
                           t.copy_(buf.narrow(0, off, t.numel()).view(t.sizes()));
                           off += t.numel();
                       }
                       return MPI_REQUEST_NULL;
                   });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMpiml::reduce(std::vector<at::Tensor>& tensors,
                                                         const c10d::ReduceOptions& opts) {
    const std::string c = "reduce";
    check_single(c, tensors);
    const int root = check_root(c, opts.rootRank);
    const RedOp op = opts.reduceOp;
    at::Tensor t = tensors[0];
    check_op_dtype(c, op, t.scalar_type());
    Sig sig{{static_cast<int64_t>(OpType::REDUCE), t.numel(), dtype_id(t.scalar_type()),
             op * 65536 + root}};
    return enqueue(c, OpType::REDUCE, "mpiml:reduce", tensors, tensors, sig,
                   [this, t, op, root, c](MpimlWork&) {
                       // An allreduce (fixed order, shared memory); only root keeps it.
                       at::Tensor buf = t.contiguous().clone();
                       reduce_inplace(buf, op, c);
                       if (rank_ == root) t.copy_(buf);
                       return MPI_REQUEST_NULL;
                   });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMpiml::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions&) {
    const std::string c = "all_gather";
    check_single(c, inputs);
    if (outputs.size() != 1) fail(c, "takes one output list per rank");
    at::Tensor in = inputs[0];
    auto outs = outputs[0];
    if (static_cast<int>(outs.size()) != size_)
        fail(c, "output list has " + std::to_string(outs.size()) + " tensors; the group has " +
                    std::to_string(size_) + " ranks");
    for (const auto& o : outs) check_same(c, in, o, "an output tensor");
    Sig sig{{static_cast<int64_t>(OpType::ALLGATHER), in.numel(), dtype_id(in.scalar_type()), -1}};
    return enqueue(c, OpType::ALLGATHER, "mpiml:all_gather", inputs, outs, sig,
                   [this, in, outs](MpimlWork&) {
                       at::Tensor src = in.contiguous();
                       at::Tensor all = at::empty({size_, in.numel()}, in.options());
                       mpiml::detail::allgather(src.data_ptr(), all.data_ptr(), nbytes(src),
                                                MPI_BYTE, comm_, "mpiml c10d all_gather");
                       for (int r = 0; r < size_; ++r) outs[r].copy_(all[r].view(outs[r].sizes()));
                       return MPI_REQUEST_NULL;
                   });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMpiml::_allgather_base(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions&) {
    const std::string c = "all_gather_into_tensor";
    check_tensor(c, input);
    check_tensor(c, output);
    if (output.scalar_type() != input.scalar_type() || output.numel() != input.numel() * size_)
        fail(c, "output " + describe(output) + " must hold " + std::to_string(size_) +
                    " times the input " + describe(input));
    Sig sig{{static_cast<int64_t>(OpType::_ALLGATHER_BASE), input.numel(),
             dtype_id(input.scalar_type()), -1}};
    at::Tensor in = input, out = output;
    return enqueue(c, OpType::_ALLGATHER_BASE, "mpiml:all_gather_into_tensor", {input}, {output},
                   sig,
                   [this, in, out](MpimlWork&) {
                       at::Tensor src = in.contiguous();
                       Contig dst(out);
                       mpiml::detail::allgather(src.data_ptr(), dst.data(), nbytes(src), MPI_BYTE,
                                                comm_, "mpiml c10d all_gather_into_tensor");
                       dst.finish();
                       return MPI_REQUEST_NULL;
                   });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMpiml::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions&) {
    const std::string c = "all_gather_coalesced";
    if (static_cast<int>(outputs.size()) != size_)
        fail(c, "needs one output list per rank (" + std::to_string(size_) + "), got " +
                    std::to_string(outputs.size()));
    int64_t bytes = 0;
    for (const auto& t : inputs) {
        check_tensor(c, t);
        bytes += t.nbytes();
    }
    for (const auto& list : outputs) {
        if (list.size() != inputs.size())
            fail(c, "every output list must have as many tensors as the input list");
        for (std::size_t i = 0; i < list.size(); ++i) check_same(c, inputs[i], list[i], "an output tensor");
    }
    Sig sig{{static_cast<int64_t>(OpType::ALLGATHER_COALESCED), bytes, -1, -1}};
    std::vector<at::Tensor> flat_out;
    for (const auto& l : outputs) flat_out.insert(flat_out.end(), l.begin(), l.end());
    auto ins = inputs;
    auto outs = outputs;
    return enqueue(c, OpType::ALLGATHER_COALESCED, "mpiml:all_gather", inputs, flat_out, sig,
                   [this, ins, outs, bytes](MpimlWork&) {
                       std::vector<at::Tensor> parts;
                       for (const auto& t : ins)
                           parts.push_back(t.contiguous().view({-1}).view(at::kByte));
                       at::Tensor send = parts.empty() ? at::empty({0}, at::kByte) : at::cat(parts);
                       at::Tensor all = at::empty({size_, bytes}, at::kByte);
                       mpiml::detail::allgather(send.data_ptr(), all.data_ptr(),
                                                static_cast<std::size_t>(bytes), MPI_BYTE, comm_,
                                                "mpiml c10d all_gather_coalesced");
                       for (int r = 0; r < size_; ++r) {
                           int64_t off = 0;
                           for (const auto& o : outs[r]) {
                               const int64_t n = o.nbytes();
                               o.copy_(all[r].narrow(0, off, n).view(o.scalar_type()).view(o.sizes()));
                               off += n;
                           }
                       }
                       return MPI_REQUEST_NULL;
                   });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMpiml::gather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::GatherOptions& opts) {
    const std::string c = "gather";
    check_single(c, inputs);
    const int root = check_root(c, opts.rootRank);
    at::Tensor in = inputs[0];
    std::vector<at::Tensor> outs;
    if (rank_ == root) {
        if (outputs.size() != 1 || static_cast<int>(outputs[0].size()) != size_)
            fail(c, "root needs one output list of " + std::to_string(size_) + " tensors");
        outs = outputs[0];
        for (const auto& o : outs) check_same(c, in, o, "an output tensor");
    } else if (!outputs.empty() && !(outputs.size() == 1 && outputs[0].empty())) {
        fail(c, "only the root rank " + std::to_string(root) + " takes an output list");
    }
    Sig sig{{static_cast<int64_t>(OpType::GATHER), in.numel(), dtype_id(in.scalar_type()), root}};
    return enqueue(c, OpType::GATHER, "mpiml:gather", inputs, outs, sig,
                   [this, in, outs, root](MpimlWork&) {
                       at::Tensor src = in.contiguous();
                       const int n = int_count("gather", nbytes(src));
                       at::Tensor all;
                       if (rank_ == root) all = at::empty({size_, in.numel()}, in.options());
                       check(MPI_Gather(src.data_ptr(), n, MPI_BYTE,
                                        rank_ == root ? all.data_ptr() : nullptr, n, MPI_BYTE, root,
                                        comm_),
                             "gather (MPI_Gather)");
                       if (rank_ == root)
                           for (int r = 0; r < size_; ++r) outs[r].copy_(all[r].view(outs[r].sizes()));
                       return MPI_REQUEST_NULL;
                   });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMpiml::scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ScatterOptions& opts) {
    const std::string c = "scatter";
    check_single(c, outputs);
    const int root = check_root(c, opts.rootRank);
    at::Tensor out = outputs[0];
    std::vector<at::Tensor> ins;
    if (rank_ == root) {
        if (inputs.size() != 1 || static_cast<int>(inputs[0].size()) != size_)
            fail(c, "root needs one input list of " + std::to_string(size_) + " tensors");
        ins = inputs[0];
        for (const auto& i : ins) check_same(c, out, i, "an input tensor");
    } else if (!inputs.empty() && !(inputs.size() == 1 && inputs[0].empty())) {
        fail(c, "only the root rank " + std::to_string(root) + " takes an input list");
    }
    Sig sig{{static_cast<int64_t>(OpType::SCATTER), out.numel(), dtype_id(out.scalar_type()), root}};
    return enqueue(c, OpType::SCATTER, "mpiml:scatter", ins, outputs, sig,
                   [this, ins, out, root](MpimlWork&) {
                       Contig dst(out);
                       const int n = int_count("scatter", nbytes(dst.buf));
                       at::Tensor all;
                       if (rank_ == root) {
                           std::vector<at::Tensor> flat;
                           for (const auto& i : ins) flat.push_back(i.reshape({-1}));
                           all = at::cat(flat);
                       }
                       check(MPI_Scatter(rank_ == root ? all.data_ptr() : nullptr, n, MPI_BYTE,
                                         dst.data(), n, MPI_BYTE, root, comm_),
                             "scatter (MPI_Scatter)");
                       dst.finish();
                       return MPI_REQUEST_NULL;
                   });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMpiml::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
    const std::string c = "reduce_scatter";
    check_single(c, outputs);
    at::Tensor out = outputs[0];
    if (inputs.size() != 1 || static_cast<int>(inputs[0].size()) != size_)
        fail(c, "needs one input list of " + std::to_string(size_) + " tensors");
    auto ins = inputs[0];
    for (const auto& i : ins) check_same(c, out, i, "an input tensor");
    const RedOp op = opts.reduceOp;
    check_op_dtype(c, op, out.scalar_type());
    Sig sig{{static_cast<int64_t>(OpType::REDUCE_SCATTER), out.numel(), dtype_id(out.scalar_type()), op}};
    return enqueue(c, OpType::REDUCE_SCATTER, "mpiml:reduce_scatter", ins, outputs, sig,
                   [this, ins, out, op, c](MpimlWork&) {
                       // One allreduce of everything (fixed order); each rank keeps its part.
                       std::vector<at::Tensor> flat;
                       for (const auto& i : ins) flat.push_back(i.reshape({-1}));
                       at::Tensor all = at::cat(flat);
                       reduce_inplace(all, op, c);
                       out.copy_(all.narrow(0, rank_ * out.numel(), out.numel()).view(out.sizes()));
                       return MPI_REQUEST_NULL;
                   });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMpiml::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
    const std::string c = "reduce_scatter_tensor";
    check_tensor(c, input);
    check_tensor(c, output);
    if (output.scalar_type() != input.scalar_type() || input.numel() != output.numel() * size_)
        fail(c, "input " + describe(input) + " must hold " + std::to_string(size_) +
                    " times the output " + describe(output));
    const RedOp op = opts.reduceOp;
    check_op_dtype(c, op, output.scalar_type());
    Sig sig{{static_cast<int64_t>(OpType::_REDUCE_SCATTER_BASE), output.numel(),
             dtype_id(output.scalar_type()), op}};
    at::Tensor in = input, out = output;
    return enqueue(c, OpType::_REDUCE_SCATTER_BASE, "mpiml:reduce_scatter_tensor", {input},
                   {output}, sig,
                   [this, in, out, op, c](MpimlWork&) {
                       at::Tensor all = in.contiguous().clone().view({-1});
                       reduce_inplace(all, op, c);
                       out.copy_(all.narrow(0, rank_ * out.numel(), out.numel()).view(out.sizes()));
                       return MPI_REQUEST_NULL;
                   });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMpiml::alltoall_base(
    at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_splits,
    std::vector<int64_t>& input_splits, const c10d::AllToAllOptions&) {
    const std::string c = "all_to_all_single";
    check_tensor(c, input);
    check_tensor(c, output);
    if (output.scalar_type() != input.scalar_type())
        fail(c, "input " + describe(input) + " and output " + describe(output) + " differ in dtype");
    auto splits = [&](const at::Tensor& t, const std::vector<int64_t>& s, const char* what) {
        std::vector<int64_t> rows;
        const int64_t n = t.dim() == 0 ? 1 : t.size(0);
        if (s.empty()) {
            if (n % size_ != 0)
                fail(c, std::string(what) + " " + describe(t) + ": dim 0 is not divisible by " +
                            std::to_string(size_) + " ranks (give split sizes)");
            rows.assign(size_, n / size_);
        } else {
            if (static_cast<int>(s.size()) != size_)
                fail(c, std::string(what) + " split sizes have " + std::to_string(s.size()) +
                            " entries; the group has " + std::to_string(size_) + " ranks");
            int64_t sum = 0;
            for (auto v : s) {
                if (v < 0) fail(c, std::string(what) + " split sizes must not be negative");
                sum += v;
            }
            if (sum != n)
                fail(c, std::string(what) + " split sizes sum to " + std::to_string(sum) +
                            " but dim 0 of " + describe(t) + " is " + std::to_string(n));
            rows = s;
        }
        return rows;
    };
    const auto in_rows = splits(input, input_splits, "input");
    const auto out_rows = splits(output, output_splits, "output");
    const int64_t in_row_bytes = input.dim() == 0 || input.size(0) == 0 ? 0 : input.nbytes() / input.size(0);
    const int64_t out_row_bytes = output.dim() == 0 || output.size(0) == 0 ? 0 : output.nbytes() / output.size(0);
    Sig sig{{static_cast<int64_t>(OpType::ALLTOALL_BASE), -1, dtype_id(input.scalar_type()), -1}};
    at::Tensor in = input, out = output;
    return enqueue(c, OpType::ALLTOALL_BASE, "mpiml:all_to_all", {input}, {output}, sig,
                   [this, in, out, in_rows, out_rows, in_row_bytes, out_row_bytes, c](MpimlWork&) {
                       std::vector<int> sc(size_), sd(size_), rc(size_), rd(size_);
                       std::size_t so = 0, ro = 0;
                       for (int r = 0; r < size_; ++r) {
                           const std::size_t sb = static_cast<std::size_t>(in_rows[r] * in_row_bytes);
                           const std::size_t rb = static_cast<std::size_t>(out_rows[r] * out_row_bytes);
                           sc[r] = int_count(c, sb);
                           sd[r] = int_count(c, so);
                           rc[r] = int_count(c, rb);
                           rd[r] = int_count(c, ro);
                           so += sb;
                           ro += rb;
                       }
                       at::Tensor src = in.contiguous();
                       Contig dst(out);
                       check(MPI_Alltoallv(src.data_ptr(), sc.data(), sd.data(), MPI_BYTE, dst.data(),
                                           rc.data(), rd.data(), MPI_BYTE, comm_),
                             c + " (MPI_Alltoallv)");
                       dst.finish();
                       return MPI_REQUEST_NULL;
                   });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMpiml::alltoall(std::vector<at::Tensor>& outputs,
                                                           std::vector<at::Tensor>& inputs,
                                                           const c10d::AllToAllOptions&) {
    const std::string c = "all_to_all";
    if (static_cast<int>(inputs.size()) != size_ || static_cast<int>(outputs.size()) != size_)
        fail(c, "needs " + std::to_string(size_) + " input and output tensors, got " +
                    std::to_string(inputs.size()) + " and " + std::to_string(outputs.size()));
    for (const auto& t : inputs) check_tensor(c, t);
    for (const auto& t : outputs) {
        check_tensor(c, t);
        if (t.scalar_type() != inputs[0].scalar_type())
            fail(c, "input and output tensors differ in dtype");
    }
    for (const auto& t : inputs)
        if (t.scalar_type() != inputs[0].scalar_type()) fail(c, "input tensors differ in dtype");
    Sig sig{{static_cast<int64_t>(OpType::ALLTOALL), -1, dtype_id(inputs[0].scalar_type()), -1}};
    auto ins = inputs;
    auto outs = outputs;
    return enqueue(c, OpType::ALLTOALL, "mpiml:all_to_all", inputs, outputs, sig,
                   [this, ins, outs, c](MpimlWork&) {
                       std::vector<int> sc(size_), sd(size_), rc(size_), rd(size_);
                       std::size_t so = 0, ro = 0;
                       std::vector<at::Tensor> parts;
                       for (int r = 0; r < size_; ++r) {
                           sc[r] = int_count(c, nbytes(ins[r]));
                           sd[r] = int_count(c, so);
                           rc[r] = int_count(c, nbytes(outs[r]));
                           rd[r] = int_count(c, ro);
                           so += nbytes(ins[r]);
                           ro += nbytes(outs[r]);
                           parts.push_back(ins[r].contiguous().view({-1}).view(at::kByte));
                       }
                       at::Tensor send = at::cat(parts);
                       at::Tensor recv = at::empty({static_cast<int64_t>(ro)}, at::kByte);
                       check(MPI_Alltoallv(send.data_ptr(), sc.data(), sd.data(), MPI_BYTE,
                                           recv.data_ptr(), rc.data(), rd.data(), MPI_BYTE, comm_),
                             c + " (MPI_Alltoallv)");
                       for (int r = 0; r < size_; ++r)
                           outs[r].copy_(recv.narrow(0, rd[r], rc[r])
                                             .view(outs[r].scalar_type())
                                             .view(outs[r].sizes()));
                       return MPI_REQUEST_NULL;
                   });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMpiml::p2p(std::vector<at::Tensor>& tensors, int peer,
                                                      int tag, bool is_send, bool any_source) {
    const std::string c = is_send ? "send" : "recv";
    check_single(c, tensors);
    if (!any_source && (peer < 0 || peer >= size_))
        fail(c, "peer rank " + std::to_string(peer) + " is outside the group of " +
                    std::to_string(size_) + " ranks");
    if (!any_source && peer == rank_) fail(c, "a rank cannot " + c + " to/from itself");
    int* ub = nullptr;
    int flag = 0;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
    const int max_tag = flag && ub ? *ub : 32767;
    if (tag < 0 || tag > max_tag)
        fail(c, "tag " + std::to_string(tag) + " is outside 0.." + std::to_string(max_tag));
    at::Tensor t = tensors[0];
    const std::string name = c + (any_source ? " from any rank" : (is_send ? " to rank " : " from rank ") +
                                                                     std::to_string(peer)) +
                             " (tag " + std::to_string(tag) + ", " + describe(t) + ")";
    const OpType type = is_send ? OpType::SEND : any_source ? OpType::RECVANYSOURCE : OpType::RECV;
    return enqueue(
        name, type, is_send ? "mpiml:send" : any_source ? "mpiml:recvAnySource" : "mpiml:recv",
        tensors, tensors, Sig{},
        [this, t, peer, tag, is_send, any_source, name](MpimlWork& w) {
            auto b = std::make_shared<Contig>(t);
            const int n = int_count(name, nbytes(b->buf));
            MPI_Request req = MPI_REQUEST_NULL;
            if (is_send)
                check(MPI_Isend(b->data(), n, MPI_BYTE, peer, tag, comm_, &req), name + " (MPI_Isend)");
            else
                check(MPI_Irecv(b->data(), n, MPI_BYTE, any_source ? MPI_ANY_SOURCE : peer, tag, comm_,
                                &req),
                      name + " (MPI_Irecv)");
            std::function<void()> done;
            if (!is_send) done = [b] { b->finish(); };
            else done = [b] {};  // keeps a contiguous copy alive until sent
            pending_.push_back(Pending{req, c10::intrusive_ptr<MpimlWork>::reclaim_copy(&w),
                                       std::move(done), name, Clock::now(), any_source});
            return req;
        },
        /*collective=*/false);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMpiml::send(std::vector<at::Tensor>& tensors, int dst,
                                                       int tag) {
    return p2p(tensors, dst, tag, true, false);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMpiml::recv(std::vector<at::Tensor>& tensors, int src,
                                                       int tag) {
    return p2p(tensors, src, tag, false, false);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMpiml::recvAnysource(std::vector<at::Tensor>& tensors,
                                                                int tag) {
    return p2p(tensors, -1, tag, false, true);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMpiml::barrier(const c10d::BarrierOptions&) {
    Sig sig{{static_cast<int64_t>(OpType::BARRIER), 0, -1, -1}};
    return enqueue("barrier", OpType::BARRIER, "mpiml:barrier", {}, {}, sig, [this](MpimlWork&) {
        mpiml::detail::barrier(comm_, "mpiml c10d barrier");
        return MPI_REQUEST_NULL;
    });
}

}  // namespace
}  // namespace mpiml_c10d

PYBIND11_MODULE(_c10d, m) {
    using mpiml_c10d::ProcessGroupMpiml;
    m.doc() = "mpiml's torch.distributed backend (import mpiml.torch to register it)";
    py::module_::import("torch.distributed");
    py::class_<ProcessGroupMpiml, c10d::ProcessGroup, c10::intrusive_ptr<ProcessGroupMpiml>>(
        m, "ProcessGroupMpiml")
        .def(py::init([](int rank, int size, double timeout_s, std::vector<int64_t> global_ranks,
                         std::string group_id) {
                 return c10::make_intrusive<ProcessGroupMpiml>(rank, size, timeout_s,
                                                               std::move(global_ranks),
                                                               std::move(group_id));
             }),
             py::arg("rank"), py::arg("size"), py::arg("timeout"), py::arg("global_ranks"),
             py::arg("group_id"), py::call_guard<py::gil_scoped_release>())
        .def_property_readonly("timeout", &ProcessGroupMpiml::timeout_seconds,
                               "deadline of every operation, seconds (0: none)")
        .def_property("check", &ProcessGroupMpiml::check_enabled, &ProcessGroupMpiml::set_check,
                      "cross-rank agreement check before each collective")
        .def("shutdown", &ProcessGroupMpiml::shutdown, py::call_guard<py::gil_scoped_release>(),
             "finishes queued operations and stops the worker thread");
    m.def("at_exit", [] { mpiml_c10d::at_exit(); }, py::call_guard<py::gil_scoped_release>());
    m.def("set_check_default", [](bool on) { mpiml_c10d::g_check_default.store(on); });
    m.def("mpi_initialized", [] { return mpiml::is_initialized(); });
    m.def("ensure_mpi", [] { mpiml_c10d::ensure_mpi(); }, "initializes MPI (MPI_THREAD_MULTIPLE) if needed");
    m.def("world_rank", [] { return mpiml::proc_id(MPI_COMM_WORLD); });
    m.def("world_size", [] { return mpiml::num_procs(MPI_COMM_WORLD); });
    m.def("broadcast_string", [](std::string s, int root) {
        py::gil_scoped_release nogil;
        mpiml::broadcast(s, root, MPI_COMM_WORLD);
        return s;
    });
    m.def("processor_name", [] {
        char name[MPI_MAX_PROCESSOR_NAME] = {};
        int len = 0;
        MPI_Get_processor_name(name, &len);
        return std::string(name, len);
    });
    m.def("abort", [](const std::string& what) { mpiml::abort_job(what, 1); },
          "prints what and aborts the whole MPI job");
}
