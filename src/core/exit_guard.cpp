// The exit guard. MPI_Finalize waits for every rank, so a rank that ends
// while its peers wait for it in a collective would hang the job. Each rank
// keeps four counters in an MPI window over MPI_COMM_WORLD: collectives
// entered on communicators that span every rank, how many it is inside, the
// last one's kind and number, and whether it has ended (with its status).
// At MPI_Finalize a rank marks itself ended and reads its peers' counters
// until every rank has ended (then finalizes as usual). A peer inside a
// collective it entered after this rank's last one waits for a rank that
// will never come: the job is aborted at once, with one line naming both.
// A peer busy outside MPI is simply waited for. Peers on this node are read
// in shared memory (a rank waiting in the shared-memory path is not inside
// MPI); others with MPI_Rget, which completes when the peer's MPI makes
// progress, as it does while the peer waits in an MPI collective.
#include "core/exit_guard.hpp"

#include "core/report.hpp"
#include "core/state.hpp"
#include "core/arrival.hpp"
#include "core/watchdog.hpp"

#include <mpiml/failure.hpp>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <mutex>
#include <string>
#include <vector>

namespace mpiml::detail {
namespace {

enum Slot : int { entered = 0, inside = 1, last = 2, ended = 3, nslots = 4 };
constexpr std::uint64_t ended_flag = std::uint64_t{1} << 32;
constexpr std::uint64_t status_mask = 0xffff;
constexpr std::uint64_t status_unknown = status_mask;
constexpr int seq_bits = 56;

struct Guard {
    std::once_flag once;
    std::atomic<bool> set_up{false};  // call_once's fast path touches TLS
    std::atomic<bool> ready{false};
    std::atomic<bool> ran{false};
    MPI_Comm node = MPI_COMM_NULL;
    MPI_Win node_win = MPI_WIN_NULL;     // the counters, shared within the node
    MPI_Win win = MPI_WIN_NULL;          // the same memory, for remote reads
    bool remote = false;                 // win works on every rank
    std::uint64_t* mine = nullptr;
    std::vector<std::uint64_t*> local;  // by world rank; null for other nodes
    std::atomic<int> status{-1};  // -1: not known
    std::atomic<bool> exiting{false};  // run from an exit handler, status not known yet
};
// Never destroyed: used inside MPI_Finalize, which may run from atexit.
Guard& guard() {
    static auto* g = new Guard;
    return *g;
}

std::atomic_ref<std::uint64_t> slot(Slot i) { return std::atomic_ref<std::uint64_t>(guard().mine[i]); }

// Collectives under way in this process, the last one entered, and whether
// MPI is being finalized (then no thread may enter another).
std::atomic<int> under_way{0};
std::atomic<std::uint64_t> last_entered{0};
std::atomic<bool> finalizing{false};

constexpr std::uint64_t seq_mask = (std::uint64_t{1} << seq_bits) - 1;

// "allreduce #3"; number 0 is the door right after mpiml's MPI_Init.
std::string collective_text(std::uint64_t last) {
    const auto kind = static_cast<Kind>(last >> seq_bits);
    const std::uint64_t seq = last & seq_mask;
    if (seq == 0) return "the start of MPI";
    return std::string(kind_name(kind)) + " #" + std::to_string(seq);
}

/// "exited with status 3 (host h1)" or "finalized MPI (host h1)".
std::string ended_text(int status) {
    char host[256] = {};
    if (::gethostname(host, sizeof host - 1) != 0) host[0] = '?';
    return (status >= 0 ? "exited with status " + std::to_string(status) : std::string("finalized MPI")) +
           " (host " + host + ")";
}

// What a rank at the door does: waits in its first collective, or starts MPI.
std::string doing_text(std::uint64_t last, bool plural) {
    if ((last & seq_mask) == 0) return plural ? " start MPI" : " starts MPI";
    return (plural ? " wait in " : " waits in ") + collective_text(last);
}

std::string waiting_text(const std::vector<std::pair<int, std::uint64_t>>& stuck) {
    bool same = true;
    for (const auto& s : stuck) same = same && s.second == stuck.front().second;
    std::string text;
    if (same) {
        text = stuck.size() == 1 ? "rank " : "ranks ";
        for (std::size_t i = 0; i < stuck.size(); ++i)
            text += (i ? ", " : "") + std::to_string(stuck[i].first);
        return text + doing_text(stuck.front().second, stuck.size() > 1);
    }
    for (std::size_t i = 0; i < stuck.size(); ++i)
        text += (i ? ", rank " : "rank ") + std::to_string(stuck[i].first) + doing_text(stuck[i].second, false);
    return text;
}

void exit_board_setup() {
    auto& g = guard();
    if (g.set_up.load(std::memory_order_acquire)) return;
    std::call_once(g.once, [&g] {
        const int n = state().world_size;
        if (n <= 1) return;
        constexpr MPI_Aint bytes = nslots * sizeof(std::uint64_t);
        g.local.assign(static_cast<std::size_t>(n), nullptr);
        void* base = nullptr;
        if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &g.node) ==
                MPI_SUCCESS &&
            MPI_Win_allocate_shared(kBoardSegment, 1, MPI_INFO_NULL, g.node, &base,
                                    &g.node_win) == MPI_SUCCESS) {
            int k = 0;
            MPI_Comm_size(g.node, &k);
            MPI_Group gn, gw;
            MPI_Comm_group(g.node, &gn);
            MPI_Comm_group(MPI_COMM_WORLD, &gw);
            for (int r = 0; r < k; ++r) {
                MPI_Aint size = 0;
                int disp = 0, w = MPI_UNDEFINED;
                void* p = nullptr;
                MPI_Group_translate_ranks(gn, 1, &r, gw, &w);
                if (MPI_Win_shared_query(g.node_win, r, &size, &disp, &p) == MPI_SUCCESS &&
                    w >= 0 && w < n && size >= kBoardSegment)
                    g.local[static_cast<std::size_t>(w)] = own_lines(p);
            }
            MPI_Group_free(&gn);
            MPI_Group_free(&gw);
            g.mine = own_lines(base);
        } else {
            if (g.node != MPI_COMM_NULL) MPI_Comm_free(&g.node);
            g.local.assign(static_cast<std::size_t>(n), nullptr);
            g.mine = new std::uint64_t[nslots];  // for remote reads only; kept
        }
        for (int i = 0; i < nslots; ++i) g.mine[i] = 0;
        // Remote reads need one-sided MPI over the network (Open MPI: osc ucx,
        // chosen on InfiniBand/RoCE, or with --mca osc sm,ucx over TCP). Every
        // rank must have it, or no rank uses it.
        int ok = MPI_Win_create(g.mine, bytes, sizeof(std::uint64_t), MPI_INFO_NULL, MPI_COMM_WORLD,
                                &g.win) == MPI_SUCCESS;
        if (ok) {
            MPI_Win_set_errhandler(g.win, MPI_ERRORS_RETURN);
            ok = MPI_Win_lock_all(MPI_MODE_NOCHECK, g.win) == MPI_SUCCESS;
        }
        int all_ok = ok;
        if (MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD) != MPI_SUCCESS) all_ok = 0;
        g.remote = all_ok != 0;
        if (!g.remote) g.win = MPI_WIN_NULL;  // left as it is: freeing may be collective
        // Every rank's counters start at zero before any rank reads them.
        MPI_Barrier(MPI_COMM_WORLD);
        if (!g.remote && g.node == MPI_COMM_NULL) return;  // nothing to read peers with
        g.ready.store(true, std::memory_order_release);
    });
    g.set_up.store(true, std::memory_order_release);
}

