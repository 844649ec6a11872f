#include "core/daemon_watch.hpp"

#include "core/local_ranks.hpp"
#include "core/state.hpp"

#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <optional>
#include <csignal>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>

namespace mpiml::detail {
namespace {

struct Watch {
    int owner;  // the process that started the thread (a forked child has none)
    int stop_fd;
    std::thread thread;
};
std::mutex watch_mutex;
Watch* watch = nullptr;  // leaked: a forked child must not touch the thread
bool started = false;

int open_pidfd(int pid) {
#ifdef SYS_pidfd_open
    return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
#else
    (void)pid;
    errno = ENOSYS;
    return -1;
#endif
}

void run(const LauncherDaemon& d, int stop_fd) {
    ::pthread_setname_np(::pthread_self(), "mpiml-launcher");
    // stderr may be a pipe that only the lost daemon read: no SIGPIPE here.
    sigset_t pipe;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
    const int pid_fd = open_pidfd(d.pid);
    // Checked after the open: the daemon may have ended (and its pid been
    // given to another process) since it was found.
    bool ended = (pid_fd < 0 && errno == ESRCH) || !is_ancestor(d.pid);
    while (!ended) {
        // With a pidfd (Linux 5.3) the wait costs nothing; else a look a second.
        pollfd fds[2] = {{stop_fd, POLLIN, 0}, {pid_fd, POLLIN, 0}};
        const int n = ::poll(fds, pid_fd >= 0 ? 2 : 1, pid_fd >= 0 ? -1 : 1000);
        if (n < 0 && errno != EINTR) break;
        if (n > 0 && fds[0].revents != 0) break;
        ended = pid_fd >= 0 ? n > 0 && fds[1].revents != 0 : !is_ancestor(d.pid);
    }
    if (pid_fd >= 0) ::close(pid_fd);
    if (ended)
        end_orphan("the launcher's process on this host (" + d.name + ", pid " + std::to_string(d.pid) +
                   ") has ended, and nothing else would end this rank");
}

}  // namespace

void start_daemon_watch() {
    std::lock_guard lock(watch_mutex);
    if (started) return;
    started = true;
    std::optional<LauncherDaemon> d = launcher_daemon();
    if (!d) return;
    const int stop_fd = ::eventfd(0, EFD_CLOEXEC);
    if (stop_fd < 0) return;
    try {
        watch = new Watch{static_cast<int>(::getpid()), stop_fd, std::thread(run, *d, stop_fd)};
    } catch (const std::system_error&) {  // no thread: no watch
        ::close(stop_fd);
    }
}

void stop_daemon_watch() {
    std::lock_guard lock(watch_mutex);
    if (!watch || watch->owner != static_cast<int>(::getpid())) return;
    const std::uint64_t one = 1;
    [[maybe_unused]] const ssize_t k = ::write(watch->stop_fd, &one, sizeof one);
    watch->thread.join();
    ::close(watch->stop_fd);
    delete watch;
    watch = nullptr;
}

}  // namespace mpiml::detail
