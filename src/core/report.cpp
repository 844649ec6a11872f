// Where every rank is. Each rank keeps a ring of its recent collectives and
// runs a small agent thread listening on a TCP port (addresses exchanged once,
// at initialization). A report is made by rank 0's agent: it asks every
// rank's agent for its section over TCP (no MPI: a late rank is busy outside
// MPI and a stuck one inside it, but their agents answer), adds its own, and
// prints the whole report at once on stderr and into MPIML_REPORT_DIR. A
// section has the rank's host, pid, the collective it is in, its history and
// its stacks: Python frames of every thread through the Python package's
// dumper, native frames of every thread captured by a signal sent to each
// thread (the handler only records return addresses), symbolized afterwards
// by the agent. Asked by a watchdog whose deadline passed (any rank, any
// host; rank 0 then ends the job once the report is out), by SIGUSR1 (mpirun
// forwards it to every rank), by mpiml::report, or by the mpiml-report
// command through the agent file each rank writes.
#include "core/report.hpp"

#include "core/config.hpp"
#include "core/state.hpp"
#include "core/arrival.hpp"

#include <mpiml/datatype.hpp>
#include <mpiml/error.hpp>
#include <mpiml/failure.hpp>

#include <arpa/inet.h>
#include <cxxabi.h>
#include <dirent.h>
#include <dlfcn.h>
#include <execinfo.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>
#include <type_traits>
#include <vector>