// Every rank has ended and this process is on its way out: its exit is
// finished, not cut short. Launchers end the remaining ranks as soon as one
// exits with a non-zero status (srun -K, mpirun), and their SIGTERM would
// turn this rank's status (75 after a stop, say) into "terminated".
// SIGTERM, SIGINT and SIGHUP now leave the exit up to 5 s; then the process
// ends with its own status, or by that signal if its status is still not
// known (an interpreter's exit handlers). SIGKILL ends it as always.
volatile std::sig_atomic_t exit_status_now = -1;  // -1: not known yet
volatile std::sig_atomic_t exit_protected = 0;
volatile std::sig_atomic_t term_seen = 0;         // the first such signal
extern "C" void end_with_own_status(int) {
    if (exit_status_now >= 0) ::_exit(exit_status_now);
    ::signal(term_seen, SIG_DFL);
    ::raise(term_seen);
    ::_exit(128 + term_seen);
}
extern "C" void finish_exit_first(int sig) {
    if (term_seen) return;
    term_seen = sig;
    ::alarm(5);
}
void finish_exit_undisturbed(int status) {
    // Status not known and not at an exit handler: MPI finalized while the
    // program goes on, and keeps its signals.
    if (status < 0 && !guard().exiting.load(std::memory_order_relaxed)) return;
    if (status >= 0) exit_status_now = status;
    exit_protected = 1;
    struct sigaction sa {};
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sa.sa_handler = end_with_own_status;
    ::sigaction(SIGALRM, &sa, nullptr);
    sa.sa_handler = finish_exit_first;
    for (int sig : {SIGTERM, SIGINT, SIGHUP}) ::sigaction(sig, &sa, nullptr);
}

