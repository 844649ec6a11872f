// The backend's worker queue: see worker_queue.hpp.
#include "worker_queue.hpp"

#include <mpiml/error.hpp>

#include <cstdint>
#include <system_error>

#include <sys/prctl.h>

namespace mpiml_c10d {
namespace {
// The queue whose operations this thread is completing (running callbacks).
thread_local const WorkerQueue* t_completing = nullptr;
}  // namespace

WorkerQueue::WorkerQueue(std::string prefix) : prefix_(std::move(prefix)) {
    std::lock_guard lock(m_);
    threads_.emplace_back([this] { loop(/*runner=*/true); });
    ++idle_spares_;
    threads_.emplace_back([this] { loop(/*runner=*/false); });
    started_ = 2;
}

WorkerQueue::~WorkerQueue() { shutdown(); }

int WorkerQueue::threads_started() const {
    std::lock_guard lock(m_);
    return started_;
}

void WorkerQueue::push(Op op) {
    {
        std::lock_guard lock(m_);
        if (stop_) mpiml::detail::fail((prefix_ + op.name).c_str(), "the process group has been shut down");
        queue_.push_back(std::move(op));
        if (!runner_) {
            // The runner is in callbacks. Pushed from one of them (this
            // thread), the op would wait behind the callback that waits for it.
            if (t_completing == this && !hand_off_locked()) {
                const std::string n = std::move(queue_.back().name);
                queue_.pop_back();
                mpiml::detail::fail((prefix_ + n).c_str(),
                                    "issued from a future's callback, it needs a spare thread, "
                                    "which could not be started");
            }
            return;
        }
    }
    cv_.notify_one();
}

// With m_ held: offers the free role to a spare, starting one if none waits.
// False if a thread could not be started.
bool WorkerQueue::hand_off_locked() {
    handoff_ = true;
    if (idle_spares_ > 0) {
        spare_cv_.notify_one();
    } else if (!closed_) {
        ++idle_spares_;  // counted from its start, so that it is started once
        try {
            threads_.emplace_back([this] { loop(/*runner=*/false); });
            ++started_;
        } catch (const std::system_error&) {
            --idle_spares_;
            return false;
        }
    }
    return true;
}

void WorkerQueue::shutdown() {
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
}

bool WorkerQueue::run_here(const void* tag) {
    std::unique_lock lock(m_);
    if (!tag || !idle_ || borrowed_ || stop_ || queue_.size() != 1 || queue_.front().tag != tag)
        return false;
    Op op = std::move(queue_.front());
    queue_.pop_front();
    borrowed_ = true;  // the runner stays in its wait until the op has run
    lock.unlock();
    std::exception_ptr ep;
    try {
        Posted posted = op.run();
        if (posted.req != MPI_REQUEST_NULL) {
            MPI_Status st;
            mpiml::detail::check_mpi(MPI_Wait(&posted.req, &st), (prefix_ + op.name).c_str());
            if (posted.done) posted.done(st);
        }
    } catch (...) {
        ep = std::current_exception();
    }
    lock.lock();
    borrowed_ = false;
    lock.unlock();
    cv_.notify_one();
    // Outside the role, as the runner completes: a callback may issue an op
    // and wait for it.
    op.complete(ep);
    return true;
}

// A spare, with m_ held: returns holding the role, offered to it, free at
// stop, or given up for callbacks that have held up waiting work for a tick.
void WorkerQueue::wait_for_role(std::unique_lock<std::mutex>& lock) {
    std::uint64_t stuck_release = UINT64_MAX;
    for (;;) {
        if (!runner_ && (stop_ || handoff_)) break;
        if (spare_cv_.wait_for(lock, kTick) != std::cv_status::timeout) continue;
        const bool stuck = !runner_ && (!queue_.empty() || npending_ > 0);
        if (stuck && releases_ == stuck_release) break;
        stuck_release = stuck ? releases_ : UINT64_MAX;
    }
    handoff_ = false;
    --idle_spares_;
    runner_ = true;
}

void WorkerQueue::loop(bool runner) {
    // The runner's naps are 10-200 us; Linux's default timer slack (50 us)
    // would add most of that again to each.
    prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL);
    std::vector<Done> done;
    std::unique_lock lock(m_);
    for (;;) {
        if (!runner) {
            wait_for_role(lock);
            runner = true;
        }
        if (pending_.empty()) {
            idle_ = true;
            cv_.wait(lock, [&] { return !borrowed_ && (stop_ || !queue_.empty()); });
            idle_ = false;
        }
        if (queue_.empty()) {
            if (stop_ && pending_.empty()) {
                // Drained: the spares take the role in turn, find the same and end.
                runner_ = false;
                spare_cv_.notify_all();
                return;
            }
            const bool stopping = stop_;
            lock.unlock();
            if (stopping)
                cancel_pending(done);
            else
                poll_pending(true, done);
        } else {
            Op op = std::move(queue_.front());
            queue_.pop_front();
            lock.unlock();
            std::exception_ptr ep;
            Posted posted;
            try {
                posted = op.run();
            } catch (...) {
                ep = std::current_exception();
            }
            if (ep || posted.req == MPI_REQUEST_NULL)
                done.push_back(Done{std::move(op.complete), ep});
            else
                pending_.push_back(Pending{std::move(posted), std::move(op.complete), std::move(op.name)});
            poll_pending(false, done);
        }
        runner = complete_all(done, lock);
    }
}

