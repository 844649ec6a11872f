#include "core/config.hpp"
#include "core/profile_hooks.hpp"
#include "core/state.hpp"

#include <mpiml/error.hpp>
#include <mpiml/launch.hpp>
#include <mpiml/session.hpp>
#include <mpiml/stop.hpp>

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace mpiml {
namespace detail {
namespace {

constexpr const char* call_name = "mpiml::mpi_fork";

std::vector<std::string> environ_now() {
    std::vector<std::string> env;
    for (char** e = environ; e && *e; ++e) env.emplace_back(*e);
    return env;
}

// The environment as the program started: the kernel's copy, which setenv()
// leaves alone. environ, even when the library loads, can already hold an MPI
// singleton's variables (mpi4py imported first).
std::vector<std::string> exec_env() {
    std::ifstream in("/proc/self/environ", std::ios::binary);
    if (!in) return environ_now();
    std::vector<std::string> env;
    std::string kv;
    while (std::getline(in, kv, '\0'))
        if (!kv.empty()) env.push_back(kv);
    return env;
}

const std::vector<std::string> initial_env = exec_env();
// What the program had set when the library loaded (os.environ before import).
const std::vector<std::string> load_env = environ_now();

bool starts_with(const std::string& s, const char* p) { return s.rfind(p, 0) == 0; }

std::string env_name(const std::string& kv) { return kv.substr(0, kv.find('=')); }

// Started by a launcher: Open MPI, PMIx (Open MPI, Slurm), MPICH's Hydra and
// PMI-2 (Slurm) set these; an MPI singleton sets them too.
bool has_launch_var(const std::vector<std::string>& env) {
    for (const auto& e : env) {
        const auto n = env_name(e);
        if (n == "OMPI_COMM_WORLD_RANK" || n == "OMPI_COMM_WORLD_SIZE" || n == "PMIX_RANK" ||
            n == "PMI_RANK" || n == "PMI_SIZE")
            return true;
    }
    return false;
}

bool initial_env_was_launched() { return has_launch_var(initial_env); }

bool contains(const std::vector<std::string>& env, const std::string& kv) {
    return std::find(env.begin(), env.end(), kv) != env.end();
}

// Set by the user, not by an MPI runtime: in the environment the program
// started with, or set by the program before the library loaded unless an
// MPI runtime had started by then.
bool in_initial_env(const std::string& kv) {
    if (contains(initial_env, kv)) return true;
    return contains(load_env, kv) && !(has_launch_var(load_env) && !initial_env_was_launched());
}

// Variables an MPI runtime sets for its own processes. Passed on to a child
// launcher they make it believe it is itself an MPI process (Open MPI 4.1's
// mpirun then exits 1 without a word).
bool is_runtime_var(const std::string& kv) {
    const auto name = env_name(kv);
    if (starts_with(name, "OMPI_ALLOW_RUN_AS_ROOT")) return false;
    if (starts_with(name, "OMPI_MCA_"))  // user settings survive, runtime ones do not
        return !(in_initial_env(kv) && !initial_env_was_launched());
    static const char* prefixes[] = {"OMPI_", "PMIX_", "PMI_", "OPAL_", "ORTE_", "HYDI_",
                                     "MPI_LOCALNRANKS", "MPI_LOCALRANKID"};
    for (const char* p : prefixes)
        if (starts_with(name, p)) return true;
    return false;
}

bool is_executable(const std::string& path) {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

std::string find_in_path(const std::string& name) {
    if (name.find('/') != std::string::npos) return is_executable(name) ? name : "";
    const char* path = std::getenv("PATH");
    std::stringstream ss(path ? path : "/usr/local/bin:/usr/bin:/bin");
    std::string dir;
    while (std::getline(ss, dir, ':')) {
        const std::string cand = (dir.empty() ? "." : dir) + "/" + name;
        if (is_executable(cand)) return cand;
    }
    return "";
}

std::vector<char*> c_strings(std::vector<std::string>& v) {
    std::vector<char*> out;
    for (auto& s : v) out.push_back(s.data());
    out.push_back(nullptr);
    return out;
}

// Starts argv with env, its stderr (and stdout if asked) into the pipe's write
// end, which it closes here; returns posix_spawn's error (0: started, pid set).
int spawn_into(int fds[2], bool with_stdout, std::vector<std::string>& argv,
               std::vector<std::string>& env, pid_t& pid) {
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    if (with_stdout) posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 2);
    posix_spawn_file_actions_addclose(&fa, fds[0]);
    auto a = c_strings(argv);
    auto e = c_strings(env);
    const int rc = posix_spawn(&pid, a[0], &fa, nullptr, a.data(), e.data());
    posix_spawn_file_actions_destroy(&fa);
    ::close(fds[1]);
    return rc;
}

// Runs argv with env, returns stdout+stderr (for "--version").
std::string capture(std::vector<std::string> argv, std::vector<std::string> env) {
    int fds[2];
    if (::pipe(fds) != 0) return "";
    pid_t pid = 0;
    const int rc = spawn_into(fds, true, argv, env, pid);
    std::string out;
    if (rc == 0) {
        char buf[4096];
        ssize_t k;
        while ((k = ::read(fds[0], buf, sizeof buf)) > 0) out.append(buf, static_cast<std::size_t>(k));
        int status = 0;
        while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
        }
    }
    ::close(fds[0]);
    return out;
}

int available_cores() {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
    const unsigned n = std::thread::hardware_concurrency();
    return n ? static_cast<int>(n) : 1;
}

std::vector<std::string> own_argv() {
    std::ifstream f("/proc/self/cmdline", std::ios::binary);
    const std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    std::vector<std::string> args;
    std::size_t start = 0;
    while (start < all.size()) {
        const auto end = all.find('\0', start);
        args.push_back(all.substr(start, end - start));
        if (end == std::string::npos) break;
        start = end + 1;
    }
    return args;
}

std::string own_exe() {
    std::vector<char> buf(4096);
    const ssize_t n = ::readlink("/proc/self/exe", buf.data(), buf.size() - 1);
    if (n <= 0) fail(call_name, "cannot read /proc/self/exe: " + std::string(std::strerror(errno)));
    return std::string(buf.data(), static_cast<std::size_t>(n));
}

LauncherKind kind_of(const std::string& launcher, const std::vector<std::string>& env) {
    const std::string version = capture({launcher, "--version"}, env);
    if (version.find("Open MPI") != std::string::npos || version.find("OpenRTE") != std::string::npos)
        return LauncherKind::open_mpi;
    if (version.find("HYDRA") != std::string::npos || version.find("MPICH") != std::string::npos)
        return LauncherKind::mpich;
    if (version.rfind("slurm", 0) == 0) return LauncherKind::slurm;  // srun --version: "slurm 22.05.8"
    return LauncherKind::unknown;
}

// The MPI this program is linked against (callable before MPI_Init).
LauncherKind linked_kind() {
    char v[MPI_MAX_LIBRARY_VERSION_STRING] = {};
    int len = 0;
    if (MPI_Get_library_version(v, &len) != MPI_SUCCESS) return LauncherKind::unknown;
    const std::string s(v, static_cast<std::size_t>(len));
    if (s.find("Open MPI") != std::string::npos) return LauncherKind::open_mpi;
    if (s.find("MPICH") != std::string::npos) return LauncherKind::mpich;
    return LauncherKind::unknown;
}

const char* kind_name(LauncherKind k) {
    return k == LauncherKind::open_mpi ? "Open MPI"
           : k == LauncherKind::mpich  ? "MPICH"
           : k == LauncherKind::slurm  ? "Slurm"
                                       : "an unknown MPI";
}

}  // namespace

// One thread per rank for OpenMP, MKL and the BLAS libraries Debian can
// switch libblas.so.3 to (OpenBLAS, BLIS).
constexpr const char* thread_vars[] = {"OMP_NUM_THREADS",      "MKL_NUM_THREADS",
                                       "OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS",
                                       "BLIS_NUM_THREADS"};
constexpr const char* forked_vars[] = {"IN_MPI",               "OMP_NUM_THREADS",
                                       "MKL_NUM_THREADS",      "OPENBLAS_NUM_THREADS",
                                       "GOTO_NUM_THREADS",     "BLIS_NUM_THREADS"};

namespace {

// This process's environment without the MPI runtime's variables, with
// IN_MPI=1 and one thread per rank.
std::vector<std::string> forked_env() {
    std::vector<std::string> env;
    for (auto& kv : environ_now())
        if (!is_runtime_var(kv)) env.push_back(kv);
    for (const char* name : forked_vars)
        std::erase_if(env, [&](const std::string& kv) { return env_name(kv) == name; });
    env.emplace_back("IN_MPI=1");
    for (const char* name : thread_vars) env.push_back(std::string(name) + "=1");
    return env;
}

// The launcher MPIML_MPIRUN names, or else the one of the MPI this program
// is linked against: with several MPIs installed, `mpirun` may be another
// MPI's launcher, whose ranks would each start alone as rank 0 of 1 (an
// error, whichever chose it).
void choose_launcher(LaunchPlan& plan, const LaunchConfig& cfg) {
    if (!cfg.launcher.empty()) {
        plan.launcher = find_in_path(cfg.launcher);
        if (plan.launcher.empty())
            fail(call_name, "MPIML_MPIRUN='" + cfg.launcher + "' is not an executable file");
        plan.kind = kind_of(plan.launcher, plan.env);
        const LauncherKind linked = linked_kind();
        if (linked != LauncherKind::unknown &&
            (plan.kind == LauncherKind::open_mpi || plan.kind == LauncherKind::mpich) && plan.kind != linked)
            fail(call_name, "MPIML_MPIRUN='" + cfg.launcher + "' is " + kind_name(plan.kind) +
                                "'s launcher but this program is linked against " + kind_name(linked) +
                                " (its ranks would each run alone); set MPIML_MPIRUN to " + kind_name(linked) +
                                "'s launcher");
        return;
    }
    const LauncherKind linked = linked_kind();
    std::vector<const char*> names;
    if (linked == LauncherKind::open_mpi) names = {"mpirun.openmpi", "mpiexec.openmpi"};
    if (linked == LauncherKind::mpich) names = {"mpiexec.mpich", "mpirun.mpich", "mpiexec.hydra"};
    names.insert(names.end(), {"mpirun", "mpiexec"});
    std::string first;
    LauncherKind first_kind = LauncherKind::unknown;
    for (const char* name : names) {
        const std::string path = find_in_path(name);
        if (path.empty()) continue;
        const LauncherKind k = kind_of(path, plan.env);
        if (first.empty()) first = path, first_kind = k;
        if (linked == LauncherKind::unknown || k == linked) {
            plan.launcher = path;
            plan.kind = k;
            return;
        }
    }
    if (first.empty())
        fail(call_name,
             "no MPI launcher found (mpirun or mpiexec on PATH): install openmpi-bin or "
             "mpich, or set MPIML_MPIRUN to the launcher's path");
    if (first_kind != LauncherKind::unknown)
        fail(call_name, std::string("this program is linked against ") + kind_name(linked) +
                            " but the only launcher found, " + first + ", is " +
                            kind_name(first_kind) +
                            "'s (its ranks would each run alone); set MPIML_MPIRUN to " +
                            kind_name(linked) + "'s launcher");
    plan.launcher = first;
    plan.kind = first_kind;
}

// The launcher's own options for n ranks.
void launcher_options(LaunchPlan& plan, int n, bool bind_to_core, const LaunchConfig& cfg) {
    auto& a = plan.argv;
    const bool oversubscribed = n > available_cores();
    switch (plan.kind) {
        case LauncherKind::open_mpi:
            a.insert(a.end(), {"-np", std::to_string(n)});
            if (oversubscribed) a.emplace_back("--oversubscribe");
            if (::geteuid() == 0) a.emplace_back("--allow-run-as-root");
            if (bind_to_core)
                a.insert(a.end(), {"--bind-to", oversubscribed ? "core:overload-allowed" : "core"});
            for (const char* v : forked_vars) a.insert(a.end(), {"-x", v});
            break;
        case LauncherKind::mpich:
            a.insert(a.end(), {"-n", std::to_string(n)});
            if (bind_to_core) a.insert(a.end(), {"-bind-to", "core"});
            break;
        case LauncherKind::slurm: {  // srun inside an allocation (MPIML_MPIRUN=srun)
            a.insert(a.end(), {"-n", std::to_string(n)});
            // The PMI the linked MPI reads, unless SLURM_MPI_TYPE or
            // MPIML_MPIRUN_FLAGS choose one: srun's default is often none, and
            // each rank would then start alone.
            const bool chosen = std::getenv("SLURM_MPI_TYPE") != nullptr ||
                                std::any_of(cfg.extra_flags.begin(), cfg.extra_flags.end(),
                                            [](const std::string& f) { return f.rfind("--mpi", 0) == 0; });
            const LauncherKind linked = linked_kind();
            if (!chosen && linked != LauncherKind::unknown)
                a.emplace_back(linked == LauncherKind::mpich ? "--mpi=pmi2" : "--mpi=pmix");
            // As mpirun: a rank that fails ends the step (srun's default waits
            // for the others, which can wait forever for it).
            a.emplace_back("--kill-on-bad-exit=1");
            if (bind_to_core) a.emplace_back("--cpu-bind=cores");
            if (!cfg.hostfile.empty())
                fail(call_name, "MPIML_HOSTFILE does not apply to srun: the allocation gives the hosts");
            break;
        }
        case LauncherKind::unknown:
            a.insert(a.end(), {"-np", std::to_string(n)});
            break;
    }
    // MPIML_HOSTFILE: ranks go to the hosts it lists (Open MPI --hostfile, MPICH -f).
    if (!cfg.hostfile.empty())
        a.insert(a.end(), {plan.kind == LauncherKind::mpich ? "-f" : "--hostfile", cfg.hostfile});
    a.insert(a.end(), cfg.extra_flags.begin(), cfg.extra_flags.end());
}

std::string initial_value(const char* name) {
    for (const auto& e : initial_env)
        if (env_name(e) == name) return e.substr(e.find('=') + 1);
    return "";
}

// A task of a several-task srun step without MPI support (srun --mpi=none):
// nothing tells it from a program run by hand, yet every task would start its
// own n ranks, with a launcher that waits for the CPUs the step holds.
void refuse_bare_srun_task(int n) {
    const std::string tasks = initial_value("SLURM_STEP_NUM_TASKS");
    if (initial_value("SLURM_STEP_ID").empty() || std::atoi(tasks.c_str()) <= 1) return;
    fail(call_name, "task " + initial_value("SLURM_PROCID") + " of " + tasks +
                        " of an srun step without MPI support (no PMI or PMIx variables) would start " +
                        std::to_string(n) +
                        " ranks of its own: use srun --mpi=pmix (Open MPI) or --mpi=pmi2 (MPICH) "
                        "and leave n at 1, or start the program once, outside srun, in the allocation");
}

}  // namespace

LaunchPlan plan_program(int n, bool bind_to_core, const std::vector<std::string>& program) {
    if (n < 1) fail(call_name, "n must be at least 1, got " + std::to_string(n));
    if (program.empty()) fail(call_name, "no program to launch");
    refuse_bare_srun_task(n);
    const LaunchConfig cfg = read_launch_config(call_name);
    LaunchPlan plan;
    plan.env = forked_env();
    choose_launcher(plan, cfg);
    plan.argv.push_back(plan.launcher);
    launcher_options(plan, n, bind_to_core, cfg);
    plan.argv.insert(plan.argv.end(), program.begin(), program.end());
    return plan;
}

LaunchPlan plan_fork(int n, bool bind_to_core) {
    // The program itself, argv byte for byte.
    std::vector<std::string> program{own_exe()};
    const auto args = own_argv();
    program.insert(program.end(), args.begin() + (args.empty() ? 0 : 1), args.end());
    return plan_program(n, bind_to_core, program);
}

namespace {

volatile std::sig_atomic_t interrupted = 0;
volatile pid_t running_launcher = 0;
// Hydra's mpiexec ends the job on SIGUSR2 instead of handing it on: under
// Hydra the handler writes to this pipe, and the loop that waits for the
// launcher hands the signal to the ranks of this host itself.
volatile std::sig_atomic_t usr2_to_ranks = 0;
int usr2_pipe[2] = {-1, -1};
void on_signal(int sig, siginfo_t* info, void*) {
    // SIGTERM, SIGINT and SIGHUP end the job for good (no restart); SIGUSR1
    // (a report) and SIGUSR2 only pass through: mpirun and srun hand them to
    // the ranks. Ctrl-C and a hang-up from the terminal reach the launcher
    // by themselves (its process group); the same signals sent to this
    // process alone are passed on.
    const int saved_errno = errno;
    const bool from_terminal = info && info->si_code == SI_KERNEL;
    if (sig == SIGTERM || sig == SIGINT || sig == SIGHUP) interrupted = sig;
    if (sig == SIGUSR2 && usr2_to_ranks && usr2_pipe[1] >= 0) {
        [[maybe_unused]] const ssize_t w = ::write(usr2_pipe[1], "u", 1);
    } else if (running_launcher > 0 && !((sig == SIGINT || sig == SIGHUP) && from_terminal)) {
        ::kill(running_launcher, sig);
    }
    errno = saved_errno;
}

// The processes of this host that Hydra's proxies started under the launcher
// `launcher`: the ranks (a proxy's children, the program itself).
std::vector<pid_t> local_ranks_of(pid_t launcher) {
    struct Proc {
        pid_t ppid;
        bool proxy;
    };
    std::vector<std::pair<pid_t, Proc>> procs;
    if (DIR* d = ::opendir("/proc")) {
        while (const dirent* e = ::readdir(d)) {
            char* end = nullptr;
            const long pid = std::strtol(e->d_name, &end, 10);
            if (pid <= 0 || *end != '\0') continue;
            std::ifstream f(std::string("/proc/") + e->d_name + "/stat");
            std::string stat;
            if (!std::getline(f, stat)) continue;
            const auto open = stat.find('('), close = stat.rfind(')');
            if (open == std::string::npos || close == std::string::npos || close + 4 > stat.size()) continue;
            const std::string comm = stat.substr(open + 1, close - open - 1);
            const long ppid = std::strtol(stat.c_str() + close + 4, nullptr, 10);
            procs.push_back({static_cast<pid_t>(pid), {static_cast<pid_t>(ppid), comm == "hydra_pmi_proxy"}});
        }
        ::closedir(d);
    }
    auto find = [&](pid_t pid) -> const Proc* {
        for (const auto& [p, info] : procs)
            if (p == pid) return &info;
        return nullptr;
    };
    auto under_launcher = [&](pid_t pid) {
        for (int depth = 0; depth < 64 && pid > 1; ++depth) {
            if (pid == launcher) return true;
            const Proc* p = find(pid);
            if (!p) return false;
            pid = p->ppid;
        }
        return false;
    };
    std::vector<pid_t> ranks;
    for (const auto& [pid, info] : procs) {
        const Proc* parent = find(info.ppid);
        if (parent && parent->proxy && under_launcher(info.ppid)) ranks.push_back(pid);
    }
    return ranks;
}

void hand_usr2_to_local_ranks(pid_t launcher) {
    const auto ranks = local_ranks_of(launcher);
    for (const pid_t r : ranks) ::kill(r, SIGUSR2);
    if (ranks.empty())
        std::fprintf(stderr,
                     "[mpiml] SIGUSR2: no rank of this job runs on this host, and MPICH's mpiexec would end the "
                     "job on it: not passed on; send SIGUSR2 to a rank (for should_stop one rank is enough)\n");
}

// Under Hydra, from now on SIGUSR2 goes to this host's ranks (on_signal).
void hand_usr2_under(const LaunchPlan& plan) {
    if (plan.kind == LauncherKind::mpich && usr2_pipe[0] < 0 && ::pipe2(usr2_pipe, O_CLOEXEC | O_NONBLOCK) != 0)
        usr2_pipe[0] = usr2_pipe[1] = -1;
    usr2_to_ranks = plan.kind == LauncherKind::mpich && usr2_pipe[0] >= 0;
}

// True if SIGUSR2 arrived since the last call (drains the pipe).
bool usr2_arrived() {
    char drain[64];
    bool any = false;
    while (::read(usr2_pipe[0], drain, sizeof drain) > 0) any = true;
    return any;
}

// The launcher's wait status; meanwhile, under Hydra, SIGUSR2 goes to the ranks.
int wait_for_launcher(pid_t pid, const char* who) {
    int status = 0;
    for (;;) {
        const pid_t w = ::waitpid(pid, &status, usr2_to_ranks ? WNOHANG : 0);
        if (w == pid) break;
        if (w < 0 && errno != EINTR) {
            usr2_to_ranks = 0;
            running_launcher = 0;
            fail(who, std::string("waitpid: ") + std::strerror(errno));
        }
        if (w == 0) {
            pollfd pf{usr2_pipe[0], POLLIN, 0};
            if (::poll(&pf, 1, 200) > 0 && usr2_arrived()) hand_usr2_to_local_ranks(pid);
        }
    }
    usr2_to_ranks = 0;
    running_launcher = 0;
    return status;
}

constexpr int passed_signals[] = {SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2};

// The job's status, as a shell gives it. A job ended by SIGTERM, SIGINT or
// SIGHUP sent to this process is not a success, even where the launcher
// says 0 (Hydra's mpiexec after a SIGTERM): 128 + the signal.
int launcher_status(int status) {
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : WIFSIGNALED(status) ? 128 + WTERMSIG(status) : 1;
    return code == 0 && interrupted ? 128 + interrupted : code;
}

// While the launcher runs, this process passes the signals above on to it.
class PassSignals {
public:
    PassSignals() {
        struct sigaction sa {};
        sa.sa_sigaction = on_signal;
        sa.sa_flags = SA_SIGINFO | SA_RESTART;
        sigemptyset(&sa.sa_mask);
        for (std::size_t i = 0; i < std::size(passed_signals); ++i)
            ::sigaction(passed_signals[i], &sa, &old_[i]);
    }
    ~PassSignals() {
        for (std::size_t i = 0; i < std::size(passed_signals); ++i)
            ::sigaction(passed_signals[i], &old_[i], nullptr);
    }
    PassSignals(const PassSignals&) = delete;
    PassSignals& operator=(const PassSignals&) = delete;

private:
    struct sigaction old_[std::size(passed_signals)] {};
};

// Runs argv with env; the launcher's stderr passes through, and its lines
// that name a rank ending on a signal or a lost host are kept in `noticed`.
int spawn_and_wait(const LaunchPlan& plan, std::vector<std::string> argv, std::vector<std::string> env,
                   std::string& noticed) {
    hand_usr2_under(plan);
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) fail(call_name, std::string("pipe: ") + std::strerror(errno));
    pid_t pid = 0;
    const int rc = spawn_into(fds, false, argv, env, pid);
    running_launcher = rc == 0 ? pid : 0;
    if (rc == 0 && interrupted) ::kill(pid, interrupted);  // arrived while it started
    if (rc != 0) {
        ::close(fds[0]);
        usr2_to_ranks = 0;
        fail(call_name, "cannot start " + plan.launcher + ": " + std::strerror(rc));
    }
    std::string line;
    char buf[4096];
    ssize_t k;
    bool srun_noticed = false;
    auto keep = [&](const std::string& l) {
        // srun: "srun: error: h2: task 3: Killed", then one line for the tasks
        // the step ended because of it: the first names the cause.
        if (l.rfind("srun: error: ", 0) == 0 && l.find(": task") != std::string::npos) {
            if (!srun_noticed) noticed = l;
            srun_noticed = true;
            return;
        }
        const bool rank_line = l.find("rank") != std::string::npos || l.find("node") != std::string::npos;
        if (rank_line && (l.find("signal") != std::string::npos || l.find("lost") != std::string::npos ||
                          l.find("Killed") != std::string::npos))
            noticed = l;
    };
    for (;;) {
        pollfd pf[2] = {{fds[0], POLLIN, 0}, {usr2_to_ranks ? usr2_pipe[0] : -1, POLLIN, 0}};
        if (::poll(pf, 2, -1) < 0) {
            if (errno == EINTR) continue;
            break;
        }
        if ((pf[1].revents & POLLIN) && usr2_arrived()) hand_usr2_to_local_ranks(pid);
        if (!(pf[0].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        k = ::read(fds[0], buf, sizeof buf);
        if (k == 0) break;
        if (k < 0) {
            if (errno == EINTR) continue;
            break;
        }
        [[maybe_unused]] const ssize_t w = ::write(2, buf, static_cast<std::size_t>(k));
        for (ssize_t i = 0; i < k; ++i) {
            if (buf[i] == '\n') {
                keep(line);
                line.clear();
            } else if (line.size() < 1024) {
                line += buf[i];
            }
        }
    }
    keep(line);
    ::close(fds[0]);
    return launcher_status(wait_for_launcher(pid, call_name));
}

std::string first_line(const std::string& path) {
    std::ifstream f(path);
    std::string l;
    std::getline(f, l);
    return l;
}

std::string trim(std::string s) {
    const auto b = s.find_first_not_of(" \t");
    if (b == std::string::npos) return "";
    const auto e = s.find_last_not_of(" \t\r");
    return s.substr(b, e - b + 1);
}

}  // namespace

std::vector<HostSlots> read_hostfile(const std::string& path, const char* call) {
    std::ifstream f(path);
    if (!f) fail(call, "cannot read the hostfile " + path);
    std::vector<HostSlots> hosts;
    for (std::string line; std::getline(f, line);) {
        line = line.substr(0, line.find('#'));
        std::stringstream ss(line);
        std::string name;
        if (!(ss >> name)) continue;
        HostSlots h;
        if (const auto c = name.find(':'); c != std::string::npos) {  // MPICH: host:slots
            h.slots = std::atoi(name.c_str() + c + 1);
            name.resize(c);
        }
        for (std::string w; ss >> w;)
            if (w.rfind("slots=", 0) == 0) h.slots = std::atoi(w.c_str() + 6);
        if (h.slots < 1) fail(call, "hostfile " + path + ": host " + name + " has no slots");
        h.host = name;
        hosts.push_back(h);
    }
    if (hosts.empty()) fail(call, "the hostfile " + path + " lists no host");
    return hosts;
}

bool host_reachable(const LaunchPlan& plan, const std::string& host, double timeout) {
    std::vector<std::string> argv{plan.launcher};
    if (plan.kind == LauncherKind::mpich) {
        argv.insert(argv.end(), {"-hosts", host, "-n", "1"});
    } else if (plan.kind == LauncherKind::slurm) {
        argv.insert(argv.end(), {"-w", host, "-N", "1", "-n", "1"});
    } else {
        argv.insert(argv.end(), {"--host", host, "-np", "1"});
        if (::geteuid() == 0) argv.emplace_back("--allow-run-as-root");
    }
    argv.emplace_back("/bin/true");
    auto a = c_strings(argv);
    auto e = c_strings(const_cast<std::vector<std::string>&>(plan.env));
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    posix_spawnattr_t at;
    posix_spawnattr_init(&at);
    posix_spawnattr_setflags(&at, POSIX_SPAWN_SETPGROUP);  // its own group, to end it whole
    pid_t pid = 0;
    const int rc = posix_spawn(&pid, a[0], &fa, &at, a.data(), e.data());
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&at);
    if (rc != 0) return false;
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout);
    int status = 0;
    for (;;) {
        const pid_t w = ::waitpid(pid, &status, WNOHANG);
        if (w == pid) return WIFEXITED(status) && WEXITSTATUS(status) == 0;
        if (w < 0 && errno != EINTR) return false;
        if (std::chrono::steady_clock::now() > end) {
            ::kill(-pid, SIGKILL);
            while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
            }
            return false;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
}

int run_with_restarts(const LaunchPlan& initial, int restarts, double backoff, const char* who,
                      const std::function<bool(LaunchPlan&)>& before_restart) {
    LaunchPlan plan = initial;
    if (restarts < 0) fail(who, "restarts must be >= 0, got " + std::to_string(restarts));
    if (!(backoff >= 0) || backoff > 3600) fail(who, "backoff must be 0-3600 seconds");
    char dir[] = "/tmp/mpiml-run-XXXXXX";
    if (!::mkdtemp(dir)) fail(who, std::string("mkdtemp: ") + std::strerror(errno));
    const std::string record = std::string(dir) + "/abort-record";
    auto env_of = [&](const LaunchPlan& p) {
        std::vector<std::string> env;
        for (const auto& kv : p.env) {
            const auto name = env_name(kv);
            if (name != "MPIML_ATTEMPT" && name != "MPIML_ABORT_RECORD") env.push_back(kv);
        }
        env.push_back("MPIML_ABORT_RECORD=" + record);
        return env;
    };
    auto argv_of = [&](const LaunchPlan& p) {
        std::vector<std::string> argv = p.argv;
        if (p.kind == LauncherKind::open_mpi)  // to ranks on other hosts too
            argv.insert(argv.begin() + 1, {"-x", "MPIML_ATTEMPT", "-x", "MPIML_ABORT_RECORD"});
        return argv;
    };
    std::vector<std::string> env = env_of(plan), argv = argv_of(plan);
    // Ctrl-C, SIGTERM or SIGHUP ends the job for good: no restart after it.
    interrupted = 0;
    std::optional<PassSignals> passing(std::in_place);
    int code = 0;
    double wait = backoff;
    for (int attempt = 0;; ++attempt) {
        std::vector<std::string> e = env;
        e.push_back("MPIML_ATTEMPT=" + std::to_string(attempt));
        ::unlink(record.c_str());
        std::fflush(nullptr);
        std::string noticed;
        code = spawn_and_wait(plan, argv, e, noticed);
        if (code == 0) break;
        if (code == exit_stopped) {  // stopped on request (mpiml::should_stop): not a failure
            char line[160];
            std::snprintf(line, sizeof line,
                          "[mpiml] %s: the job stopped on request (status %d); no restart\n", who, code);
            [[maybe_unused]] const ssize_t w = ::write(2, line, std::strlen(line));
            break;
        }
        std::string why = first_line(record);
        if (why.empty()) why = trim(noticed);
        if (why.empty()) why = "no rank recorded why";
        const bool last = attempt >= restarts || interrupted;
        char head[160];
        std::snprintf(head, sizeof head, "[mpiml] %s: attempt %d of %d failed with status %d (", who,
                      attempt + 1, restarts + 1, code);
        std::string msg = head + why + ")";
        if (last) {
            msg += interrupted ? std::string("; interrupted by SIG") + ::sigabbrev_np(interrupted) +
                                     ", no restart\n"
                               : restarts > 0 ? "; no restarts left\n" : "\n";
        } else {
            char tail[64];
            std::snprintf(tail, sizeof tail, "; restarting in %.3g s\n", wait);
            msg += tail;
        }
        [[maybe_unused]] const ssize_t w = ::write(2, msg.data(), msg.size());
        if (last) break;
        std::this_thread::sleep_for(std::chrono::duration<double>(wait));
        wait *= 2;
        if (interrupted) break;
        if (before_restart) {
            if (!before_restart(plan)) break;
            env = env_of(plan);
            argv = argv_of(plan);
        }
    }
    passing.reset();
    ::unlink(record.c_str());
    ::rmdir(dir);
    return code;
}

bool started_by_launcher() { return launched_by_mpi_fork() || initial_env_was_launched(); }

int run_once(const LaunchPlan& plan, const char* who) {
    std::vector<std::string> args = plan.argv, vars = plan.env;
    auto argv = c_strings(args);
    auto envp = c_strings(vars);
    pid_t pid = 0;
    interrupted = 0;
    PassSignals passing;
    hand_usr2_under(plan);
    const int rc = posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), envp.data());
    if (rc != 0) {
        usr2_to_ranks = 0;
        fail(who, "cannot start " + plan.launcher + ": " + std::strerror(rc));
    }
    running_launcher = pid;
    if (interrupted) ::kill(pid, interrupted);  // arrived while it started
    return launcher_status(wait_for_launcher(pid, who));
}

}  // namespace detail

void mpi_fork(int n, bool bind_to_core) { mpi_fork(n, ForkOptions{bind_to_core, 0, 1.0}); }

void mpi_fork(int n, const ForkOptions& options) {
    if (n < 0) detail::fail("mpiml::mpi_fork", "n must be >= 0, got " + std::to_string(n));
    if (options.restarts < 0)
        detail::fail("mpiml::mpi_fork", "restarts must be >= 0, got " + std::to_string(options.restarts));
    if (n <= 1) return;
    if (detail::started_by_launcher()) return;
    auto plan = detail::plan_fork(n, options.bind_to_core);
    // The ranks write the profile; this process must not overwrite it at exit.
    detail::profile_discard();
    std::fflush(nullptr);
    if (options.restarts > 0)
        std::exit(detail::run_with_restarts(plan, options.restarts, options.backoff, "mpiml::mpi_fork"));
    std::exit(detail::run_once(plan, "mpiml::mpi_fork"));
}

int restart_attempt() {
    const auto& c = detail::env_config();
    return c.attempt + c.requeues;
}

}  // namespace mpiml