namespace mpiml::detail {
namespace {

using Clock = std::chrono::steady_clock;
// The history's clock: the coarse monotonic clock, a few ns to read (the
// precise one costs more than the rest of the record); it ticks every few ms.
std::int64_t coarse_ns() {
    timespec ts{};
    ::clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return std::int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}
std::int64_t coarse_tick_ns() {
    static const std::int64_t tick = [] {
        timespec ts{};
        ::clock_getres(CLOCK_MONOTONIC_COARSE, &ts);
        return std::max<std::int64_t>(1, std::int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec);
    }();
    return tick;
}
double seconds(Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
}

// ------------------------------------------------------------ call sites

thread_local CallSite this_site{};

// ------------------------------------------------------------ history

struct Entry {
    std::uint64_t token = 0;  // 0: empty
    std::uint64_t seq = 0;
    CallInfo info{};
    bool world = false;
    CallSite site{};
    std::int64_t t0 = 0, t1 = 0;  // coarse_ns; t1 == 0: in progress
};
constexpr std::size_t ring_size = 32;
constexpr std::size_t shown = 8;  // history lines a section shows

// The ring is written by every thread that enters a collective and read by
// the agent without a lock: each slot is a seqlock (its version is odd while
// it is written) over the entry's words, atomics so that a read racing a
// write is no data race, only a copy the version check throws away.
static_assert(std::is_trivially_copyable_v<Entry>);
constexpr std::size_t entry_words = (sizeof(Entry) + 7) / 8;
constexpr std::size_t t1_word = offsetof(Entry, t1) / 8;
static_assert(offsetof(Entry, t1) % 8 == 0);
struct Slot {
    std::atomic<std::uint64_t> version{0};  // 2 token + 1 while written, 2 token + 2 after
    std::atomic<std::uint64_t> words[entry_words]{};
};
struct History {
    std::atomic<std::uint64_t> next{1};
    Slot ring[ring_size];
};
History& history() {
    static auto* h = new History;  // never destroyed: read by the agent until exit
    return *h;
}

void store_entry(Slot& s, const Entry& e) {
    std::uint64_t w[entry_words] = {};
    std::memcpy(w, &e, sizeof e);
    s.version.store(2 * e.token + 1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
    for (std::size_t i = 0; i < entry_words; ++i) s.words[i].store(w[i], std::memory_order_relaxed);
    s.version.store(2 * e.token + 2, std::memory_order_release);
}

// A consistent copy of the slot's entry; false when empty or being written.
bool load_entry(const Slot& s, Entry& e) {
    const std::uint64_t v = s.version.load(std::memory_order_acquire);
    if (v == 0 || (v & 1)) return false;
    std::uint64_t w[entry_words];
    for (std::size_t i = 0; i < entry_words; ++i) w[i] = s.words[i].load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (s.version.load(std::memory_order_relaxed) != v) return false;
    std::memcpy(&e, w, sizeof e);
    return true;
}

std::string fmt_duration(double s) {
    char b[32];
    if (s < 1e-3)
        std::snprintf(b, sizeof b, "%.0f us", s * 1e6);
    else if (s < 1)
        std::snprintf(b, sizeof b, "%.1f ms", s * 1e3);
    else
        std::snprintf(b, sizeof b, "%.1f s", s);
    return b;
}

// A span of the coarse clock: below one tick, "< tick".
std::string fmt_span(std::int64_t ns) {
    const std::int64_t tick = coarse_tick_ns();
    return ns < tick ? "< " + fmt_duration(static_cast<double>(tick) * 1e-9)
                     : fmt_duration(static_cast<double>(ns) * 1e-9);
}

std::string entry_text(const Entry& e) {
    // (no type: an operation marked from outside the core, see ExitMark)
    std::string s = (e.info.type == MPI_DATATYPE_NULL ? std::string(kind_name(e.info.kind))
                                                      : describe(e.info)) + " #" + std::to_string(e.seq) + " (" + e.info.call + ", on " +
                    (e.world ? "MPI_COMM_WORLD" : "another communicator") + ")";
    const std::string at = site_text(e.site);
    if (!at.empty()) s += " at " + at;
    return s;
}

// ------------------------------------------------------------ native stacks

constexpr int max_frames = 48;
constexpr int max_threads = 256;
struct ThreadSlot {
    std::atomic<pid_t> tid{0};
    std::atomic<int> state{0};  // 1 asked, 2 answered
    int n = 0;
    unsigned long self = 0;  // pthread_self, as Python's dump names threads
    void* frames[max_frames];
};
ThreadSlot slots[max_threads];
std::atomic<int> nslots{0};
int capture_signal() { return SIGRTMIN + 4; }
std::atomic<bool> capture_ready{false};  // on_capture installed (its default action ends the process)

extern "C" void on_capture(int) {
    const int saved = errno;
    const auto me = static_cast<pid_t>(::syscall(SYS_gettid));
    const int n = nslots.load(std::memory_order_acquire);
    for (int i = 0; i < n; ++i) {
        ThreadSlot& s = slots[i];
        if (s.tid.load(std::memory_order_relaxed) != me || s.state.load() != 1) continue;
        s.n = ::backtrace(s.frames, max_frames);
        s.self = static_cast<unsigned long>(::pthread_self());
        s.state.store(2, std::memory_order_release);
        break;
    }
    errno = saved;
}

std::string read_small(const std::string& path) {
    std::ifstream f(path);
    std::string s;
    std::getline(f, s);
    return s;
}

bool system_object(const std::string& path) {
    return path.rfind("/usr/", 0) == 0 || path.rfind("/lib", 0) == 0;
}

std::string demangle(const char* name) {
    int status = 0;
    char* d = abi::__cxa_demangle(name, nullptr, nullptr, &status);
    std::string s = status == 0 && d ? d : name;
    std::free(d);
    return s;
}

struct Frame {
    void* pc;
    std::string object;
    // innermost first: the functions inlined at pc, then the one holding it
    std::vector<std::pair<std::string, std::string>> functions;  // name, file:line or ""
};

std::string clean_location(std::string loc) {
    if (auto k = loc.find(" (discriminator"); k != std::string::npos) loc.resize(k);
    if (loc.rfind("??", 0) == 0 || loc.ends_with(":?") || loc.ends_with(":0")) return "";
    return loc;
}

// addr2line for the frames of objects outside the system directories (the
// program and its own libraries): file:line and inlined functions.
void add_lines(std::vector<Frame>& frames, const std::vector<std::uintptr_t>& rel) {
    std::map<std::string, std::vector<std::size_t>> by_object;
    for (std::size_t i = 0; i < frames.size(); ++i)
        if (!frames[i].object.empty() && !system_object(frames[i].object) &&
            frames[i].object.find('\'') == std::string::npos)
            by_object[frames[i].object].push_back(i);
    if (by_object.empty() || ::access("/usr/bin/addr2line", X_OK) != 0) return;
    for (const auto& [object, idx] : by_object) {
        std::string cmd = "timeout 2 /usr/bin/addr2line -a -i -C -f -e '" + object + "'";
        for (std::size_t i : idx) {
            char a[32];
            std::snprintf(a, sizeof a, " 0x%zx", static_cast<std::size_t>(rel[i]));
            cmd += a;
        }
        cmd += " 2>/dev/null";
        FILE* p = ::popen(cmd.c_str(), "r");
        if (!p) return;
        // Per address: its "0x..." line, then (function, location) pairs.
        std::vector<std::string> lines;
        char buf[4096];
        while (std::fgets(buf, sizeof buf, p)) {
            std::string l = buf;
            while (!l.empty() && l.back() == '\n') l.pop_back();
            lines.push_back(std::move(l));
        }
        ::pclose(p);
        std::size_t k = 0, at = 0;
        while (at < lines.size() && k < idx.size()) {
            if (lines[at].rfind("0x", 0) != 0) {
                ++at;
                continue;
            }
            ++at;
            std::vector<std::pair<std::string, std::string>> fns;
            while (at < lines.size() && lines[at].rfind("0x", 0) != 0) {
                const std::string fn = lines[at];
                const std::string loc = at + 1 < lines.size() ? clean_location(lines[at + 1]) : "";
                at += 2;
                if (fn != "??") fns.emplace_back(fn, loc);
            }
            Frame& f = frames[idx[k++]];
            if (!fns.empty()) f.functions = std::move(fns);
        }
    }
}

// frames[skip..n) of a captured stack, one line each (and one per inlined call).
std::string symbolize(void* const* pcs, int n, int skip) {
    std::vector<Frame> frames;
    std::vector<std::uintptr_t> rel;
    char exe[4096];
    const ssize_t exe_len = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
    for (int i = skip; i < n; ++i) {
        Frame f{pcs[i], "", {}};
        // Return addresses point past the call: look up the call itself.
        // The first frame after the signal frame is the interrupted pc.
        const auto pc = reinterpret_cast<std::uintptr_t>(pcs[i]) - (i == skip ? 0 : 1);
        Dl_info info{};
        std::uintptr_t r = pc;
        if (::dladdr(reinterpret_cast<void*>(pc), &info) != 0) {
            if (info.dli_fname && info.dli_fname[0]) f.object = info.dli_fname;
            if (info.dli_sname) f.functions.emplace_back(demangle(info.dli_sname), "");
            if (info.dli_fbase) r = pc - reinterpret_cast<std::uintptr_t>(info.dli_fbase);
            if (f.object.find('/') == std::string::npos && exe_len > 0)  // the program, by argv[0]
                f.object.assign(exe, static_cast<std::size_t>(exe_len));
        }
        frames.push_back(std::move(f));
        rel.push_back(r);
    }
    add_lines(frames, rel);
    // A thread only in system libraries and mpiml's (MPI's progress threads,
    // mpiml's watchdog) is one line.
    const bool library_only = std::none_of(frames.begin(), frames.end(), [](const Frame& f) {
        const std::string base = f.object.substr(f.object.rfind('/') + 1);
        return !f.object.empty() && !system_object(f.object) && base.rfind("libmpiml", 0) != 0;
    });
    auto short_name = [](std::string fn) {
        if (fn.size() > 100) fn = fn.substr(0, 97) + "...";
        return fn;
    };
    if (library_only) {
        std::string top;
        int named = 0;
        for (const Frame& f : frames)
            if (!f.functions.empty() && named < 3)
                top += std::string(named++ ? " < " : " ") + short_name(f.functions.front().first);
        return " a library's thread," + (top.empty() ? std::string(" no symbols") : top) + "\n";
    }
    std::string out = "\n";
    int k = 0;
    for (const Frame& f : frames) {
        const std::string base = f.object.empty() ? "?" : f.object.substr(f.object.rfind('/') + 1);
        if (f.functions.empty()) {
            char pc[32];
            std::snprintf(pc, sizeof pc, "0x%zx", reinterpret_cast<std::size_t>(f.pc));
            out += "      #" + std::to_string(k++) + " " + pc + " (" + base + ")\n";
            continue;
        }
        for (std::size_t j = 0; j < f.functions.size(); ++j) {
            const auto& [fn, loc] = f.functions[j];
            const std::string where = loc.empty() ? "" : " at " + std::filesystem::path(loc).lexically_normal().string();
            out += "      #" + std::to_string(k++) + " " + short_name(fn) + where + " (" + base +
                   (j + 1 < f.functions.size() ? ", inlined" : "") + ")\n";
        }
        if (f.functions.back().first == "main") break;  // the C library's start-up below
    }
    return out;
}

std::atomic<void (*)(int fd)> python_stacks{nullptr};

std::string python_stacks_text() {
    const auto dump = python_stacks.load();
    if (!dump) return "";
    const int fd = ::memfd_create("mpiml-python-stacks", MFD_CLOEXEC);
    if (fd < 0) return "";
    dump(fd);
    std::string text;
    char buf[8192];
    ::lseek(fd, 0, SEEK_SET);
    for (ssize_t k; (k = ::read(fd, buf, sizeof buf)) > 0;) text.append(buf, static_cast<std::size_t>(k));
    ::close(fd);
    return text;
}

// Every thread's stack but the calling one's (the agent).
std::string stacks_text() {
    static std::mutex one_at_a_time;  // the thread slots
    std::lock_guard lock(one_at_a_time);
    std::string out;
    const std::string py = python_stacks_text();
    if (!py.empty()) {
        out += "    Python stacks:\n";
        std::istringstream in(py);
        for (std::string l; std::getline(in, l);)
            if (!l.empty()) out += "      " + l + "\n";
    }
    if (!capture_ready.load(std::memory_order_acquire)) return out;
    // Ask each thread for its native stack.
    const auto me = static_cast<pid_t>(::syscall(SYS_gettid));
    std::vector<pid_t> tids;
    if (DIR* d = ::opendir("/proc/self/task")) {
        while (dirent* e = ::readdir(d)) {
            const pid_t t = static_cast<pid_t>(std::atoi(e->d_name));
            if (t > 0 && t != me) tids.push_back(t);
        }
        ::closedir(d);
    }
    std::sort(tids.begin(), tids.end());
    if (tids.size() > static_cast<std::size_t>(max_threads)) tids.resize(max_threads);
    nslots.store(0, std::memory_order_release);
    for (std::size_t i = 0; i < tids.size(); ++i) {
        slots[i].tid.store(tids[i], std::memory_order_relaxed);
        slots[i].n = 0;
        slots[i].state.store(1, std::memory_order_relaxed);
    }
    nslots.store(static_cast<int>(tids.size()), std::memory_order_release);
    const pid_t pid = ::getpid();
    for (pid_t t : tids) ::syscall(SYS_tgkill, pid, t, capture_signal());
    const auto until = Clock::now() + std::chrono::milliseconds(500);
    for (;;) {
        bool all = true;
        for (std::size_t i = 0; i < tids.size(); ++i) all = all && slots[i].state.load() == 2;
        if (all || Clock::now() > until) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    std::string native;
    for (std::size_t i = 0; i < tids.size(); ++i) {
        ThreadSlot& s = slots[i];
        const bool answered = s.state.exchange(0) == 2;
        const std::string name =
            read_small("/proc/self/task/" + std::to_string(tids[i]) + "/comm");
        if (answered && !py.empty()) {
            // Threads running Python are in the Python stacks above.
            char id[32];
            std::snprintf(id, sizeof id, "0x%016lx", s.self);
            if (py.find(id) != std::string::npos) continue;
        }
        native += "      thread " + std::to_string(tids[i]) + " (" + name +
                  (tids[i] == pid ? ", main" : "") + "):";
        if (!answered) {
            native += " did not answer (the signal is blocked there)\n";
            continue;
        }
        // Skip on_capture and the kernel's signal return frame.
        native += symbolize(s.frames, s.n, 2);
    }
    nslots.store(0, std::memory_order_release);
    if (!native.empty())
        out += std::string(py.empty() ? "    native stacks:\n" : "    native threads:\n") + native;
    return out;
}

// ------------------------------------------------------------ the agent

struct Card {  // what every rank tells the others at set-up
    char host[64];
    std::uint32_t addr[4];  // IPv4, network order; 0: none
    std::uint16_t port;
    std::int32_t pid;
    std::uint64_t cookie;
};

struct Agent {
    std::once_flag once;
    std::atomic<bool> set_up{false};  // call_once's fast path touches TLS
    std::atomic<bool> ready{false};
    int listen_fd = -1;
    int pipe_r = -1, pipe_w = -1;  // SIGUSR1 and stop requests
    std::thread thread;
    std::vector<Card> cards;  // by world rank
    int rank = 0, size = 1;
    std::string agent_file;
    // rank 0: the last report, served again to requests that come while it was made
    std::string last_text;
    Clock::time_point last_done{};
    int reports = 0;
    Clock::time_point last_stall{};  // rank 0: the last stall report
};
Agent& agent() {
    static auto* a = new Agent;  // never destroyed (the thread reads it until exit)
    return *a;
}

std::string host_name() {
    char h[256] = {};
    if (::gethostname(h, sizeof h - 1) != 0) return "?";
    return h;
}

std::string section_head(int rank, int size, const std::string& host, int pid) {
    const std::string who = rank < 0 ? "? (before MPI started)" : std::to_string(rank) + "/" + std::to_string(size);
    return "==== rank " + who + "  host " + host + "  pid " + std::to_string(pid);
}

// This rank's section of the report.
std::string own_section() {
    const auto& s = state();
    const int rank = s.world_rank, size = s.world_size;
    std::vector<Entry> entries;
    for (const Slot& slot : history().ring) {
        Entry e;
        for (int attempt = 0; attempt < 100; ++attempt)
            if (load_entry(slot, e)) {
                entries.push_back(e);
                break;
            } else if (slot.version.load(std::memory_order_relaxed) == 0) {
                break;
            }
    }
    std::sort(entries.begin(), entries.end(),
              [](const Entry& a, const Entry& b) { return a.token < b.token; });
    const std::int64_t t = coarse_ns();
    std::string where;
    for (const Entry& e : entries)
        if (e.t1 == 0)
            where += std::string(where.empty() ? "in " : "; and in ") + entry_text(e) + " for " +
                     fmt_span(t - e.t0);
    if (where.empty()) {
        where = "not in a collective";
        if (!entries.empty())
            where += " (left the last one " + fmt_span(t - entries.back().t1) + " ago)";
    }
    std::string out = section_head(rank, size, host_name(), ::getpid()) + ": " + where + "\n";
    out += "    last collectives (oldest first):\n";
    if (entries.empty()) out += "      none\n";
    const std::size_t first = entries.size() > shown ? entries.size() - shown : 0;
    for (std::size_t i = first; i < entries.size(); ++i) {
        const Entry& e = entries[i];
        out += "      " + entry_text(e) + ": " +
               (e.t1 ? fmt_span(e.t1 - e.t0) : "in progress") + "\n";
    }
    out += stacks_text();
    return out;
}

// --- sockets

int wait_fd(int fd, short events, Clock::time_point until) {
    for (;;) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count();
        if (left <= 0) return 0;
        pollfd p{fd, events, 0};
        const int r = ::poll(&p, 1, static_cast<int>(left));
        if (r < 0 && errno == EINTR) continue;
        return r;
    }
}

bool send_all(int fd, const std::string& s, Clock::time_point until) {
    std::size_t done = 0;
    while (done < s.size()) {
        const ssize_t k = ::send(fd, s.data() + done, s.size() - done, MSG_NOSIGNAL);
        if (k > 0) {
            done += static_cast<std::size_t>(k);
            continue;
        }
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && wait_fd(fd, POLLOUT, until) > 0) continue;
        return false;
    }
    return true;
}

// Reads until EOF (or the first newline with line = true).
bool recv_until(int fd, std::string& out, Clock::time_point until, bool line) {
    char buf[8192];
    for (;;) {
        if (line && out.find('\n') != std::string::npos) return true;
        const ssize_t k = ::recv(fd, buf, line ? 1 : sizeof buf, 0);
        if (k > 0) {
            out.append(buf, static_cast<std::size_t>(k));
            continue;
        }
        if (k == 0) return !line;
        if (errno == EINTR) continue;
        if ((errno == EAGAIN || errno == EWOULDBLOCK) && wait_fd(fd, POLLIN, until) > 0) continue;
        return false;
    }
}

std::vector<std::uint32_t> addresses_of(const Card& c) {
    std::vector<std::uint32_t> a;
    if (std::strncmp(c.host, host_name().c_str(), sizeof c.host) == 0) a.push_back(htonl(INADDR_LOOPBACK));
    for (std::uint32_t x : c.addr)
        if (x) a.push_back(x);
    return a;
}

// A connected non-blocking socket to c's agent, or -1.
int connect_to(const Card& c, Clock::time_point until) {
    for (std::uint32_t addr : addresses_of(c)) {
        const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0) return -1;
        sockaddr_in sa{};
        sa.sin_family = AF_INET;
        sa.sin_port = htons(c.port);
        sa.sin_addr.s_addr = addr;
        const auto step = std::min(until, Clock::now() + std::chrono::milliseconds(1500));
        if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0) return fd;
        if (errno == EINPROGRESS && wait_fd(fd, POLLOUT, step) > 0) {
            int err = 0;
            socklen_t len = sizeof err;
            if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0) return fd;
        }
        ::close(fd);
    }
    return -1;
}

