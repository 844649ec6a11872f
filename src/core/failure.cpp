// Abort on failure: print one clear line, then MPI_Abort the whole job.
#include "core/config.hpp"
#include "core/local_ranks.hpp"
#include "core/profile_hooks.hpp"
#include "core/state.hpp"

#include <mpiml/failure.hpp>

#include <cxxabi.h>
#include <execinfo.h>
#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <exception>
#include <algorithm>
#include <atomic>
#include <mutex>
#include <string>
#include <typeinfo>

namespace mpiml {
namespace {

void write_all(const char* s, std::size_t n) {
    while (n > 0) {
        const ssize_t k = ::write(2, s, n);
        if (k <= 0) return;
        s += k;
        n -= static_cast<std::size_t>(k);
    }
}

// Formats "[mpiml] rank R/N: " without allocating (signal handlers use it).
std::size_t format_prefix(char* buf, std::size_t cap) {
    const auto& s = detail::state();
    if (s.world_rank >= 0)
        return static_cast<std::size_t>(
            std::snprintf(buf, cap, "[mpiml] rank %d/%d: ", s.world_rank, s.world_size));
    return static_cast<std::size_t>(std::snprintf(buf, cap, "[mpiml] rank ?: "));
}

// MPIML_ABORT_RECORD and this host, kept where a signal handler can read them.
char record_path[1024];
char host_name[256];

// Appends "rank R/N host H: <what>" to the abort record, for a restarting
// launcher to say what failed (async-signal-safe).
void record_abort(const char* what, std::size_t n) {
    if (!record_path[0]) return;
    const int fd = ::open(record_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) return;
    char buf[1024];
    const auto& s = detail::state();
    int k = std::snprintf(buf, sizeof buf, "rank %d/%d host %s: ", s.world_rank, s.world_size,
                          host_name[0] ? host_name : "?");
    if (k < 0) k = 0;
    std::size_t len = std::min(static_cast<std::size_t>(k), sizeof buf - 1);
    const std::size_t m = std::min(n, sizeof buf - 1 - len);
    std::memcpy(buf + len, what, m);
    len += m;
    if (len == 0 || buf[len - 1] != '\n') {
        if (len == sizeof buf - 1) --len;
        buf[len++] = '\n';
    }
    [[maybe_unused]] const ssize_t w = ::write(fd, buf, len);
    ::close(fd);
}

void print_backtrace() {
    void* frames[48];
    const int n = ::backtrace(frames, 48);
    if (n > 0) {
        static const char head[] = "[mpiml] backtrace:\n";
        write_all(head, sizeof head - 1);
        ::backtrace_symbols_fd(frames, n, 2);
    }
}

[[noreturn]] void abort_mpi(int code) {
    int up = 0, down = 0;
    MPI_Initialized(&up);
    MPI_Finalized(&down);
    if (up && !down) {
        // Give the launcher time to forward what this rank and its peers just
        // wrote: MPICH's Hydra drops output still in its pipes once a rank aborts.
        const timespec pause{0, 200'000'000};
        ::nanosleep(&pause, nullptr);
        MPI_Abort(MPI_COMM_WORLD, code);
    }
    ::_exit(code);
}


void print_line(std::string_view what, const char* end) {
    char prefix[64];
    const std::size_t n = format_prefix(prefix, sizeof prefix);
    std::string line(prefix, std::min(n, sizeof prefix - 1));
    line.append(what);
    line += end;
    std::fflush(stdout);
    write_all(line.data(), line.size());
    record_abort(what.data(), what.size());
}
void print_abort_line(std::string_view what) { print_line(what, " - aborting the job\n"); }

void on_terminate() {
    static std::once_flag once;
    std::call_once(once, [] {
        // The line first: once a peer aborts, the launcher may kill this
        // process before a long backtrace is out.
        print_abort_line(detail::current_exception_text());
        print_backtrace();
        detail::profile_write_own();
        abort_mpi(1);
    });
    ::_exit(1);
}

const char* signal_name(int sig) {
    switch (sig) {
        case SIGSEGV: return "SIGSEGV (segmentation fault)";
        case SIGBUS: return "SIGBUS (bus error)";
        case SIGFPE: return "SIGFPE (arithmetic exception)";
        case SIGILL: return "SIGILL (illegal instruction)";
        case SIGABRT: return "SIGABRT (abort)";
        default: return "fatal signal";
    }
}

void on_signal(int sig) {
    char buf[256];
    std::size_t n = format_prefix(buf, sizeof buf);
    n += static_cast<std::size_t>(std::snprintf(buf + n, sizeof buf - n,
                                                "fatal signal %s - aborting the job\n",
                                                signal_name(sig)));
    write_all(buf, std::min(n, sizeof buf - 1));
    char what[96];
    const int m = std::snprintf(what, sizeof what, "fatal signal %s", signal_name(sig));
    if (m > 0) record_abort(what, std::min(static_cast<std::size_t>(m), sizeof what - 1));
    print_backtrace();
    abort_mpi(128 + sig);
}

constexpr int fatal_signals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};

// SIGPIPE: a write to a pipe or socket whose reader has gone. From MPI's
// transport to a peer that has ended it would end this rank silently, before
// the watchdog could say which peer is missing; there the write fails with
// EPIPE instead, as under Python (which ignores SIGPIPE). A broken stdout or
// stderr still ends the rank as by default (`program | head`).
void on_broken_pipe(int) {
    const int saved = errno;
    pollfd fds[2] = {{1, POLLOUT, 0}, {2, POLLOUT, 0}};
    if (::poll(fds, 2, 0) > 0 &&
        ((fds[0].revents | fds[1].revents) & (POLLERR | POLLHUP)) != 0) {
        struct sigaction dfl {};
        dfl.sa_handler = SIG_DFL;
        sigemptyset(&dfl.sa_mask);
        ::sigaction(SIGPIPE, &dfl, nullptr);
        ::raise(SIGPIPE);  // blocked in this handler: delivered as it returns
    }
    errno = saved;
}

// Whether this process is the one the launcher started, not a process a rank
// started (multiprocessing's spawn, a subprocess), which inherits the
// launcher's variables: the first process of a rank to load mpiml marks them
// in MPIML_RANK_PROCESS, for its children, with the pid of the launcher's
// daemon above it. A job launched from a rank (mpi_fork, mpiml-run, a
// subprocess) has new values or, under Hydra, whose variables may repeat
// (PMI_RANK, PMI_FD), a daemon of its own, so its ranks are not mistaken.
bool rank_process = false;
pid_t loaded_in = 0;  // a child forked from the rank: another pid
constexpr const char* rank_mark_var = "MPIML_RANK_PROCESS";
std::string launch_identity() {
    std::string id;
    for (const char* name : {"OMPI_COMM_WORLD_RANK", "OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE", "PMIX_RANK",
                             "PMI_RANK", "PMI_FD", "PMI_PORT", "PMI_ID", "SLURM_JOB_ID", "SLURM_STEP_ID",
                             "SLURM_PROCID"}) {
        const char* v = std::getenv(name);
        id += v ? v : "";
        id += ';';
    }
    return id;
}
// Marked by another process of this rank: the same variables, and no other
// daemon above this process (an unknown one, too deep or unreadable, is no
// evidence: a rank's child as before).
bool marked_by_this_rank(const std::string& mark, const std::string& id, const std::string& daemon) {
    if (mark.size() < id.size() || mark.compare(0, id.size(), id) != 0) return false;
    const std::string marked_daemon = mark.substr(id.size());
    return marked_daemon.empty() || daemon.empty() || marked_daemon == daemon;
}

// The shared libraries' destructors have run (MPI's among them): MPI cannot
// start any more.
std::atomic<bool> unloading{false};
std::atomic<bool> exit_handled{false};

// A rank that ends before it started MPI: with a non-zero status it says so
// (Open MPI's mpirun ends the job but does not always name the rank). Then
// it joins the ranks that start MPI (join_mpi_at_exit), unless Open MPI's
// mpirun ends the job anyway (a non-zero status). Once, however often the
// handler was registered.
void exit_before_mpi(int status, void*) {
    int started = 0;
    if (!rank_process || ::getpid() != loaded_in || MPI_Initialized(&started) != MPI_SUCCESS || started)
        return;
    const char* rank = detail::launcher_rank(/*with_slurm=*/false);
    if (!rank || exit_handled.exchange(true)) return;
    if (status != 0) {
        char line[200];
        const int n = std::snprintf(line, sizeof line,
                                    "[mpiml] rank %.16s (pid %d): exited with status %d before it started MPI\n",
                                    rank, static_cast<int>(::getpid()), status);
        if (n > 0) write_all(line, std::min(static_cast<std::size_t>(n), sizeof line - 1));
    }
    const bool mpirun_ends_it = status != 0 && std::getenv("OMPI_COMM_WORLD_RANK");
    if (detail::launcher_size() != 1 && !mpirun_ends_it && !unloading.load()) detail::join_mpi_at_exit(status);
}
__attribute__((constructor)) void watch_at_load() {
    loaded_in = ::getpid();
    if (detail::launcher_rank(/*with_slurm=*/false)) {
        const std::string id = launch_identity();
        const std::optional<detail::LauncherDaemon> d = detail::launcher_daemon();
        const std::string daemon = d ? std::to_string(d->pid) : "";
        const char* mark = std::getenv(rank_mark_var);
        rank_process = !mark || !marked_by_this_rank(mark, id, daemon);
        if (rank_process) ::setenv(rank_mark_var, (id + daemon).c_str(), 1);
    }
    detail::watch_exit_before_mpi();
}
__attribute__((destructor)) void mark_unloading() { unloading.store(true); }

}  // namespace

