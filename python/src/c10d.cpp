// mpiml._c10d: the torch.distributed backend "mpiml" (c10d.hpp), a
// c10d::ProcessGroup on mpiml's core: allreduce, broadcast, allgather and
// barrier run the core's collectives (shared-memory path, fixed reduction
// order), the rest plain MPI (gather, scatter, alltoall, send/recv). Each
// operation is checked here, then runs as a lambda on the group's worker
// queue inside the core's scope for it: one agreement round, the core's
// watchdog, the exit guard.
#include "c10d.hpp"

#include <mpiml/collectives.hpp>
#include <mpiml/error.hpp>
#include <mpiml/failure.hpp>
#include <mpiml/profile.hpp>
#include <mpiml/session.hpp>

#include "core/backend.hpp"   // src/: quiet waits
#include "core/op.hpp"        // src/: the registry of ops
#include "torch/dtypes.hpp"   // the LibTorch dtype table

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/csrc/utils/pybind.h>

#include <ATen/ThreadLocalState.h>
#include <ATen/record_function.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

namespace py = pybind11;

namespace mpiml_c10d {
namespace {

using Clock = std::chrono::steady_clock;
// Allreduces from this size on wait quietly (DDP's default 25 MiB buckets
// do). Across two hosts on a fast link, quiet waits were slower than MPI's
// at 1 MiB in the best calls, faster from 8 MiB on (median and best).
constexpr std::size_t kQuietBytes = std::size_t{8} << 20;
using c10d::OpType;
using RedOp = c10d::ReduceOp::RedOpType;

[[noreturn]] void fail(const std::string& call, const std::string& what) {
    mpiml::detail::fail(("mpiml c10d " + call).c_str(), what);
}

// Runs f on a worker as the caller's data: copies into the user's tensors are
// not autograd's (a Parameter is a leaf that requires grad, and grad mode is
// per thread: torch.no_grad() around the call does not reach the worker).
// LibTorch's errors name the call and the rank.
template <class F>
void run_untracked(const std::string& call, F&& f) {
    try {
        c10::AutoGradMode grad_off(false);
        f();
    } catch (const c10::Error& e) {
        fail(call, e.what_without_backtrace());
    }
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


// --------------------------------------------------------------- the group

std::atomic<bool> g_check_default{true};
std::atomic<bool> g_exiting{false};

// The exit guard's kind of a c10d operation (mpiml::detail::DoorCall).
int exit_kind(OpType op) {
    switch (op) {
        case OpType::ALLREDUCE:
        case OpType::ALLREDUCE_COALESCED: return 1;
        case OpType::BROADCAST: return 2;
        case OpType::ALLGATHER:
        case OpType::_ALLGATHER_BASE:
        case OpType::ALLGATHER_COALESCED: return 3;
        case OpType::BARRIER: return 4;
        default: return 5;
    }
}

// One rank's signature (ProcessGroupMpiml::Sig) in a mismatch message.
std::string describe_sig(const std::int64_t* s) {
    const auto type = static_cast<OpType>(s[0]);
    std::string t = c10d::opTypeToString(type) + "(";
    if (s[1] >= 0) t += "count=" + std::to_string(s[1]) + ", ";
    if (s[2] >= 0) t += "dtype=" + std::string(c10::toString(static_cast<at::ScalarType>(s[2]))) + ", ";
    if (s[3] >= 0) {
        switch (type) {
            case OpType::BROADCAST: case OpType::GATHER: case OpType::SCATTER:
                t += "root=" + std::to_string(s[3]);
                break;
            case OpType::REDUCE:
                t += std::string("op=") + op_name(static_cast<RedOp>(s[3] / 65536)) +
                     ", root=" + std::to_string(s[3] % 65536);
                break;
            default:
                t += std::string("op=") + op_name(static_cast<RedOp>(s[3]));
        }
    }
    if (t.ends_with(", ")) t.resize(t.size() - 2);
    return t + ")";
}

// Live groups, so that exit can drain their workers before MPI_Finalize.
std::mutex g_groups_mutex;
std::vector<ProcessGroupMpiml*> g_groups;

}  // namespace

// -------------------------------------------------------------------- work

MpimlWork::MpimlWork(OpType type, std::vector<at::Tensor> outputs, const char* title,
                     const std::vector<at::Tensor>& inputs)
    : c10d::Work(-1, type),
      outputs_(std::move(outputs)),
      future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {
    if (title) record_profile(title, inputs);
}

bool MpimlWork::wait(std::chrono::milliseconds timeout) {
    if (timeout == ::kNoTimeout)
        if (auto q = queue_.lock()) q->run_here(this);
    return c10d::Work::wait(timeout);
}

void MpimlWork::profile_start() {
    if (profile_start_) {
        profile_start_();
        profile_start_ = nullptr;
    }
}

void MpimlWork::complete(std::exception_ptr e) {
    // The profiler event ends before anyone can see the op done (DDP waits on
    // the future): a profiler stopped right after still has it.
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

// As ProcessGroupGloo's AsyncWork: only when a profiler (or another
// RecordFunction callback) is on in the issuing thread, whose thread-local
// state the runner takes on around the event's start and end.
void MpimlWork::record_profile(const char* title, const std::vector<at::Tensor>& inputs) {
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

// --------------------------------------------------------------- the group

void set_check_default(bool on) { g_check_default.store(on); }

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
    std::string ranks_text;
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
        ranks_text = "all " + std::to_string(size) + " ranks";
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
            ranks_text += (ranks_text.empty() ? "ranks " : ",") + std::to_string(r);
        }
        if (rank < 0 || rank >= size || ranks[rank] != wrank)
            fail("init", "this process is MPI rank " + std::to_string(wrank) +
                             " but torch.distributed placed it at group rank " +
                             std::to_string(rank) + " of " + ranks_text +
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
    where_ = " (group " + group_id_ + ": " + ranks_text + "; this is group rank " +
             std::to_string(rank_) + "); a rank of the group did not arrive or failed";

    queue_ = std::make_shared<WorkerQueue>("mpiml c10d ");
    std::lock_guard lock(g_groups_mutex);
    g_groups.push_back(this);
}

ProcessGroupMpiml::~ProcessGroupMpiml() {
    shutdown();
    std::lock_guard lock(g_groups_mutex);
    std::erase(g_groups, this);
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
    if (!queue_) return;
    queue_->shutdown();
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

c10::intrusive_ptr<c10d::Work> ProcessGroupMpiml::collective(
    const std::string& name, OpType type, const char* title, const std::vector<at::Tensor>& inputs,
    std::vector<at::Tensor> outputs, Sig sig, std::function<void()> body) {
    auto work = c10::make_intrusive<MpimlWork>(type, std::move(outputs), title, inputs);
    // The profiler keeps the call's name past the call: a name that lives on.
    const char* call = mpiml::detail::profile_intern("mpiml c10d " + name);
    // Read when issued, in program order: every rank checks the same operations
    // even if the setting changes while earlier ones are still queued.
    const bool check = size_ > 1 && check_.load(std::memory_order_relaxed);
    work->set_queue(queue_);
    queue_->push(WorkerQueue::Op{
        name,
        [this, work, call, name, type, sig, check, body = std::move(body)] {
            work->profile_start();
            mpiml::detail::DoorScope scope({exit_kind(type), call, comm_, sig.data(),
                                            static_cast<int>(sig.size()), describe_sig,
                                            check, timeout_s_, where_});
            run_untracked(name, body);
            return WorkerQueue::Posted{};
        },
        [work](std::exception_ptr e) { work->complete(e); },
        work.get()});
    return work;
}

// In place: contig (contiguous) becomes op over the group's ranks.
void ProcessGroupMpiml::reduce_inplace(at::Tensor& contig, RedOp op, const std::string& call) {
    const TorchDtype& d = *torch_dtype(contig.scalar_type());  // check_tensor passed
    at::Tensor work = d.reduced_scalar == d.scalar ? contig : contig.to(d.reduced_scalar);
    // The profiler keeps the call's name past the call: a name that lives on.
    const char* c = mpiml::detail::profile_intern("mpiml c10d " + call);
    // A large one waits quietly and, where it goes through MPI, is summed by
    // mpiml's own allreduce (as GradAverager's communication thread): this
    // worker is a thread of its own, and MPI's polling waits would take a
    // core from backward() while DDP's buckets cross the network.
    struct QuietWaits {
        const bool on;
        explicit QuietWaits(bool q) : on(q) { if (on) mpiml::detail::set_quiet_waits(true); }
        ~QuietWaits() { if (on) mpiml::detail::set_quiet_waits(false); }
        QuietWaits(const QuietWaits&) = delete;
        QuietWaits& operator=(const QuietWaits&) = delete;
    } quiet(work.nbytes() >= kQuietBytes);
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
    const Sig sig{{static_cast<int64_t>(OpType::BROADCAST), t.numel(), dtype_id(t.scalar_type()), root}};
    return collective(c, OpType::BROADCAST, "mpiml:broadcast", tensors, tensors, sig,
                   [this, t, root] {
                       Contig b(t);
                       mpiml::detail::broadcast(b.data(), nbytes(b.buf), MPI_BYTE, root, comm_,
                                                "mpiml c10d broadcast");
                       if (rank_ != root) b.finish();
                   });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMpiml::allreduce(std::vector<at::Tensor>& tensors,
                                                            const c10d::AllreduceOptions& opts) {
    const std::string c = "all_reduce";
    check_single(c, tensors);
    const RedOp op = opts.reduceOp;
    at::Tensor t = tensors[0];
    check_op_dtype(c, op, t.scalar_type());
    const Sig sig{{static_cast<int64_t>(OpType::ALLREDUCE), t.numel(), dtype_id(t.scalar_type()), op}};
    return collective(c, OpType::ALLREDUCE, "mpiml:all_reduce", tensors, tensors, sig,
                   [this, t, op, c] {
                       Contig b(t);
                       reduce_inplace(b.buf, op, c);
                       b.finish();
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
    const Sig sig{{static_cast<int64_t>(OpType::ALLREDUCE_COALESCED), total,
             dtype_id(tensors[0].scalar_type()), op}};
    std::vector<at::Tensor> ts = tensors;
    return collective(c, OpType::ALLREDUCE_COALESCED, "mpiml:all_reduce", tensors, tensors, sig,
                   [this, ts, op, c] {
                       std::vector<at::Tensor> flat;
                       for (const auto& t : ts) flat.push_back(t.reshape({-1}));
                       at::Tensor buf = at::cat(flat);
                       reduce_inplace(buf, op, c);
                       int64_t off = 0;
                       for (const auto& t : ts) {
                           t.copy_(buf.narrow(0, off, t.numel()).view(t.sizes()));
                           off += t.numel();
                       }
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
    const Sig sig{{static_cast<int64_t>(OpType::REDUCE), t.numel(), dtype_id(t.scalar_type()),
             op * 65536 + root}};
    return collective(c, OpType::REDUCE, "mpiml:reduce", tensors, tensors, sig,
                   [this, t, op, root, c] {
                       // An allreduce (fixed order, shared memory); only root keeps it.
                       at::Tensor buf = t.contiguous().clone();
                       reduce_inplace(buf, op, c);
                       if (rank_ == root) t.copy_(buf);
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
    const Sig sig{{static_cast<int64_t>(OpType::ALLGATHER), in.numel(), dtype_id(in.scalar_type()), -1}};
    return collective(c, OpType::ALLGATHER, "mpiml:all_gather", inputs, outs, sig,
                   [this, in, outs] {
                       at::Tensor src = in.contiguous();
                       at::Tensor all = at::empty({size_, in.numel()}, in.options());
                       mpiml::detail::allgather(src.data_ptr(), all.data_ptr(), nbytes(src),
                                                MPI_BYTE, comm_, "mpiml c10d all_gather");
                       for (int r = 0; r < size_; ++r) outs[r].copy_(all[r].view(outs[r].sizes()));
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
    const Sig sig{{static_cast<int64_t>(OpType::_ALLGATHER_BASE), input.numel(),
             dtype_id(input.scalar_type()), -1}};
    at::Tensor in = input, out = output;
    return collective(c, OpType::_ALLGATHER_BASE, "mpiml:all_gather_into_tensor", {input}, {output},
                   sig,
                   [this, in, out] {
                       at::Tensor src = in.contiguous();
                       Contig dst(out);
                       mpiml::detail::allgather(src.data_ptr(), dst.data(), nbytes(src), MPI_BYTE,
                                                comm_, "mpiml c10d all_gather_into_tensor");
                       dst.finish();
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
    const Sig sig{{static_cast<int64_t>(OpType::ALLGATHER_COALESCED), bytes, -1, -1}};
    std::vector<at::Tensor> flat_out;
    for (const auto& l : outputs) flat_out.insert(flat_out.end(), l.begin(), l.end());
    auto ins = inputs;
    auto outs = outputs;
    return collective(c, OpType::ALLGATHER_COALESCED, "mpiml:all_gather", inputs, flat_out, sig,
                   [this, ins, outs, bytes] {
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
    const Sig sig{{static_cast<int64_t>(OpType::GATHER), in.numel(), dtype_id(in.scalar_type()), root}};
    return collective(c, OpType::GATHER, "mpiml:gather", inputs, outs, sig,
                   [this, in, outs, root] {
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
    const Sig sig{{static_cast<int64_t>(OpType::SCATTER), out.numel(), dtype_id(out.scalar_type()), root}};
    return collective(c, OpType::SCATTER, "mpiml:scatter", ins, outputs, sig,
                   [this, ins, out, root] {
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
    const Sig sig{{static_cast<int64_t>(OpType::REDUCE_SCATTER), out.numel(), dtype_id(out.scalar_type()), op}};
    return collective(c, OpType::REDUCE_SCATTER, "mpiml:reduce_scatter", ins, outputs, sig,
                   [this, ins, out, op, c] {
                       // One allreduce of everything (fixed order); each rank keeps its part.
                       std::vector<at::Tensor> flat;
                       for (const auto& i : ins) flat.push_back(i.reshape({-1}));
                       at::Tensor all = at::cat(flat);
                       reduce_inplace(all, op, c);
                       out.copy_(all.narrow(0, rank_ * out.numel(), out.numel()).view(out.sizes()));
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
    const Sig sig{{static_cast<int64_t>(OpType::_REDUCE_SCATTER_BASE), output.numel(),
             dtype_id(output.scalar_type()), op}};
    at::Tensor in = input, out = output;
    return collective(c, OpType::_REDUCE_SCATTER_BASE, "mpiml:reduce_scatter_tensor", {input},
                   {output}, sig,
                   [this, in, out, op, c] {
                       at::Tensor all = in.contiguous().clone().view({-1});
                       reduce_inplace(all, op, c);
                       out.copy_(all.narrow(0, rank_ * out.numel(), out.numel()).view(out.sizes()));
                   });
}

// With the group's check: what each rank sends to each other rank is what that
// rank expects from it, or every rank throws naming the first pair that
// differs (the agreement round compares only what all ranks pass alike).
void ProcessGroupMpiml::check_alltoall(const std::string& c, const std::vector<int>& send,
                                       const std::vector<int>& recv) {
    std::vector<int> sent(size_);
    check(MPI_Alltoall(send.data(), 1, MPI_INT, sent.data(), 1, MPI_INT, comm_), c + " (size check)");
    int mine[3] = {-1, 0, 0};  // the first rank whose bytes differ, they send, expected
    for (int r = 0; r < size_ && mine[0] < 0; ++r)
        if (sent[r] != recv[r]) mine[0] = r, mine[1] = sent[r], mine[2] = recv[r];
    std::vector<int> all(3 * static_cast<std::size_t>(size_));
    check(MPI_Allgather(mine, 3, MPI_INT, all.data(), 3, MPI_INT, comm_), c + " (size check)");
    for (int r = 0; r < size_; ++r)
        if (all[3 * r] >= 0)
            fail(c, "mismatched sizes: rank " + std::to_string(r) + " expects " +
                        std::to_string(all[3 * r + 2]) + " bytes from rank " + std::to_string(all[3 * r]) +
                        ", which sends it " + std::to_string(all[3 * r + 1]));
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
    const Sig sig{{static_cast<int64_t>(OpType::ALLTOALL_BASE), -1, dtype_id(input.scalar_type()), -1}};
    at::Tensor in = input, out = output;
    const bool checked = size_ > 1 && check_.load(std::memory_order_relaxed);
    return collective(c, OpType::ALLTOALL_BASE, "mpiml:all_to_all", {input}, {output}, sig,
                   [this, in, out, in_rows, out_rows, in_row_bytes, out_row_bytes, c, checked] {
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
                       if (checked) check_alltoall(c, sc, rc);
                       at::Tensor src = in.contiguous();
                       Contig dst(out);
                       check(MPI_Alltoallv(src.data_ptr(), sc.data(), sd.data(), MPI_BYTE, dst.data(),
                                           rc.data(), rd.data(), MPI_BYTE, comm_),
                             c + " (MPI_Alltoallv)");
                       dst.finish();
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
    const Sig sig{{static_cast<int64_t>(OpType::ALLTOALL), -1, dtype_id(inputs[0].scalar_type()), -1}};
    auto ins = inputs;
    auto outs = outputs;
    const bool checked = size_ > 1 && check_.load(std::memory_order_relaxed);
    return collective(c, OpType::ALLTOALL, "mpiml:all_to_all", inputs, outputs, sig,
                   [this, ins, outs, c, checked] {
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
                       if (checked) check_alltoall(c, sc, rc);
                       at::Tensor send = at::cat(parts);
                       at::Tensor recv = at::empty({static_cast<int64_t>(ro)}, at::kByte);
                       check(MPI_Alltoallv(send.data_ptr(), sc.data(), sd.data(), MPI_BYTE,
                                           recv.data_ptr(), rc.data(), rd.data(), MPI_BYTE, comm_),
                             c + " (MPI_Alltoallv)");
                       for (int r = 0; r < size_; ++r)
                           outs[r].copy_(recv.narrow(0, rd[r], rc[r])
                                             .view(outs[r].scalar_type())
                                             .view(outs[r].sizes()));
                   });
}

// A send or receive: posted in issue order by the worker, which goes on with
// the queue and completes the Work when MPI completes the request.
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
    auto work = c10::make_intrusive<MpimlWork>(
        type, tensors, is_send ? "mpiml:send" : any_source ? "mpiml:recvAnySource" : "mpiml:recv",
        tensors);
    queue_->push(WorkerQueue::Op{
        name,
        [this, work, t, peer, tag, is_send, any_source, name] {
            work->profile_start();
            // The buffer and the watch live until the request completes.
            struct Hold {
                Hold(const at::Tensor& t, std::string call, double timeout, std::string where)
                    : buf(t), watch(std::move(call), timeout, std::move(where)) {}
                Contig buf;
                mpiml::detail::DoorWatch watch;
            };
            auto h = std::make_shared<Hold>(t, "mpiml c10d " + name, timeout_s_, where_);
            const int n = int_count(name, nbytes(h->buf.buf));
            WorkerQueue::Posted p;
            if (is_send)
                check(MPI_Isend(h->buf.data(), n, MPI_BYTE, peer, tag, comm_, &p.req), name + " (MPI_Isend)");
            else
                check(MPI_Irecv(h->buf.data(), n, MPI_BYTE, any_source ? MPI_ANY_SOURCE : peer, tag,
                                comm_, &p.req),
                      name + " (MPI_Irecv)");
            if (!is_send)
                p.done = [h, work, any_source, name](const MPI_Status& st) {
                    if (any_source) work->set_source(st.MPI_SOURCE);
                    run_untracked(name, [&] { h->buf.finish(); });
                };
            p.hold = h;
            return p;
        },
        [work](std::exception_ptr e) { work->complete(e); }});
    return work;
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
    const Sig sig{{static_cast<int64_t>(OpType::BARRIER), 0, -1, -1}};
    return collective("barrier", OpType::BARRIER, "mpiml:barrier", {}, {}, sig,
                      [this] { mpiml::detail::barrier(comm_, "mpiml c10d barrier"); });
}

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
             "finishes queued operations and stops the worker");
    m.def("at_exit", [] { mpiml_c10d::at_exit(); }, py::call_guard<py::gil_scoped_release>());
    m.def("set_check_default", &mpiml_c10d::set_check_default);
    m.def("agreement_rounds", &mpiml::detail::agreement_rounds,
          "agreement rounds this process has run (each a small allreduce)");
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