std::string cookie_hex(std::uint64_t c) {
    char b[24];
    std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(c));
    return b;
}

std::string one_line(std::string s) {
    for (char& ch : s)
        if (ch == '\n' || ch == '\r') ch = ' ';
    return s;
}

// Sends "REPORT <reason>" to rank 0's agent; with wait, returns its answer.
std::string ask_rank0(const std::vector<Card>& cards, const std::string& reason, bool wait,
                      double limit_s) {
    const auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                          std::chrono::duration<double>(limit_s));
    const int fd = connect_to(cards.at(0), until);
    if (fd < 0) return "";
    std::string answer;
    if (send_all(fd, cookie_hex(cards[0].cookie) + (wait ? " REPORT " : " NOTIFY ") + one_line(reason) + "\n",
                 until) &&
        wait)
        recv_until(fd, answer, until, false);
    ::close(fd);
    return answer;
}

std::string report_dir() {
    const std::string& d = env_config().report_dir;
    return d.empty() ? "mpiml-reports" : d;
}

void write_stderr(const std::string& s) {
    std::fflush(stderr);
    std::size_t done = 0;
    while (done < s.size()) {
        const ssize_t k = ::write(2, s.data() + done, s.size() - done);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return;
        done += static_cast<std::size_t>(k);
    }
}