// The world set-up, once per process (any thread); done: state().world_set_up.
std::once_flag world_once;

void setup_all() {
    arrival_board_setup();
    exit_board_setup();
    report_setup();
}

// The door: an MPI_Iallgather over MPI_COMM_WORLD of what each rank is
// doing: entering its first collective (kind and number) or ending (status).
// Nonblocking on both sides, so the two match.
constexpr int door_slots = 2;
std::uint64_t ended_word(int status) {
    return ended_flag | (status >= 0 ? static_cast<std::uint64_t>(status) & status_mask : status_unknown);
}

std::string remote_ended_text(int rank, std::uint64_t word) {
    const std::uint64_t st = word & status_mask;
    return "rank " + std::to_string(rank) +
           (st == status_unknown ? std::string(" finalized MPI") : " exited with status " + std::to_string(st));
}

void door_on_entry(Kind kind, std::uint64_t seq) {
    const int n = state().world_size;
    std::uint64_t mine[door_slots] = {0, static_cast<std::uint64_t>(kind) << seq_bits | seq};
    std::vector<std::uint64_t> all(static_cast<std::size_t>(n) * door_slots);
    MPI_Request req = MPI_REQUEST_NULL;
    if (MPI_Iallgather(mine, door_slots, MPI_UINT64_T, all.data(), door_slots, MPI_UINT64_T,
                       MPI_COMM_WORLD, &req) != MPI_SUCCESS ||
        MPI_Wait(&req, MPI_STATUS_IGNORE) != MPI_SUCCESS)
        return;  // MPI's own error follows in the collective itself
    std::string ended;
    int first_entering = -1;
    for (int j = 0; j < n; ++j) {
        const std::uint64_t w = all[static_cast<std::size_t>(j) * door_slots];
        if (w & ended_flag) ended += (ended.empty() ? "" : ", ") + remote_ended_text(j, w);
        else if (first_entering < 0) first_entering = j;
    }
    if (ended.empty()) return;
    // The rank that ended says so and ends the job. If it no longer can (it
    // waited past its limit and is finalizing), the first rank entering
    // does, one line for the job; the others only if that end never comes.
    const timespec grace{first_entering == state().world_rank ? 2 : 10, 0};
    ::nanosleep(&grace, nullptr);
    abort_job(collective_text(mine[1]) + " cannot complete: " + ended +
                  (seq == 0 ? " before it started MPI" : " before its first collective"),
              1);
}

