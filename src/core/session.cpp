#include "core/config.hpp"
#include "core/daemon_watch.hpp"
#include "core/exit_guard.hpp"
#include "core/local_ranks.hpp"
#include "core/profile_hooks.hpp"
#include "core/report.hpp"
#include "core/state.hpp"

#include <mpiml/collectives.hpp>
#include <mpiml/error.hpp>
#include <mpiml/failure.hpp>
#include <mpiml/session.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include <unistd.h>

namespace mpiml {
namespace detail {

State& state() {
    static State s;
    return s;
}

namespace {

std::mutex init_mutex;
int self_keyval = MPI_KEYVAL_INVALID;

std::vector<void (*)()>& finalize_hooks() {
    // Never destroyed: the hooks run inside MPI_Finalize, which may be called
    // from atexit after function-local statics have been destroyed.
    static auto* hooks = new std::vector<void (*)()>;
    return *hooks;
}

// MPI_Finalize deletes MPI_COMM_SELF's attributes first: run our cleanup
// there, whoever calls MPI_Finalize.
int on_self_delete(MPI_Comm, int, void*, void*) {
    exit_check_other_threads();  // when MPI_Finalize was not called through mpiml
    exit_guard_run();  // first: the hooks below may be collective
    stop_daemon_watch();
    auto& hooks = finalize_hooks();
    for (auto it = hooks.rbegin(); it != hooks.rend(); ++it) (*it)();
    hooks.clear();
    state().ready = false;
    return MPI_SUCCESS;
}

void atexit_finalize() { mpiml::finalize(); }

// Open MPI between hosts: large messages by the send protocol, not TCP's
// emulated put, unless the job chose (mpirun --mca btl_tcp_flags sets this
// variable). Over the one connection to each peer, put moved messages that
// cross at half the link's rate (BENCHMARKS.md, overlap). A second
// connection (btl_tcp_links 2) is no cure: Open MPI 4.1 then holds back the
// acknowledgement of a synchronous send that came in over it, and the sender
// can wait forever (docs/CLUSTER.md).
void prefer_tcp_send() {
#ifdef OPEN_MPI
    setenv("OMPI_MCA_btl_tcp_flags", "send,inplace,need-ack,need-csum,hetero-rdma", /*overwrite=*/0);
#endif
}
// Open MPI 4.1 with two TCP links or more can hang a job (docs/CLUSTER.md):
// rank 0 says so once when the job asked for them (mpirun --mca sets this
// variable). Not through MPI_T: its init took 0.2 s.
void warn_tcp_links(int rank) {
#if defined(OPEN_MPI) && OMPI_MAJOR_VERSION <= 4
    const char* v = std::getenv("OMPI_MCA_btl_tcp_links");
    if (rank != 0 || v == nullptr) return;
    const unsigned long links = std::strtoul(v, nullptr, 10);
    if (links > 1)
        std::fprintf(stderr,
                     "[mpiml] rank 0: btl_tcp_links %lu: Open MPI 4.1 can hang a synchronous send (and "
                     "MPI_Barrier) between hosts with more than one TCP link; use 1 (docs/CLUSTER.md)\n",
                     links);
#else
    (void)rank;
#endif
}

// Seconds in the variable `name` before MPI starts (validated after): 0 when
// malformed or not positive, `unset` when unset or empty.
double seconds_before_init(const char* name, double unset) {
    const char* v = std::getenv(name);
    if (!v || !*v) return unset;
    char* end = nullptr;
    const double t = std::strtod(v, &end);
    return end && *end == '\0' && std::isfinite(t) && t > 0 ? t : 0;
}

// The deadline of MPI_Init: the timeout (MPIML_TIMEOUT is validated after),
// at least 10 s (starting MPI takes longer than a small collective).
double timeout_before_init(const SessionOptions& opts) {
    constexpr double at_least = 10;
    const double t = opts.timeout ? *opts.timeout : seconds_before_init("MPIML_TIMEOUT", 0);
    return t > 0 ? std::max(t, at_least) : 0;
}

// " (rank 3 of the launcher)", or "": who waits, before MPI can say.
std::string rank_of_launcher() {
    const char* v = launcher_rank();
    return v ? std::string(" (rank ") + v + " of the launcher)" : std::string();
}
std::string launcher_rank_text() { return rank_of_launcher() + "; a rank may have ended before it started MPI"; }

// MPIML_STALL_WARNING, 60 s unless set; at most 1e7 s (116 days): a longer
// wait would overflow the clock.
double stall_before_init() { return std::min(seconds_before_init("MPIML_STALL_WARNING", 60), 1e7); }

// While MPI_Init waits for every rank: a rank of this host that has ended
// ends the job (MPI_Init would wait for it forever; the launchers do not end
// it when the status is 0, nor Hydra at all), and past `stall` seconds (0:
// never) the rank says once that it still waits, as nothing else ends that
// wait without a timeout.
class InitWait {
public:
    // The environment is read here: MPI_Init may change it while the thread runs.
    InitWait(double stall, std::string where)
        : ranks_(LocalRanks::find()),
          rank_text_(rank_of_launcher()),
          thread_([this, stall, where = std::move(where)] { run(stall, where); }) {}
    ~InitWait() {
        {
            std::lock_guard lock(m_);
            done_ = true;
        }
        cv_.notify_all();
        thread_.join();
    }
    InitWait(const InitWait&) = delete;
    InitWait& operator=(const InitWait&) = delete;

private:
    using Clock = std::chrono::steady_clock;
    // A rank missing this long has ended (not merely not yet started).
    static constexpr std::chrono::seconds missing_for{2};
    static constexpr std::chrono::milliseconds every{500};