// Rank 0: asks every rank for its section, prints and files the report
// (within budget_ms but for its own section's native frames).
std::string make_report(const std::string& reason, int budget_ms = 4000) {
    auto& a = agent();
    const auto start = Clock::now();
    const auto until = start + std::chrono::milliseconds(budget_ms);
    struct Peer {
        int fd = -1;
        std::string text;
        bool done = false;
    };
    std::vector<Peer> peers(static_cast<std::size_t>(a.size));
    const std::string ask = cookie_hex(a.cards[0].cookie) + " SECTION\n";
    for (int r = 1; r < a.size; ++r) {
        Peer& p = peers[static_cast<std::size_t>(r)];
        p.fd = connect_to(a.cards[static_cast<std::size_t>(r)],
                          start + std::chrono::milliseconds(std::min(1500, budget_ms / 2)));
        if (p.fd >= 0 && !send_all(p.fd, ask, until)) {
            ::close(p.fd);
            p.fd = -1;
        }
    }
    peers[0].text = own_section();
    peers[0].done = true;
    for (;;) {
        std::vector<pollfd> pf;
        std::vector<std::size_t> who;
        for (std::size_t r = 1; r < peers.size(); ++r)
            if (peers[r].fd >= 0 && !peers[r].done) {
                pf.push_back({peers[r].fd, POLLIN, 0});
                who.push_back(r);
            }
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count();
        if (pf.empty() || left <= 0) break;
        if (::poll(pf.data(), pf.size(), static_cast<int>(left)) < 0 && errno != EINTR) break;
        for (std::size_t i = 0; i < pf.size(); ++i) {
            if (!pf[i].revents) continue;
            Peer& p = peers[who[i]];
            char buf[16384];
            const ssize_t k = ::recv(p.fd, buf, sizeof buf, 0);
            if (k > 0)
                p.text.append(buf, static_cast<std::size_t>(k));
            else if (k == 0 || (errno != EAGAIN && errno != EINTR))
                p.done = true;
        }
    }
    const int n = ++a.reports;
    std::string path = report_dir();
    std::error_code ec;
    std::filesystem::create_directories(path, ec);
    path += "/report-" + std::string(a.cards[0].host) + "-" + std::to_string(a.cards[0].pid) + "-" +
            std::to_string(n) + ".txt";
    std::string body;
    for (int r = 0; r < a.size; ++r) {
        Peer& p = peers[static_cast<std::size_t>(r)];
        if (p.fd >= 0) ::close(p.fd);
        if (p.done && !p.text.empty()) {
            body += p.text;
            continue;
        }
        const Card& c = a.cards[static_cast<std::size_t>(r)];
        body += section_head(r, a.size, c.host, c.pid) + ": no answer within " +
                fmt_duration(seconds(start, until)) +
                (p.fd < 0 ? " (its agent cannot be reached)\n" : " (its agent did not finish)\n");
    }
    char head[64];
    std::snprintf(head, sizeof head, "%d", a.size);
    const std::string text = "[mpiml] report: where every rank is (" + std::string(head) +
                             " ranks) - " + reason + "\n" + body + "[mpiml] end of report (" +
                             fmt_duration(seconds(start, Clock::now())) + ", also in " + path + ")\n";
    if (FILE* f = std::fopen(path.c_str(), "w")) {
        std::fwrite(text.data(), 1, text.size(), f);
        std::fclose(f);
    }
    write_stderr(text);
    a.last_text = text;
    a.last_done = Clock::now();
    return text;
}

