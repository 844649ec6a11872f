// Collective watchdog: a rank stuck in a collective past its deadline says
// where it waits and which ranks never arrived, then aborts the job.
#include "core/report.hpp"
#include "core/state.hpp"
#include "core/arrival.hpp"
#include "core/watchdog.hpp"

#include <mpiml/error.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

namespace mpiml::detail {
namespace {

using Clock = std::chrono::steady_clock;

// One armed wait.
struct Slot {
    std::uint64_t id;
    Clock::time_point start;
    Watched w;
};

struct Watch {
    std::mutex m;
    std::condition_variable cv;
    std::thread thread;
    bool stop = false;
    std::uint64_t last_id = 0;
    std::vector<Slot> slots;  // the armed waits, any thread's
};
// Never destroyed (nor the board): the watchdog is shut down inside
// MPI_Finalize, which may run from atexit after static destructors.
Watch& watch() {
    static auto* w = new Watch;
    return *w;
}

std::string name_of(MPI_Comm comm) {
    if (comm == MPI_COMM_WORLD) return "MPI_COMM_WORLD";
    char name[MPI_MAX_OBJECT_NAME] = {};
    int len = 0;
    MPI_Comm_get_name(comm, name, &len);
    return len > 0 ? std::string(name, len) : "a communicator";
}

// Past a deadline: the one place a watched wait ends the job.
[[noreturn]] void expire(const Slot& s, double waited, double limit) {
    char head[96];
    std::snprintf(head, sizeof head, " waited %.1f s, past the timeout of %g s", waited, limit);
    std::string what = "watchdog: " + (s.w.call.empty() ? std::string(s.w.info.call) : s.w.call) + head;
    if (s.w.call.empty())
        what += " in " + describe(s.w.info) + ", call #" + std::to_string(s.w.seq) + " on " +
                name_of(s.w.info.comm) + missing_ranks(s.w.seq, s.w.info.comm);
    what += s.w.where;
    end_on_hang(what);
}

void loop() {
    auto& w = watch();
    std::unique_lock lock(w.m);
    auto last = Clock::now();
    while (!w.stop) {
        w.cv.wait_for(lock, std::chrono::milliseconds(50));
        if (w.stop) continue;
        const auto now = Clock::now();
        // A tick a second late: the process was stopped (SIGSTOP, Slurm's
        // suspend) or not scheduled; that time does not count as waiting.
        // A wait that began after the last tick began before the stop or after
        // it: it counts from now.
        if (const auto gap = now - last; gap > std::chrono::seconds(1))
            for (Slot& s : w.slots)
                s.start = s.start < last ? s.start + gap - std::chrono::milliseconds(50) : now;
        last = now;
        const double global = state().timeout.load(std::memory_order_relaxed);
        for (const Slot& s : w.slots) {
            const double limit = s.w.timeout > 0 ? s.w.timeout : global;
            const double waited = std::chrono::duration<double>(now - s.start).count();
            if (limit <= 0 || waited < limit) continue;
            const Slot expired = s;
            lock.unlock();  // the message may take a while; arming goes on meanwhile
            expire(expired, waited, limit);
        }
    }
}

void stop_hook() {
    auto& w = watch();
    {
        std::lock_guard lock(w.m);
        w.stop = true;
        w.slots.clear();
    }
    w.cv.notify_all();
    if (w.thread.joinable()) w.thread.join();
}

}  // namespace

std::uint64_t watchdog_arm(Watched armed) {
    auto& w = watch();
    std::lock_guard lock(w.m);
    if (!w.thread.joinable()) {
        w.stop = false;
        w.thread = std::thread(loop);
        register_finalize_hook(stop_hook);
    }
    const std::uint64_t id = ++w.last_id;
    w.slots.push_back(Slot{id, Clock::now(), std::move(armed)});
    return id;
}

void watchdog_disarm(std::uint64_t id) {
    if (id == 0) return;
    auto& w = watch();
    std::lock_guard lock(w.m);
    for (auto& s : w.slots)
        if (s.id == id) {
            if (&s != &w.slots.back()) s = std::move(w.slots.back());
            w.slots.pop_back();
            return;
        }
}

}  // namespace mpiml::detail
