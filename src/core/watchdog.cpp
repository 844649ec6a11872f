// Collective watchdog: a rank stuck in a collective past its deadline says
// where it waits and which ranks never arrived, then aborts the job.
#include "core/report.hpp"
#include "core/state.hpp"
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

// Node-local arrival board: one slot per rank of the node holding the
// sequence number of the last world collective it entered.
struct Board {
    MPI_Comm node = MPI_COMM_NULL;
    MPI_Win win = MPI_WIN_NULL;
    std::uint64_t* mine = nullptr;
    std::vector<std::uint64_t*> slots;  // by node rank
    std::vector<int> world_ranks;       // node rank -> world rank
    std::atomic<bool> ready{false};
    bool tried = false;
    bool unusable = false;  // set up, but a query failed: freed, never read
};
Board& board() {
    static auto* b = new Board;
    return *b;
}

std::string name_of(MPI_Comm comm) {
    if (comm == MPI_COMM_WORLD) return "MPI_COMM_WORLD";
    char name[MPI_MAX_OBJECT_NAME] = {};
    int len = 0;
    MPI_Comm_get_name(comm, name, &len);
    return len > 0 ? std::string(name, len) : "a communicator";
}

std::string missing_ranks(std::uint64_t my_seq, MPI_Comm comm) {
    auto& b = board();
    int n = 0;
    if (!state().world_set_up.load() && MPI_Comm_size(comm, &n) == MPI_SUCCESS && n == state().world_size)
        return "; a rank has not come to its first collective spanning every rank (this one waits "
               "for it to set up)";
    if (comm != MPI_COMM_WORLD || !b.ready.load()) return "";
    std::string late;
    for (std::size_t i = 0; i < b.slots.size(); ++i) {
        const std::uint64_t s = std::atomic_ref<std::uint64_t>(*b.slots[i]).load();
        if (s < my_seq)
            late += (late.empty() ? "" : ", ") + std::to_string(b.world_ranks[i]) +
                    " (last entered #" + std::to_string(s) + ")";
    }
    char host[256] = {};
    if (::gethostname(host, sizeof host - 1) != 0) host[0] = '?';
    const std::string node = std::string("this node (") + host + ")";
    if (late.empty()) return "; every rank on " + node + " arrived (a rank on another node may not have)";
    return "; ranks on " + node + " that never arrived: " + late;
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
        if (const auto gap = now - last; gap > std::chrono::seconds(1))
            for (Slot& s : w.slots)
                if (s.start < last) s.start += gap - std::chrono::milliseconds(50);
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

// Two hooks: stopping the thread is local; freeing the board is collective,
// so it is registered where every rank registers it alike (board set-up).
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

void free_board_hook() {
    auto& b = board();
    if (b.ready.exchange(false) || b.unusable) {
        MPI_Win_free(&b.win);
        MPI_Comm_free(&b.node);
        b.unusable = false;
    }
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

void arrival_board_setup() {
    auto& b = board();
    if (b.tried) return;
    b.tried = true;  // once: a failed set-up is not retried (nor a collective again)
    // Collective over the world; without a board the watchdog still fires,
    // without naming late ranks.
    if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &b.node) !=
        MPI_SUCCESS) {
        b.node = MPI_COMM_NULL;
        return;
    }
    int n = 0;
    MPI_Comm_size(b.node, &n);
    void* base = nullptr;
    if (MPI_Win_allocate_shared(sizeof(std::uint64_t), sizeof(std::uint64_t), MPI_INFO_NULL, b.node,
                                &base, &b.win) != MPI_SUCCESS) {
        MPI_Comm_free(&b.node);
        return;
    }
    b.mine = static_cast<std::uint64_t*>(base);
    *b.mine = 0;
    b.slots.assign(static_cast<std::size_t>(n), nullptr);
    std::vector<int> nr(static_cast<std::size_t>(n));
    b.world_ranks.assign(static_cast<std::size_t>(n), MPI_UNDEFINED);
    bool ok = true;
    for (int r = 0; r < n; ++r) {
        MPI_Aint size = 0;
        int disp = 0;
        void* p = nullptr;
        ok = ok && MPI_Win_shared_query(b.win, r, &size, &disp, &p) == MPI_SUCCESS && p != nullptr;
        b.slots[static_cast<std::size_t>(r)] = static_cast<std::uint64_t*>(p);
        nr[static_cast<std::size_t>(r)] = r;
    }
    MPI_Group gn, gw;
    MPI_Comm_group(b.node, &gn);
    MPI_Comm_group(MPI_COMM_WORLD, &gw);
    ok = ok && MPI_Group_translate_ranks(gn, n, nr.data(), gw, b.world_ranks.data()) == MPI_SUCCESS;
    MPI_Group_free(&gn);
    MPI_Group_free(&gw);
    // Freeing is collective: registered on every rank alike, board or not.
    register_finalize_hook(free_board_hook);
    b.ready.store(ok);
    if (!ok) b.unusable = true;
}

void arrival_mark(std::uint64_t world_seq) {
    auto& b = board();
    if (b.ready.load(std::memory_order_relaxed))
        std::atomic_ref<std::uint64_t>(*b.mine).store(world_seq, std::memory_order_relaxed);
}

}  // namespace mpiml::detail