// Asker and rank 0 of a hang: "HANG <rank> <what>", answered "DONE" once the
// report and the asker's abort line are written.
constexpr int hang_gather_ms = 3300;                              // rank 0 gathers the sections
constexpr auto hang_answer = std::chrono::milliseconds(4200);     // an asker waits for DONE
constexpr auto hang_end = std::chrono::milliseconds(4800);        // then for the end, from its expiry
constexpr auto hang_end_after = std::chrono::milliseconds(1000);  // but at least this after DONE

// "[mpiml] rank R/N: <what><tail>" of a request "R <what>"; with the tail
// " - aborting the job" as failure.cpp prints it.
std::string rank_line(const std::string& hang_request, const char* tail = " - aborting the job") {
    const auto sp = hang_request.find(' ');
    return "[mpiml] rank " + hang_request.substr(0, sp) + "/" + std::to_string(agent().size) + ": " +
           (sp == std::string::npos ? std::string() : hang_request.substr(sp + 1)) + tail + "\n";
}

// Rank 0's agent, asked by a rank whose watchdog expired: that rank's line,
// one report, the abort line of every rank that asked meanwhile (their
// requests wait in the listen queue while the report is made), then this
// rank ends the job. The
// end comes from the rank that printed, so that the launcher has forwarded
// the whole report before it kills anyone.
[[noreturn]] void end_job_after_report(int fd, const std::string& first) {
    auto& a = agent();
    const auto sp = first.find(' ');
    // The first line comes before the gathering: a launcher that ends the job
    // meanwhile (a lost host) leaves at least which rank waited where.
    write_stderr(rank_line(first, " - gathering where every rank is"));
    make_report(sp == std::string::npos ? first : first.substr(sp + 1), hang_gather_ms);
    std::vector<int> askers{fd};
    std::string lines = rank_line(first);
    const std::string prefix = cookie_hex(a.cards[0].cookie) + " HANG ";
    const auto until = Clock::now() + std::chrono::milliseconds(100);
    while (wait_fd(a.listen_fd, POLLIN, until) > 0) {
        const int c = ::accept4(a.listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (c < 0) continue;
        std::string req;
        if (recv_until(c, req, until, true) && req.rfind(prefix, 0) == 0) {
            req.resize(req.find('\n'));
            lines += rank_line(req.substr(prefix.size()));
            askers.push_back(c);
        } else {
            ::close(c);  // a section or report request: the job ends anyway
        }
    }
    write_stderr(lines);
    for (int c : askers) send_all(c, "DONE\n", Clock::now() + std::chrono::milliseconds(200));
    abort_quietly(1);
}

// Rank 0: the report of a stall, at most one per MPIML_STALL_WARNING seconds
// (the ranks that wait for the same late rank all say so).
void stall_report(const std::string& reason) {
    auto& a = agent();
    const double limit = env_config().stall_warning;
    if (a.last_stall != Clock::time_point{} && seconds(a.last_stall, Clock::now()) < limit) return;
    make_report(reason);
    a.last_stall = Clock::now();
}

// MPIML_STALL_WARNING: each of this rank's collectives in progress for
// longer than the limit is said once, on a line of this rank's (for
// MPI_COMM_WORLD, of the node's lowest rank in it), and rank 0 prints the
// report of every rank; the job goes on. Time the process was
// stopped (SIGSTOP, Slurm's suspend: the agent's ticks come late) does not
// count.
class Stalls {
public:
    void tick() {
        const double limit = env_config().stall_warning;
        if (limit <= 0) return;
        const std::int64_t now = coarse_ns();
        // A tick 6 s late: stopped (this agent's own reports take at most 4 s).
        if (last_ && now - last_ > 6 * tick_ns) paused_ += now - last_ - tick_ns;
        last_ = now;
        std::vector<Seen> still;
        for (const Slot& slot : history().ring) {
            Entry e;
            if (!load_entry(slot, e) || e.t1 != 0) continue;
            auto it = std::find_if(seen_.begin(), seen_.end(), [&](const Seen& x) { return x.token == e.token; });
            Seen s = it != seen_.end() ? *it : Seen{e.token, paused_, false};
            const std::int64_t waited = now - e.t0 - (paused_ - s.paused_at);
            if (!s.warned && waited >= static_cast<std::int64_t>(limit * 1e9)) {
                s.warned = true;
                warn(e, waited);
            }
            still.push_back(s);
        }
        seen_ = std::move(still);
    }

    static constexpr std::int64_t tick_ns = 1'000'000'000;

private:
    struct Seen {
        std::uint64_t token;
        std::int64_t paused_at;
        bool warned;
    };

    void warn(const Entry& e, std::int64_t waited) {
        auto& a = agent();
        // One rank a node speaks for a world collective: its lowest that waits.
        if (e.world && !first_here_in(e.seq)) return;
        const std::string what = "stall: " + entry_text(e) + " has waited " + fmt_span(waited) +
                                 (e.world ? missing_ranks(e.seq, MPI_COMM_WORLD) : std::string());
        write_stderr("[mpiml] rank " + std::to_string(a.rank) + "/" + std::to_string(a.size) + ": " +
                     what + " - the job goes on (MPIML_TIMEOUT=s ends a hung job)\n");
        const std::string reason = "rank " + std::to_string(a.rank) + "/" + std::to_string(a.size) + ": " + what;
        if (a.rank == 0) {
            stall_report(reason);
        } else if (const int fd = connect_to(a.cards[0], Clock::now() + std::chrono::seconds(1)); fd >= 0) {
            send_all(fd, cookie_hex(a.cards[0].cookie) + " STALL " + one_line(reason) + "\n",
                     Clock::now() + std::chrono::seconds(1));
            ::close(fd);
        }
    }

    std::int64_t last_ = 0, paused_ = 0;
    std::vector<Seen> seen_;
};

void serve(int fd) {
    auto& a = agent();
    const auto until = Clock::now() + std::chrono::milliseconds(2000);
    std::string req;
    if (!recv_until(fd, req, until, true)) return;
    req.resize(req.find('\n'));
    const std::string cookie = cookie_hex(a.cards[0].cookie);
    if (req.compare(0, cookie.size() + 1, cookie + " ") != 0) return;  // not ours
    const std::string rest = req.substr(cookie.size() + 1);
    if (rest == "SECTION") {
        send_all(fd, own_section(), Clock::now() + std::chrono::milliseconds(3000));
        return;
    }
    if (a.rank == 0 && rest.rfind("HANG ", 0) == 0) end_job_after_report(fd, rest.substr(5));
    if (a.rank == 0 && rest.rfind("STALL ", 0) == 0) {
        stall_report(rest.substr(6));
        return;
    }
    const bool wait = rest.rfind("REPORT ", 0) == 0;
    if (a.rank != 0 || (!wait && rest.rfind("NOTIFY ", 0) != 0)) return;
    // Requests that came while the last report was being made get that one.
    std::string text = a.last_text;
    if (text.empty() || seconds(a.last_done, Clock::now()) > 2.0) text = make_report(rest.substr(7));
    if (wait) send_all(fd, text, Clock::now() + std::chrono::milliseconds(2000));
}

// SIGUSR1's handler before ours (MPICH's, or the program's): called after ours.
struct sigaction previous_usr1 {};

// Until the agent's handler replaces it: a rank started by a launcher (whose
// mpirun forwards SIGUSR1) is not ended by a report asked for early.
char early_line[160];
std::size_t early_len = 0;
std::atomic<bool> agent_handles_usr1{false};

extern "C" void on_early_usr1(int) {
    if (agent_handles_usr1.load(std::memory_order_relaxed)) return;
    const int saved = errno;
    [[maybe_unused]] const ssize_t k = ::write(2, early_line, early_len);
    errno = saved;
}

bool is_off(const char* v) {
    if (!v) return false;
    std::string s(v);
    for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s == "0" || s == "false" || s == "off" || s == "no";
}

__attribute__((constructor)) void install_early_usr1() {
    const char* rank = launcher_rank();
    if (!rank || is_off(std::getenv("MPIML_REPORT"))) return;
    struct sigaction old {};
    if (::sigaction(SIGUSR1, nullptr, &old) != 0 || (old.sa_flags & SA_SIGINFO) || old.sa_handler != SIG_DFL)
        return;  // the program's own, or inherited as ignored
    const int n = std::snprintf(early_line, sizeof early_line,
                                "[mpiml] rank %.16s (pid %d): SIGUSR1 before mpiml started MPI: no "
                                "report yet; the rank goes on\n",
                                rank, static_cast<int>(::getpid()));
    early_len = n > 0 ? std::min<std::size_t>(static_cast<std::size_t>(n), sizeof early_line - 1) : 0;
    struct sigaction sa {};
    sa.sa_handler = on_early_usr1;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    ::sigaction(SIGUSR1, &sa, nullptr);
}

void on_usr1(int sig, siginfo_t* info, void* context) {
    const int saved = errno;
    const char c = 'u';
    [[maybe_unused]] const ssize_t k = ::write(agent().pipe_w, &c, 1);
    errno = saved;
    const auto& p = previous_usr1;
    if (p.sa_flags & SA_SIGINFO) {
        if (p.sa_sigaction) p.sa_sigaction(sig, info, context);
    } else if (p.sa_handler != SIG_DFL && p.sa_handler != SIG_IGN) {
        p.sa_handler(sig);
    }
}

void agent_loop() {
    auto& a = agent();
    Stalls stalls;
    const int wait_ms = env_config().stall_warning > 0 ? static_cast<int>(Stalls::tick_ns / 1'000'000) : -1;
    for (;;) {
        pollfd p[2] = {{a.listen_fd, POLLIN, 0}, {a.pipe_r, POLLIN, 0}};
        const int r = ::poll(p, 2, wait_ms);
        if (r < 0) {
            if (errno == EINTR) continue;
            return;
        }
        stalls.tick();
        if (p[1].revents) {
            char c = 0;
            if (::read(a.pipe_r, &c, 1) == 1 && c == 'q') return;
            if (c == 'u') {
                const std::string why = "SIGUSR1 (on demand; the job goes on)";
                if (a.rank == 0) {
                    if (a.last_text.empty() || seconds(a.last_done, Clock::now()) > 2.0) make_report(why);
                } else {
                    ask_rank0(a.cards, why, false, 1.0);
                }
            }
        }
        if (p[0].revents) {
            const int fd = ::accept4(a.listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
            if (fd >= 0) {
                serve(fd);
                ::close(fd);
            }
        }
    }
}

std::string agent_dir() {
    const char* t = std::getenv("TMPDIR");
    return std::string(t && *t ? t : "/tmp") + "/mpiml-agents-" + std::to_string(::getuid());
}

void stop_agent() {
    auto& a = agent();
    if (!a.ready.exchange(false)) return;
    const char q = 'q';
    [[maybe_unused]] const ssize_t k = ::write(a.pipe_w, &q, 1);
    if (a.thread.joinable()) a.thread.join();
    if (!a.agent_file.empty()) ::unlink(a.agent_file.c_str());
}

Card my_card(std::uint16_t port, std::uint64_t cookie) {
    Card c{};
    std::snprintf(c.host, sizeof c.host, "%s", host_name().c_str());
    c.port = port;
    c.pid = ::getpid();
    c.cookie = cookie;
    ifaddrs* list = nullptr;
    int k = 0;
    if (::getifaddrs(&list) == 0) {
        for (ifaddrs* i = list; i && k < 4; i = i->ifa_next) {
            if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
            const auto x = reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr;
            if (x == htonl(INADDR_LOOPBACK)) continue;
            c.addr[k++] = x;
        }
        ::freeifaddrs(list);
    }
    return c;
}

}  // namespace

// ------------------------------------------------------------ public pieces

SiteMark::SiteMark(const CallSite& site) noexcept {
    if (this_site.file || !site.file) return;
    this_site = site;
    set_ = true;
}

SiteMark::~SiteMark() {
    if (set_) this_site = CallSite{};
}

CallSite current_site() noexcept { return this_site; }

void set_python_stacks(void (*fn)(int fd)) { python_stacks = fn; }

std::string site_text(const CallSite& site) {
    if (!site.file) return "";
    std::string s = std::string(site.file) + ":" + std::to_string(site.line);
    if (site.function && site.function[0]) s += std::string(" in ") + site.function;
    return s;
}

std::uint64_t history_enter(const CallInfo& info, std::uint64_t seq) {
    auto& h = history();
    const std::uint64_t token = h.next.fetch_add(1, std::memory_order_relaxed);
    store_entry(h.ring[token % ring_size],
                Entry{token, seq, info, info.comm == MPI_COMM_WORLD, this_site, coarse_ns(), 0});
    return token;
}

void history_leave(std::uint64_t token) {
    if (token == 0) return;  // none
    // Unless the slot went to a newer entry since (32 collectives entered meanwhile).
    Slot& s = history().ring[token % ring_size];
    if (s.version.load(std::memory_order_acquire) == 2 * token + 2)
        s.words[t1_word].store(static_cast<std::uint64_t>(std::max<std::int64_t>(1, coarse_ns())),
                               std::memory_order_relaxed);
}

void report_setup() {
    auto& a = agent();
    if (a.set_up.load(std::memory_order_acquire)) return;
    std::call_once(a.once, [&a] {
        const auto& s = state();
        const auto& cfg = env_config();
        const bool on = !cfg.report || *cfg.report;
        a.rank = s.world_rank;
        a.size = s.world_size;
        // Collective from here: every rank takes part, an agent or not.
        int fd = on ? ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0) : -1;
        std::uint16_t port = 0;
        if (fd >= 0) {
            sockaddr_in sa{};
            sa.sin_family = AF_INET;
            sa.sin_addr.s_addr = htonl(INADDR_ANY);
            socklen_t len = sizeof sa;
            if (::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0 && ::listen(fd, SOMAXCONN) == 0 &&
                ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) == 0) {
                port = ntohs(sa.sin_port);
            } else {
                ::close(fd);
                fd = -1;
            }
        }
        std::random_device rd;
        const std::uint64_t cookie = (std::uint64_t{rd()} << 32) ^ rd();
        const Card mine = my_card(port, cookie);
        a.cards.resize(static_cast<std::size_t>(a.size));
        int ok = fd >= 0, all_ok = 0;
        if (MPI_Allgather(&mine, sizeof(Card), MPI_BYTE, a.cards.data(), sizeof(Card), MPI_BYTE,
                          MPI_COMM_WORLD) != MPI_SUCCESS ||
            MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD) != MPI_SUCCESS)
            all_ok = 0;
        // The capture signal, and backtrace's first call (it loads libgcc) done here:
        // a rank's own section (agent or not) asks every thread for its stack.
        void* warm[2];
        ::backtrace(warm, 2);
        struct sigaction sa {};
        sa.sa_handler = on_capture;
        sigemptyset(&sa.sa_mask);
        sa.sa_flags = SA_RESTART;
        ::sigaction(capture_signal(), &sa, nullptr);
        capture_ready.store(true, std::memory_order_release);
        if (!all_ok) {
            if (fd >= 0) ::close(fd);
            return;  // reports hold this rank's section only
        }
        a.listen_fd = fd;
        int p[2];
        if (::pipe2(p, O_CLOEXEC | O_NONBLOCK) != 0) return;
        a.pipe_r = p[0];
        a.pipe_w = p[1];
        // SIGUSR1, then whatever handled it before (MPICH has a handler of its own).
        struct sigaction usr1 {};
        usr1.sa_sigaction = on_usr1;
        sigemptyset(&usr1.sa_mask);
        usr1.sa_flags = SA_RESTART | SA_SIGINFO;
        ::sigaction(SIGUSR1, &usr1, &previous_usr1);
        agent_handles_usr1.store(true, std::memory_order_relaxed);
        if (!(previous_usr1.sa_flags & SA_SIGINFO) && previous_usr1.sa_handler == on_early_usr1)
            previous_usr1.sa_handler = SIG_DFL;  // not chained: ours from load time
        // The agent file: mpiml-report finds rank 0's agent through any rank's pid.
        const std::string dir = agent_dir();
        ::mkdir(dir.c_str(), 0700);
        if (DIR* d = ::opendir(dir.c_str())) {  // files of processes gone
            while (dirent* e = ::readdir(d)) {
                const int p = std::atoi(e->d_name);
                if (p > 0 && ::kill(p, 0) != 0 && errno == ESRCH) ::unlinkat(::dirfd(d), e->d_name, 0);
            }
            ::closedir(d);
        }
        a.agent_file = dir + "/" + std::to_string(::getpid());
        if (FILE* f = std::fopen(a.agent_file.c_str(), "w")) {
            ::fchmod(::fileno(f), 0600);
            const Card& c0 = a.cards[0];
            std::fprintf(f, "%d %d %s %u %016llx", a.rank, a.size, c0.host, c0.port,
                         static_cast<unsigned long long>(c0.cookie));
            for (std::uint32_t x : c0.addr)
                if (x) std::fprintf(f, " %u", x);
            std::fprintf(f, "\n");
            std::fclose(f);
        } else {
            a.agent_file.clear();
        }
        a.thread = std::thread([] {
            ::pthread_setname_np(::pthread_self(), "mpiml-report");
            agent_loop();
        });
        a.ready.store(true, std::memory_order_release);
        register_finalize_hook(stop_agent);
    });
    a.set_up.store(true, std::memory_order_release);
}