// Completes what is in done (lock unlocked; returns it locked), with the role
// given up around the callbacks. Returns whether this thread holds the role
// again; if a spare took it, this one is a spare now.
bool WorkerQueue::complete_all(std::vector<Done>& done, std::unique_lock<std::mutex>& lock) {
    lock.lock();
    npending_ = pending_.size();
    if (done.empty()) return true;
    runner_ = false;
    ++releases_;
    lock.unlock();
    const WorkerQueue* outer = t_completing;
    t_completing = this;
    for (auto& d : done) d.complete(d.ep);
    t_completing = outer;
    done.clear();
    lock.lock();
    if (runner_) {
        ++idle_spares_;
        return false;
    }
    runner_ = true;
    handoff_ = false;
    return true;
}

// Moves the completed requests into done (completed by complete_all, once
// this thread is done with pending_).
void WorkerQueue::poll_pending(bool block_briefly, std::vector<Done>& done) {
    for (std::size_t i = 0; i < pending_.size();) {
        int flag = 0;
        MPI_Status st;
        auto& p = pending_[i];
        const int rc = MPI_Test(&p.posted.req, &flag, &st);
        if (rc != MPI_SUCCESS || flag) {
            std::exception_ptr ep;
            try {
                mpiml::detail::check_mpi(rc, (prefix_ + p.name).c_str());
                if (p.posted.done) p.posted.done(st);
            } catch (...) {
                ep = std::current_exception();
            }
            done.push_back(Done{std::move(p.complete), ep});
            pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(i));
            continue;
        }
        ++i;
    }
    if (block_briefly && !pending_.empty()) std::this_thread::sleep_for(std::chrono::microseconds(20));
}

// At shutdown: requests that never completed end with an error.
void WorkerQueue::cancel_pending(std::vector<Done>& done) {
    for (auto& p : pending_) {
        MPI_Cancel(&p.posted.req);
        // A cancelled request completes; until it has, MPI may still use the
        // buffer: one that does not within a moment keeps it for good.
        int flag = 0;
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
        while (MPI_Test(&p.posted.req, &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS && !flag &&
               std::chrono::steady_clock::now() < deadline)
            std::this_thread::yield();
        if (!flag) {
            MPI_Request_free(&p.posted.req);
            new std::shared_ptr<void>(std::move(p.posted.hold));  // leaked on purpose
        }
        try {
            mpiml::detail::fail((prefix_ + p.name).c_str(),
                                "the process group was shut down before it completed");
        } catch (...) {
            done.push_back(Done{std::move(p.complete), std::current_exception()});
        }
    }
    pending_.clear();
}

}  // namespace mpiml_c10d
