// The torch.distributed backend's worker queue (worker_queue.cpp), free of
// torch so that it is tested on its own (tests/test_worker_queue.cpp, also
// under ThreadSanitizer).
//
// Operations run in issue order on the thread that holds the runner role. An
// operation either ends in its run, or posts a request (a send or receive)
// that the runner polls while it goes on with the queue. Completing an
// operation runs its future's callbacks on the completing thread, as Gloo's
// do, and a callback may issue an operation and wait for it (PowerSGD), or
// wait for one queued before it: so the role is given up around callbacks.
// An operation pushed from inside them is handed to a spare thread at once; a
// spare that finds the role given up and work waiting for a whole tick takes
// it. A thread back from its callbacks becomes a spare if the role was taken.
#pragma once

#include <mpi.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace mpiml_c10d {

class WorkerQueue {
public:
    /// What an operation's run leaves to wait for: nothing (req null), or a
    /// posted request; done runs when it completes, hold lives until then.
    struct Posted {
        MPI_Request req = MPI_REQUEST_NULL;
        std::function<void(const MPI_Status&)> done;
        std::shared_ptr<void> hold;
    };
    struct Op {
        std::string name;  // in errors: prefix + name
        std::function<Posted()> run;
        std::function<void(std::exception_ptr)> complete;  // may run callbacks that push
        // Non-null: a thread about to wait for this op may run it itself
        // (run_here); only for ops whose run ends them (no posted request).
        const void* tag = nullptr;
    };

    /// How long a spare lets work wait behind callbacks before it takes over.
    static constexpr auto kTick = std::chrono::milliseconds(100);

    /// prefix: names the backend in errors ("mpiml c10d "). Starts the runner
    /// and one spare.
    explicit WorkerQueue(std::string prefix);
    ~WorkerQueue();
    WorkerQueue(const WorkerQueue&) = delete;
    WorkerQueue& operator=(const WorkerQueue&) = delete;

    /// Queues op; throws mpiml::Error naming it after shutdown, or when it is
    /// pushed from a callback and no spare thread could be started.
    void push(Op op);
    /// A thread about to block on the op tagged tag runs it itself when it is
    /// the only op queued and the runner waits for work with nothing pending:
    /// a blocking call then costs no thread hand-off. Returns whether it did
    /// (the op is complete then). Ops still run one at a time, in issue order.
    bool run_here(const void* tag);
    /// Runs what is queued, ends posted requests that never completed with an
    /// error, and joins every thread. Idempotent.
    void shutdown();

    /// Threads started so far (the runner and the spares), for tests.
    int threads_started() const;

private:
    struct Pending {
        Posted posted;
        std::function<void(std::exception_ptr)> complete;
        std::string name;
    };
    struct Done {
        std::function<void(std::exception_ptr)> complete;
        std::exception_ptr ep;
    };

    void loop(bool runner);
    void wait_for_role(std::unique_lock<std::mutex>& lock);
    bool complete_all(std::vector<Done>& done, std::unique_lock<std::mutex>& lock);
    bool hand_off_locked();
    void poll_pending(bool block_briefly, std::vector<Done>& done);
    void cancel_pending(std::vector<Done>& done);

    const std::string prefix_;
    mutable std::mutex m_;
    std::condition_variable cv_;        // the runner: work queued, or stop
    std::condition_variable spare_cv_;  // spares: the role is handed over, or stop
    std::deque<Op> queue_;
    bool stop_ = false;
    bool runner_ = true;          // some thread holds the runner role
    bool handoff_ = false;        // the role is offered to a spare
    bool idle_ = false;           // the runner waits for work, nothing pending
    bool borrowed_ = false;       // a waiting thread runs an op (run_here)
    int idle_spares_ = 0;         // spares waiting for the role (or starting)
    std::uint64_t releases_ = 0;  // times the role was given up for callbacks
    std::size_t npending_ = 0;    // pending_.size() as the runner last left it
    bool closed_ = false;         // shutdown joined every thread: start no more
    int started_ = 0;
    std::vector<std::thread> threads_;

    std::vector<Pending> pending_;  // the runner's only
};

}  // namespace mpiml_c10d
