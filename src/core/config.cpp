#include "core/config.hpp"

#include <mpiml/error.hpp>

#include <cctype>
#include <cerrno>
#include <cstdint>
#include <optional>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <sstream>
#include <string>

#include <unistd.h>

namespace mpiml::detail {
namespace {

// Shared-memory defaults (see BENCHMARKS.md, "Shared-memory fast path"). On
// one node the shared-memory allreduce beat MPI_Allreduce at every size when
// both ranks had their cores (1.1-1.4x below 512 B); under heavy load it lost
// by up to ~10% at 128-256 B: no allreduce threshold.
constexpr std::size_t kDefaultAllreduceThreshold = 0;
constexpr std::size_t kDefaultBroadcastThreshold = 0;
constexpr std::size_t kDefaultChunk = std::size_t{1} << 20;
constexpr std::size_t kMinChunk = 4096;
constexpr std::size_t kMaxChunk = std::size_t{256} << 20;
constexpr std::size_t kLine = 64;

/// The variable's value, or nothing when unset or empty.
std::optional<std::string> get(const char* name) {
    const char* v = std::getenv(name);
    if (!v || !*v) return std::nullopt;
    return std::string(v);
}

[[noreturn]] void bad(const char* name, const std::string& v, const std::string& want) {
    fail("mpiml", std::string(name) + "='" + v + "' " + want);
}

std::string lower(std::string s) {
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
}

}  // namespace

bool parse_bool(const char* name, const std::string& v) {
    const std::string s = lower(v);
    if (s == "1" || s == "on" || s == "true" || s == "yes") return true;
    if (s == "0" || s == "off" || s == "false" || s == "no") return false;
    bad(name, v, "is not a boolean (use 1/on/true/yes or 0/off/false/no)");
}

std::size_t parse_bytes(const char* name, const std::string& v) {
    const char* p = v.c_str();
    char* end = nullptr;
    if (!std::isdigit(static_cast<unsigned char>(*p))) bad(name, v, "is not a byte count (e.g. 65536, 64K, 4M)");
    errno = 0;
    const unsigned long long x = std::strtoull(p, &end, 10);
    const std::string suffix(end);
    unsigned shift = 0;
    if (suffix.empty()) shift = 0;
    else if (suffix == "K" || suffix == "k" || suffix == "KiB") shift = 10;
    else if (suffix == "M" || suffix == "MiB") shift = 20;
    else if (suffix == "G" || suffix == "GiB") shift = 30;
    else bad(name, v, "is not a byte count (e.g. 65536, 64K, 4M)");
    if (errno == ERANGE || x > (SIZE_MAX >> shift)) bad(name, v, "is too large");
    return static_cast<std::size_t>(x) << shift;
}

double parse_seconds(const char* name, const std::string& v) {
    char* end = nullptr;
    const double t = std::strtod(v.c_str(), &end);
    if (end == v.c_str() || *end != '\0' || !std::isfinite(t) || t < 0)
        bad(name, v, "is not a number of seconds (use e.g. 300, or 0 for off)");
    return t;
}

bool profile_clock_measure() {
    const auto v = get("MPIML_PROFILE_CLOCK");
    if (!v || *v == "auto") return false;
    if (*v == "measure") return true;
    bad("MPIML_PROFILE_CLOCK", *v, "must be auto or measure");
}

bool launched_by_mpi_fork() { return get("IN_MPI").has_value(); }

const char* launcher_rank(bool with_slurm) {
    for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"})
        if (const char* v = std::getenv(name); v && *v) return v;
    const char* slurm = with_slurm ? std::getenv("SLURM_PROCID") : nullptr;
    return slurm && *slurm ? slurm : nullptr;
}

int launcher_size() {
    for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS"})
        if (const char* v = std::getenv(name); v && *v) return std::atoi(v);
    return 0;
}

std::optional<bool> env_c10d_check() { return env_config().c10d_check; }
bool env_profile_requested() { return !env_config().profile_dir.empty(); }


LaunchConfig read_launch_config(const char* call) {
    LaunchConfig c;
    if (auto v = get("MPIML_MPIRUN")) c.launcher = *v;
    if (auto v = get("MPIML_MPIRUN_FLAGS")) {
        std::stringstream ss(*v);
        for (std::string w; ss >> w;) c.extra_flags.push_back(w);
    }
    if (auto v = get("MPIML_HOSTFILE")) {
        if (::access(v->c_str(), R_OK) != 0)
            fail(call, "MPIML_HOSTFILE='" + *v + "' is not a readable file");
        c.hostfile = *v;
    }
    return c;
}

std::vector<Injection> parse_inject(const std::string& v) {
    constexpr const char* name = "MPIML_INJECT";
    const char* want =
        "is not a list of ACTION:RANK:N (ACTION kill, segv, stall or exit[=STATUS]; N the rank's "
        "N-th collective, from 1), e.g. kill:1:200 or exit=3:0:5,segv:2:10";
    std::vector<Injection> out;
    std::stringstream items(v);
    for (std::string item; std::getline(items, item, ',');) {
        const auto c1 = item.find(':'), c2 = item.rfind(':');
        if (c1 == std::string::npos || c2 == c1) bad(name, v, want);
        std::string action = item.substr(0, c1);
        const std::string rank = item.substr(c1 + 1, c2 - c1 - 1), at = item.substr(c2 + 1);
        Injection j;
        auto number = [&](const std::string& t, long long lo) {
            char* end = nullptr;
            if (t.empty() || !std::isdigit(static_cast<unsigned char>(t[0]))) bad(name, v, want);
            errno = 0;
            const long long x = std::strtoll(t.c_str(), &end, 10);
            if (*end || errno == ERANGE || x < lo || x > INT_MAX) bad(name, v, want);
            return x;
        };
        if (action.rfind("exit=", 0) == 0) {
            j.status = static_cast<int>(number(action.substr(5), 0));
            if (j.status > 255) bad(name, v, "has an exit status above 255");
            action = "exit";
        }
        if (action == "kill") j.action = Injection::Action::kill;
        else if (action == "segv") j.action = Injection::Action::segv;
        else if (action == "stall") j.action = Injection::Action::stall;
        else if (action == "exit") j.action = Injection::Action::exit;
        else bad(name, v, want);
        j.rank = static_cast<int>(number(rank, 0));
        j.at = static_cast<std::uint64_t>(number(at, 1));
        out.push_back(j);
    }
    if (out.empty()) bad(name, v, want);
    return out;
}

EnvConfig read_env_config() {
    EnvConfig c;
    if (auto v = get("MPIML_CHECK")) c.check = parse_bool("MPIML_CHECK", *v);
    if (auto v = get("MPIML_TIMEOUT")) c.timeout = parse_seconds("MPIML_TIMEOUT", *v);
    if (auto v = get("MPIML_STALL_WARNING")) c.stall_warning = parse_seconds("MPIML_STALL_WARNING", *v);

    shm::Config& s = c.shm;
    s.allreduce_threshold = kDefaultAllreduceThreshold;
    s.broadcast_threshold = kDefaultBroadcastThreshold;
    s.chunk = kDefaultChunk;
    if (auto v = get("MPIML_SHM")) {
        if (lower(*v) == "auto") s.mode = shm::Mode::automatic;
        else {
            try {
                s.mode = parse_bool("MPIML_SHM", *v) ? shm::Mode::on : shm::Mode::off;
            } catch (const Error&) {
                bad("MPIML_SHM", *v, "must be auto, or a boolean (1/on/true/yes, 0/off/false/no)");
            }
        }
    }
    if (auto v = get("MPIML_SHM_THRESHOLD")) s.allreduce_threshold = parse_bytes("MPIML_SHM_THRESHOLD", *v);
    if (auto v = get("MPIML_SHM_BCAST_THRESHOLD"))
        s.broadcast_threshold = parse_bytes("MPIML_SHM_BCAST_THRESHOLD", *v);
    if (auto v = get("MPIML_SHM_CHUNK")) {
        s.chunk = parse_bytes("MPIML_SHM_CHUNK", *v);
        if (s.chunk < kMinChunk || s.chunk > kMaxChunk)
            bad("MPIML_SHM_CHUNK", *v, "must be between 4096 bytes and 256 MiB");
    }
    s.chunk = (s.chunk + kLine - 1) / kLine * kLine;
    if (auto v = get("MPIML_NODE_SPLIT")) {
        char* end = nullptr;
        const long k = std::strtol(v->c_str(), &end, 10);
        if (*end || k < 0 || k > INT_MAX || !std::isdigit(static_cast<unsigned char>((*v)[0])))
            bad("MPIML_NODE_SPLIT", *v, "must be a number of ranks per node (0: real nodes)");
        s.node_split = static_cast<int>(k);
    }
    if (auto v = get("MPIML_PROFILE")) c.profile_dir = *v;
    c.profile_clock_measure = profile_clock_measure();
    if (auto v = get("MPIML_INJECT")) c.inject = parse_inject(*v);
    if (auto v = get("MPIML_ATTEMPT")) {
        char* end = nullptr;
        const long k = std::strtol(v->c_str(), &end, 10);
        if (*end || k < 0 || k > INT_MAX || !std::isdigit(static_cast<unsigned char>((*v)[0])))
            bad("MPIML_ATTEMPT", *v, "must be the attempt number (0 for the first run)");
        c.attempt = static_cast<int>(k);
    }
    // Slurm's count of this batch job's requeues (node failure, preemption,
    // scontrol requeue): a requeued job is a restart of the same job.
    if (auto v = get("SLURM_RESTART_COUNT")) {
        char* end = nullptr;
        const long k = std::strtol(v->c_str(), &end, 10);
        if (!*end && k > 0 && k <= INT_MAX && std::isdigit(static_cast<unsigned char>((*v)[0])))
            c.requeues = static_cast<int>(k);
    }
    if (auto v = get("MPIML_ABORT_RECORD")) c.abort_record = *v;
    if (auto v = get("MPIML_C10D_CHECK")) c.c10d_check = parse_bool("MPIML_C10D_CHECK", *v);
    if (auto v = get("MPIML_REPORT")) c.report = parse_bool("MPIML_REPORT", *v);
    if (auto v = get("MPIML_REPORT_DIR")) c.report_dir = *v;
    return c;
}

namespace {
std::optional<EnvConfig>& stored() {
    static auto* c = new std::optional<EnvConfig>;  // read inside MPI_Finalize too
    return *c;
}
}  // namespace

void load_env_config() { stored() = read_env_config(); }

const EnvConfig& env_config() {
    if (!stored()) load_env_config();
    return *stored();
}

}  // namespace mpiml::detail