namespace detail {
int watch_exit_before_mpi() noexcept {
    // A few registrations at most: the library's, the program's, a module's.
    static std::atomic<int> registered{0};
    if (registered.fetch_add(1) < 8) ::on_exit(exit_before_mpi, nullptr);
    return 0;
}

std::string current_exception_text() {
    std::string type = "unknown type";
    if (const std::type_info* t = abi::__cxa_current_exception_type()) {
        int status = 0;
        char* d = abi::__cxa_demangle(t->name(), nullptr, nullptr, &status);
        type = status == 0 && d ? d : t->name();
        std::free(d);
    }
    try {
        if (auto e = std::current_exception()) std::rethrow_exception(e);
        return "std::terminate called without an active exception";
    } catch (const std::exception& e) {
        return "uncaught exception (" + type + "): " + e.what();
    } catch (...) {
        return "uncaught exception (" + type + ")";
    }
}

void set_abort_record(const std::string& path) {
    std::snprintf(record_path, sizeof record_path, "%s", path.c_str());
    if (::gethostname(host_name, sizeof host_name - 1) != 0) host_name[0] = '\0';
}
void record_abort_line(std::string_view what) { record_abort(what.data(), what.size()); }
void abort_quietly(int code) {
    profile_write_own();
    abort_mpi(code == 0 ? 1 : code);
}
void end_orphan(std::string_view what) {
    print_line(what, " - ending this rank\n");
    profile_write_own();
    ::_exit(1);
}
}  // namespace detail