    void run(double stall, const std::string& where) {
        const auto t0 = Clock::now();
        const auto warn_at = t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(stall));
        bool warned = stall <= 0;
        std::optional<Clock::time_point> missing_since;
        std::unique_lock lock(m_);
        while (!done_) {
            if (ranks_) {
                lock.unlock();
                std::optional<std::string> gone = ranks_->gone();
                const auto now = Clock::now();
                if (!gone)
                    missing_since.reset();
                else if (!missing_since)
                    missing_since = now;
                else if (now - *missing_since >= missing_for)
                    abort_job(*gone + " on this host ended before it started MPI, and MPI_Init_thread" +
                              rank_text_ + " would wait for it forever");
                lock.lock();
            } else if (warned) {
                cv_.wait(lock, [this] { return done_; });
                return;
            }
            auto next = ranks_ ? Clock::now() + every : warn_at;
            if (!warned) next = std::min(next, warn_at);
            if (cv_.wait_until(lock, next, [this] { return done_; })) return;
            if (!warned && Clock::now() >= warn_at) {
                warned = true;
                char head[96];
                std::snprintf(head, sizeof head, "[mpiml] stall: MPI_Init_thread has waited %.1f s", stall);
                const std::string line = head + where + " - the job goes on (MPIML_TIMEOUT=s ends a hung job)\n";
                [[maybe_unused]] const ssize_t k = ::write(2, line.data(), line.size());
            }
        }
    }
    std::optional<LocalRanks> ranks_;
    std::string rank_text_;
    std::mutex m_;
    std::condition_variable cv_;
    bool done_ = false;
    std::thread thread_;  // last: starts once the rest is built
};

}  // namespace

// A rank that ends before it started MPI leaves the ranks that start it in
// MPI_Init, which waits for every rank; only some launchers end such a job,
// and only a rank of the same host sees the end (InitWait). So the rank
// starts MPI on its way out, at most `stall` seconds, and meets the others
// at the door that follows MPI_Init (exit_guard_before_mpi): the job ends at
// once, naming it, unless every rank ends this way.
void join_mpi_at_exit(int status) {
    if (!other_mpi_library().empty()) return;  // this process's MPI is another's
    const double stall = stall_before_init();
    const double wait = stall > 0 ? stall : 60;
    static std::atomic<bool> joined{false};
    try {
        std::thread([wait, status, rank = launcher_rank()] {
            const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(wait);
            while (!joined.load() && std::chrono::steady_clock::now() < until) {
                const timespec nap{0, 100'000'000};
                ::nanosleep(&nap, nullptr);
            }
            if (joined.load()) return;
            char line[200];
            const int n = std::snprintf(line, sizeof line,
                                        "[mpiml] rank %.16s (pid %d): ended before it started MPI, and the "
                                        "other ranks did not start it within %.0f s - ending without them\n",
                                        rank ? rank : "?", static_cast<int>(::getpid()), wait);
            if (n > 0) [[maybe_unused]] const ssize_t k = ::write(2, line, std::min<std::size_t>(n, sizeof line - 1));
            // The launcher ends the job now (this rank began to start MPI);
            // not a success, whatever the rank's own status (Hydra's would be).
            ::_exit(status != 0 ? status : 1);
        }).detach();
    } catch (const std::system_error&) {
        return;  // no thread, no bound on the wait: end as before
    }
    prefer_tcp_send();
    int provided = 0;
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) return;
    joined.store(true);
    auto& s = state();
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &s.world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &s.world_size);
    if (const char* record = std::getenv("MPIML_ABORT_RECORD"); record && *record) set_abort_record(record);
    set_exit_status(status);
    exit_guard_before_mpi();
    MPI_Finalize();
}