// At exit, before any collective spanning every rank (before_mpi: before
// this rank would have started MPI at all): meets the others'
// door. Every rank ending: nothing to guard. A rank entering its first
// collective: it would wait for this one forever; the job ends. Nobody else
// at the door within a few seconds (still busy, or not using mpiml): MPI_Finalize
// as before; the request stays posted, and MPI progresses it while this
// rank finalizes, so a rank that comes to the door later learns that this
// one ended.
void door_at_exit(bool before_mpi) {
    const int n = state().world_size;
    if (n <= 1) return;
    const int status = guard().status.load(std::memory_order_relaxed);
    // Kept past this call: the request may still be posted at MPI_Finalize.
    static std::uint64_t mine[door_slots];
    static auto* all = new std::vector<std::uint64_t>;
    mine[0] = ended_word(status);
    mine[1] = 0;
    all->assign(static_cast<std::size_t>(n) * door_slots, 0);
    MPI_Request req = MPI_REQUEST_NULL;
    if (MPI_Iallgather(mine, door_slots, MPI_UINT64_T, all->data(), door_slots, MPI_UINT64_T,
                       MPI_COMM_WORLD, &req) != MPI_SUCCESS)
        return;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(3);
    int done = 0;
    while (!done && std::chrono::steady_clock::now() < until) {
        if (MPI_Test(&req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) return;
        if (!done) {
            const timespec nap{0, 200'000};
            ::nanosleep(&nap, nullptr);
        }
    }
    if (!done) return;
    std::vector<std::pair<int, std::uint64_t>> entering;
    int first_ended = -1;
    for (int j = 0; j < n; ++j) {
        if (!((*all)[static_cast<std::size_t>(j) * door_slots] & ended_flag))
            entering.emplace_back(j, (*all)[static_cast<std::size_t>(j) * door_slots + 1]);
        else if (first_ended < 0)
            first_ended = j;
    }
    if (entering.empty()) {
        finish_exit_undisturbed(status);
        return;
    }
    // One line and one MPI_Abort for the job: the first rank that ended;
    // the others finalize, and that abort ends them.
    if (first_ended == state().world_rank)
        abort_job(ended_text(status) + (before_mpi ? " before it started MPI, while " : " while ") +
                      waiting_text(entering),
                  status > 0 ? status : 1);
}

}  // namespace

void world_setup_at_init() {
    // The door first: a rank that ended before it started MPI may have
    // started it on its way out only to say so (exit_guard_before_mpi).
    std::call_once(world_once, [] {
        if (state().world_size > 1) door_on_entry(Kind::other, 0);
        setup_all();
    });
    state().world_set_up.store(true, std::memory_order_release);
}

void world_setup_on_entry(Kind kind, std::uint64_t seq) {
    if (state().world_set_up.load(std::memory_order_acquire)) return;
    std::call_once(world_once, [kind, seq] {
        if (state().world_size > 1) door_on_entry(kind, seq);
        setup_all();
    });
    state().world_set_up.store(true, std::memory_order_release);
}


bool exit_guard_ready() { return guard().ready.load(std::memory_order_acquire); }

void exit_mark_enter(Kind kind, std::uint64_t seq) {
    slot(entered).fetch_add(1, std::memory_order_relaxed);
    slot(last).store(static_cast<std::uint64_t>(kind) << seq_bits | seq, std::memory_order_relaxed);
    slot(inside).fetch_add(1, std::memory_order_release);
}

void exit_mark_leave() { slot(inside).fetch_sub(1, std::memory_order_release); }

void set_exit_status(int status) {
    guard().status.store(status, std::memory_order_relaxed);
    if (exit_protected && status >= 0) exit_status_now = status;
}

bool collective_entered(Kind kind, std::uint64_t seq) {
    last_entered.store(static_cast<std::uint64_t>(kind) << seq_bits | seq, std::memory_order_relaxed);
    under_way.fetch_add(1);  // then the flag: one of the two threads sees the other
    if (!finalizing.load()) return true;
    under_way.fetch_sub(1);
    return false;
}

void collective_left() { under_way.fetch_sub(1, std::memory_order_release); }

void exit_check_other_threads() {
    finalizing.store(true);
    if (under_way.load() == 0) return;
    const int status = guard().status.load(std::memory_order_relaxed);
    abort_job(ended_text(status) + " while " +
                  collective_text(last_entered.load(std::memory_order_relaxed)) +
                  " was under way on another of its threads",
              status > 0 ? status : 1);
}

void exit_guard_run(bool exiting) {
    if (exiting) guard().exiting.store(true, std::memory_order_relaxed);
    bool at_door = false;  // no set-up yet: the door instead
    std::call_once(world_once, [&at_door] {
        at_door = true;
        door_at_exit(false);
    });
    state().world_set_up.store(true, std::memory_order_release);
    if (at_door) return;
    auto& g = guard();
    if (!g.ready.load(std::memory_order_acquire) || g.ran.exchange(true)) return;
    const int n = state().world_size, me = state().world_rank;
    const int status = g.status.load(std::memory_order_relaxed);
    slot(ended).store(ended_flag | (status >= 0 ? static_cast<std::uint64_t>(status) & status_mask
                                                : status_unknown),
                      std::memory_order_release);
    const std::uint64_t my_entered = slot(entered).load(std::memory_order_acquire);

    struct Peer {
        MPI_Request req = MPI_REQUEST_NULL;
        std::uint64_t buf[nslots] = {};
        bool ended = false;
    };
    std::vector<Peer> peers(static_cast<std::size_t>(n));
    peers[static_cast<std::size_t>(me)].ended = true;
    bool broken = false;
    for (;;) {
        bool all_ended = true;
        std::vector<std::pair<int, std::uint64_t>> stuck;
        for (int j = 0; j < n && !broken; ++j) {
            Peer& p = peers[static_cast<std::size_t>(j)];
            if (p.ended) continue;
            all_ended = false;
            if (std::uint64_t* q = g.local[static_cast<std::size_t>(j)]) {
                for (int i = nslots - 1; i >= 0; --i)  // ended first, entered last
                    p.buf[i] = std::atomic_ref<std::uint64_t>(q[i]).load(std::memory_order_acquire);
            } else if (!g.remote) {
                p.ended = true;  // cannot be watched: MPI_Finalize waits for it as before
                continue;
            } else if (p.req == MPI_REQUEST_NULL &&
                MPI_Rget(p.buf, nslots, MPI_UINT64_T, j, 0, nslots, MPI_UINT64_T, g.win, &p.req) !=
                    MPI_SUCCESS) {
                broken = true;
                break;
            }
            if (!g.local[static_cast<std::size_t>(j)]) {
                int done = 0;
                if (MPI_Test(&p.req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) broken = true;
                if (!done) continue;
            }
            if (p.buf[ended] != 0)
                p.ended = true;
            else if (p.buf[inside] > 0 && p.buf[entered] > my_entered)
                stuck.emplace_back(j, p.buf[last]);
        }
        if (!stuck.empty())
            abort_job(ended_text(status) + " while " + waiting_text(stuck), status > 0 ? status : 1);
        if (all_ended) finish_exit_undisturbed(status);
        if (all_ended || broken) break;
        const timespec nap{0, 200'000};
        ::nanosleep(&nap, nullptr);
    }
    for (auto& p : peers)
        if (p.req != MPI_REQUEST_NULL) MPI_Wait(&p.req, MPI_STATUS_IGNORE);
    g.ready.store(false, std::memory_order_release);
    if (g.remote) {
        MPI_Win_unlock_all(g.win);
        MPI_Win_free(&g.win);
    }
    if (g.node_win != MPI_WIN_NULL) MPI_Win_free(&g.node_win);
    if (g.node != MPI_COMM_NULL) MPI_Comm_free(&g.node);
}

void exit_guard_before_mpi() {
    std::call_once(world_once, [] { door_at_exit(true); });
    state().world_set_up.store(true, std::memory_order_release);
}

void exit_guard_unstarted(bool exiting) {
    int init = 0, fin = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    auto& s = state();
    if (!init || fin || s.ready) return;
    MPI_Comm_rank(MPI_COMM_WORLD, &s.world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &s.world_size);
    exit_guard_run(exiting);
}

}  // namespace mpiml::detail