void end_on_hang(const std::string& what) {
    auto& a = agent();
    const auto start = Clock::now();
    bool reached = false;
    if (a.ready.load(std::memory_order_acquire)) {
        const int fd = connect_to(a.cards[0], start + std::chrono::milliseconds(1500));
        reached = fd >= 0;
        std::string answer;
        const std::string ask = cookie_hex(a.cards[0].cookie) + " HANG " + std::to_string(a.rank) + " " +
                                one_line(what) + "\n";
        if (reached && send_all(fd, ask, start + hang_answer) &&
            recv_until(fd, answer, start + hang_answer, true) && answer.rfind("DONE\n", 0) == 0) {
            // Rank 0 printed the report and this rank's line, and ends the job.
            // Its kill reaches the other hosts within about a second.
            record_abort_line(what);
            std::this_thread::sleep_until(std::max(start + hang_end, Clock::now() + hang_end_after));
            abort_quietly(1);  // rank 0's end did not come: this rank's
        }
        if (fd >= 0) ::close(fd);
    }
    // Rank 0 cannot be reached (or no agent): this rank's own section. Rank 0
    // reached but not done in time: only the abort line (the report may be
    // on its way; a section of this rank now would cut through it).
    if (!reached)
        write_stderr("[mpiml] report of this rank only (" +
                     std::string(a.ready ? "rank 0 cannot be reached" : "no report agent") + ") - " +
                     what + "\n" + own_section());
    abort_job(what, 1);
}