void install_failure_handlers() {
    static std::once_flag once;
    std::call_once(once, [] {
        std::set_terminate(on_terminate);
        // An alternate stack, so that a stack overflow can still be reported.
        static char alt_stack[64 * 1024];
        stack_t ss{};
        ss.ss_sp = alt_stack;
        ss.ss_size = sizeof alt_stack;
        ::sigaltstack(&ss, nullptr);
        struct sigaction sa {};
        sa.sa_handler = on_signal;
        sigemptyset(&sa.sa_mask);
        sa.sa_flags = SA_ONSTACK | SA_RESETHAND;
        for (int sig : fatal_signals) ::sigaction(sig, &sa, nullptr);
        // Only where nothing chose a disposition (Python ignores SIGPIPE).
        struct sigaction old {};
        if (::sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL &&
            (old.sa_flags & SA_SIGINFO) == 0) {
            struct sigaction pipe {};
            pipe.sa_handler = on_broken_pipe;
            sigemptyset(&pipe.sa_mask);
            pipe.sa_flags = SA_RESTART;
            ::sigaction(SIGPIPE, &pipe, nullptr);
        }
    });
}

void abort_job(std::string_view what, int code) {
    print_abort_line(what);
    detail::profile_write_own();
    abort_mpi(code == 0 ? 1 : code);
}

}  // namespace mpiml