namespace {
struct ForeignInit {
    std::optional<DoorWatch> watch;
    std::optional<InitWait> wait;
};
std::mutex foreign_init_mutex;
std::optional<ForeignInit> foreign_init;
}  // namespace

// Another library's MPI_Init (mpi4py's import) is watched as mpiml's own.
void begin_foreign_init() {
    std::lock_guard lock(foreign_init_mutex);
    int flag = 0;
    MPI_Initialized(&flag);
    if (flag || foreign_init || launcher_size() <= 1 || !other_mpi_library().empty()) return;
    start_daemon_watch();
    auto& w = foreign_init.emplace();
    const double timeout = timeout_before_init(SessionOptions{});
    if (timeout > 0) w.watch.emplace("MPI_Init_thread", timeout, launcher_rank_text());
    try {
        w.wait.emplace(timeout > 0 ? 0 : stall_before_init(), launcher_rank_text());
    } catch (const std::system_error&) {  // no thread: MPI starts as before
    }
}

void end_foreign_init() {
    std::lock_guard lock(foreign_init_mutex);
    foreign_init.reset();
}

namespace {

// Registered after atexit_finalize, so it runs first and the guard knows the status.
void record_exit_status(int status, void*) { set_exit_status(status); }

void initialize(int* argc, char*** argv, const SessionOptions& opts, const char* call = "mpiml") {
    std::lock_guard lock(init_mutex);
    auto& s = state();
    if (s.ready) return;
    check_one_mpi_library(call);  // before any call into MPI
    int flag = 0;
    MPI_Finalized(&flag);
    if (flag) fail(call, "MPI has been finalized; no mpiml call may follow MPI_Finalize");
    start_daemon_watch();  // before MPI_Init, which waits for the launcher too
    MPI_Initialized(&flag);
    if (!flag) {
        prefer_tcp_send();
        // A rank that ends before it starts MPI leaves the others in
        // MPI_Init: InitWait ends the job when that rank ran on this host,
        // the watchdog (with a timeout) in any case.
        std::optional<DoorWatch> init_watch;
        std::optional<InitWait> init_wait;
        const double timeout = timeout_before_init(opts);
        if (timeout > 0) init_watch.emplace("MPI_Init_thread", timeout, launcher_rank_text());
        try {
            init_wait.emplace(timeout > 0 ? 0 : stall_before_init(), launcher_rank_text());
        } catch (const std::system_error&) {  // no thread: MPI starts as before
        }
        check_mpi(MPI_Init_thread(argc, argv, opts.thread_level, &s.provided), "MPI_Init_thread");
        s.we_initialized = true;
        std::atexit(atexit_finalize);
        ::on_exit(record_exit_status, nullptr);
    } else {
        MPI_Query_thread(&s.provided);
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &s.world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &s.world_size);
    warn_tcp_links(s.world_rank);
    check_mpi(MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, on_self_delete, &self_keyval, nullptr),
              "MPI_Comm_create_keyval");
    check_mpi(MPI_Comm_set_attr(MPI_COMM_SELF, self_keyval, nullptr), "MPI_Comm_set_attr");
    read_environment(s);
    if (opts.timeout) s.timeout = *opts.timeout;
    if (opts.check) s.check = *opts.check;
    s.abort_on_failure = opts.abort_on_failure;
    if (s.abort_on_failure) install_failure_handlers();
    inject_setup();
    // Set up with MPI_Init, which every rank calls; when another library
    // initialized MPI, on the first collective that spans every rank.
    if (s.we_initialized) world_setup_at_init();
    s.ready = true;
    profile_from_environment();
}

}  // namespace

void register_finalize_hook(void (*fn)()) { finalize_hooks().push_back(fn); }

void read_environment(State& s) {
#ifndef NDEBUG
    s.check = true;
#endif
    load_env_config();  // every MPIML_* variable, validated
    const EnvConfig& c = env_config();
    if (c.check) s.check = *c.check;
    if (c.timeout) s.timeout = *c.timeout;
    set_abort_record(c.abort_record);
}

}  // namespace detail