std::string request_report_of(int pid, const std::string& reason) {
    const std::string dir = agent_dir();
    // pid itself, or the first of its descendants with an agent file.
    std::vector<int> todo{pid};
    std::string file;
    for (std::size_t i = 0; i < todo.size() && file.empty() && i < 4096; ++i) {
        const std::string f = dir + "/" + std::to_string(todo[i]);
        if (::access(f.c_str(), R_OK) == 0 && ::kill(todo[i], 0) == 0) {
            file = f;
            break;
        }
        std::ifstream children("/proc/" + std::to_string(todo[i]) + "/task/" +
                               std::to_string(todo[i]) + "/children");
        for (int c; children >> c;) todo.push_back(c);
    }
    if (file.empty())
        fail("mpiml-report", "no mpiml rank is process " + std::to_string(pid) +
                                 " or one of its descendants (no agent file in " + dir + ")");
    std::ifstream in(file);
    int rank = 0, size = 0;
    unsigned port = 0;
    std::string cookie;
    Card c0{};
    std::string host;
    in >> rank >> size >> host >> port >> cookie;
    if (!in) fail("mpiml-report", "cannot read " + file);
    std::snprintf(c0.host, sizeof c0.host, "%s", host.c_str());
    c0.port = static_cast<std::uint16_t>(port);
    c0.cookie = std::strtoull(cookie.c_str(), nullptr, 16);
    int k = 0;
    for (std::uint32_t x; k < 4 && in >> x;) c0.addr[k++] = x;
    const std::string text = ask_rank0({c0}, reason, true, 8.0);
    if (text.empty())
        fail("mpiml-report", "rank 0's agent (host " + host + ", port " + std::to_string(port) +
                                 ") did not answer");
    return text;
}

}  // namespace mpiml::detail

namespace mpiml {

std::string report(std::string_view reason) {
    auto& a = detail::agent();
    const std::string why(reason);
    if (a.ready.load(std::memory_order_acquire)) {
        std::string text = detail::ask_rank0(a.cards, why, true, 4.5);
        if (!text.empty()) return text;
    }
    // No agent (or rank 0 cannot be reached): this rank's own section.
    const std::string text = "[mpiml] report of this rank only (" +
                             std::string(a.ready ? "rank 0 did not answer" : "no report agent") +
                             ") - " + why + "\n" + detail::own_section();
    detail::write_stderr(text);
    return text;
}

}  // namespace mpiml