using detail::state;

MPI_Comm Comm::get(const char* call) const {
    ensure_initialized(call);
    if (!set_) return state().default_comm;
    if (comm_ == MPI_COMM_NULL) detail::fail(call, "communicator is MPI_COMM_NULL");
    int inter = 0;
    if (MPI_Comm_test_inter(comm_, &inter) == MPI_SUCCESS && inter)
        detail::fail(call, "inter-communicators are not supported (use an intra-communicator, e.g. "
                           "MPI_Intercomm_merge)");
    return comm_;
}

void ensure_initialized(const char* call) {
    if (state().ready) return;
    detail::initialize(nullptr, nullptr, SessionOptions{}, call);
}

Session::Session(SessionOptions opts) { start(nullptr, nullptr, opts); }

Session::Session(int& argc, char**& argv, SessionOptions opts) { start(&argc, &argv, opts); }

void Session::start(int* argc, char*** argv, const SessionOptions& opts) {
    auto& s = state();
    const bool started_before = s.we_initialized;
    if (s.ready) {
        // Started before (an earlier mpiml call): what only start-up sets cannot change.
        const auto late = [&](const std::string& what) {
            detail::fail("mpiml::Session", what + "; mpiml started MPI at an earlier call: make the "
                                                  "Session before any other mpiml call");
        };
        if (opts.thread_level > s.provided)
            late("asks for MPI thread level " + std::to_string(opts.thread_level) +
                 ", but MPI runs at level " + std::to_string(s.provided));
        if (opts.abort_on_failure != s.abort_on_failure)
            late(std::string("asks for abort_on_failure = ") + (opts.abort_on_failure ? "true" : "false") +
                 ", but it is " + (s.abort_on_failure ? "true" : "false"));
    } else {
        detail::initialize(argc, argv, opts, "mpiml::Session");
    }
    owns_ = !started_before && s.we_initialized;  // this Session started MPI
    if (opts.timeout) set_timeout(*opts.timeout);
    if (opts.check) s.check = *opts.check;
    previous_comm_ = s.default_comm;
    if (opts.comm != MPI_COMM_NULL) s.default_comm = Comm(opts.comm).get("mpiml::Session");
}

Session::~Session() {
    state().default_comm = previous_comm_;
    if (std::uncaught_exceptions() > 0 && is_initialized() && !is_finalized())
        abort_job("exception escaped while an mpiml::Session was alive");
    if (owns_) finalize();
}

MPI_Comm Session::comm() const { return Comm{}.get(); }
int Session::rank() const { return proc_id(); }
int Session::size() const { return num_procs(); }
int Session::thread_level() const { return state().provided; }

void finalize() {
    auto& s = state();
    if (!s.we_initialized || is_finalized() || !is_initialized()) return;
    detail::exit_check_other_threads();
    MPI_Finalize();
    s.ready = false;
}

bool is_initialized() {
    int flag = 0;
    MPI_Initialized(&flag);
    return flag != 0;
}

bool is_finalized() {
    int flag = 0;
    MPI_Finalized(&flag);
    return flag != 0;
}

int proc_id(Comm comm) {
    int r = 0;
    detail::check_mpi(MPI_Comm_rank(comm.get("mpiml::proc_id"), &r), "mpiml::proc_id");
    return r;
}

int num_procs(Comm comm) {
    int n = 0;
    detail::check_mpi(MPI_Comm_size(comm.get("mpiml::num_procs"), &n), "mpiml::num_procs");
    return n;
}

void set_timeout(double seconds) {
    if (!std::isfinite(seconds) || seconds < 0)
        detail::fail("mpiml::set_timeout", "timeout must be a finite number of seconds >= 0, got " +
                                               std::to_string(seconds));
    ensure_initialized();
    state().timeout = seconds;
}

double timeout() {
    ensure_initialized();
    return state().timeout;
}

void set_check(bool on) {
    ensure_initialized();
    state().check = on;
}

bool check_enabled() {
    ensure_initialized();
    return state().check;
}

int run(int argc, char** argv, const std::function<int(int, char**)>& fn) {
    Session session(argc, argv);
    int rc = 0;
    try {
        rc = fn(argc, argv);
    } catch (...) {
        abort_job(detail::current_exception_text(), 1);
    }
    detail::set_exit_status(rc);  // the Session ends (and MPI with it) before main returns rc
    return rc;
}

}  // namespace mpiml
