// Checkpoints: file format, XXH64, the collective save and load.
#include <mpiml/checkpoint.hpp>
#include <mpiml/collectives.hpp>

#include "core/agreement.hpp"
#include "checkpoint/checkpoint_hash.hpp"

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <stdio.h>  // renameat2
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <deque>
#include <fstream>
#include <mutex>
#include <thread>
#include <climits>
#include <cstdio>
#include <cstring>
#include <map>
#include <system_error>

namespace fs = std::filesystem;

namespace mpiml {

CheckpointError::CheckpointError(std::string call, std::string what, std::string path, int error_code)
    : Error(std::move(call), std::move(what)), path_(std::move(path)), error_code_(error_code) {}

namespace detail {
void checkpoint_decode_failed(std::string_view name, std::string_view kind, std::string_view what) {
    throw Error("mpiml::StateMap::get", "entry '" + std::string(name) + "' (" + std::string(kind) +
                                            ") does not decode: " + std::string(what));
}
}  // namespace detail

// ------------------------------------------------------------------ StateMap

StateMap& StateMap::put(std::string_view name, const char* text) {
    slot(name, "text").data.assign(text ? text : "");
    return *this;
}

StateMap& StateMap::put_bytes(std::string_view name, std::string_view data) {
    slot(name, "bytes").data.assign(data);
    return *this;
}

StateMap& StateMap::put_bytes(std::string_view name, std::span<const std::byte> data) {
    slot(name, "bytes").data.assign(reinterpret_cast<const char*>(data.data()), data.size());
    return *this;
}

StateMap& StateMap::put_bytes(std::string_view name, std::string&& data) {
    return put_raw(name, "bytes", std::move(data));
}

std::size_t StateMap::Entry::size() const {
    if (pieces.empty()) return data.size();
    std::size_t n = 0;
    for (auto p : pieces) n += p.size();
    return n;
}

std::string_view StateMap::Entry::bytes() const {
    if (pieces.empty()) return data;
    if (pieces.size() == 1) return pieces[0];
    detail::fail("mpiml::StateMap::get", "a view of " + std::to_string(pieces.size()) +
                                             " pieces (" + kind + ") is readable once loaded back");
}

StateMap& StateMap::put_view(std::string_view name, std::string_view data, std::string_view kind) {
    return put_view(name, std::vector<std::string_view>{data}, kind);
}

StateMap& StateMap::put_view(std::string_view name, std::vector<std::string_view> pieces,
                             std::string_view kind) {
    Entry& e = slot(name, kind);
    e.data = std::string();
    std::erase_if(pieces, [](std::string_view p) { return p.empty(); });
    e.pieces = pieces.empty() ? std::vector<std::string_view>{std::string_view("", 0)} : std::move(pieces);
    return *this;
}

StateMap& StateMap::put_view(std::string_view name, std::span<const std::byte> data,
                             std::string_view kind) {
    return put_view(name, std::string_view(reinterpret_cast<const char*>(data.data()), data.size()), kind);
}

StateMap& StateMap::put_raw(std::string_view name, std::string kind, std::string data) {
    Entry& e = slot(name, kind);
    e.data = std::move(data);
    return *this;
}

StateMap::Entry& StateMap::slot(std::string_view name, std::string_view kind) {
    if (name.empty()) detail::fail("mpiml::StateMap::put", "the entry name is empty");
    auto it = entries_.find(name);
    if (it == entries_.end()) it = entries_.emplace(std::string(name), Entry{}).first;
    it->second.kind.assign(kind);
    it->second.data.clear();
    it->second.pieces.clear();
    return it->second;
}

const StateMap::Entry& StateMap::at(std::string_view name, std::string_view kind) const {
    auto it = entries_.find(name);
    if (it == entries_.end()) {
        std::string have;
        for (const auto& [n, e] : entries_) have += (have.empty() ? "" : ", ") + n;
        detail::fail("mpiml::StateMap::get",
                     "no entry '" + std::string(name) + "' (entries: " + (have.empty() ? "none" : have) + ")");
    }
    if (!kind.empty() && it->second.kind != kind)
        detail::fail("mpiml::StateMap::get", "entry '" + std::string(name) + "' holds " +
                                                 it->second.kind + ", not " + std::string(kind));
    return it->second;
}

bool StateMap::erase(std::string_view name) {
    auto it = entries_.find(name);
    if (it == entries_.end()) return false;
    entries_.erase(it);
    return true;
}

std::vector<std::string> StateMap::names() const {
    std::vector<std::string> out;
    out.reserve(entries_.size());
    for (const auto& [n, e] : entries_) out.push_back(n);
    return out;
}

// ------------------------------------------------------------------ files

namespace {

using detail::Xxh64;

constexpr char kMagic[8] = {'M', 'P', 'I', 'M', 'L', 'C', 'K', '\n'};
constexpr std::uint32_t kVersion = 1;
constexpr const char* kManifest = "MANIFEST";
constexpr const char* kShared = "shared.bin";
constexpr std::int64_t kMaxStep = 999'999'999'999'999'999;  // step-N names hold 18 digits

/// A failure of one rank, carried to the others.
struct Failure {
    int err = 0;       // errno, 0 for corrupt data
    std::string path;  // the file or directory
    std::string what;  // the whole sentence
};

/// Thrown inside this file and turned into a Failure.
struct FailureError {
    Failure f;
};

std::string errno_text(int err) {
    return std::string(std::strerror(err)) + " (errno " + std::to_string(err) + ")";
}

[[noreturn]] void io_fail(const std::string& doing, const fs::path& p, int err) {
    throw FailureError{{err, p.string(), doing + " " + p.string() + ": " + errno_text(err)}};
}

[[noreturn]] void corrupt(const fs::path& p, const std::string& what) {
    throw FailureError{{0, p.string(), p.filename().string() + ": " + what}};
}

std::string hex64(std::uint64_t v) {
    char b[17];
    std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(v));
    return b;
}

std::string step_name(std::int64_t step) {
    char b[32];
    std::snprintf(b, sizeof b, "step-%08lld", static_cast<long long>(step));
    return b;
}

std::string rank_name(int rank) {
    char b[32];
    std::snprintf(b, sizeof b, "rank-%05d.bin", rank);
    return b;
}

/// The step of a directory name "step-<digits>", or -1.
std::int64_t parse_step(const std::string& name) {
    if (name.size() <= 5 || name.compare(0, 5, "step-") != 0 || name.size() > 5 + 18) return -1;
    std::int64_t v = 0;
    for (std::size_t i = 5; i < name.size(); ++i) {
        if (name[i] < '0' || name[i] > '9') return -1;
        v = v * 10 + (name[i] - '0');
    }
    return v;
}

void fsync_dir(const fs::path& dir) {
    const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) io_fail("cannot open directory", dir, errno);
    if (::fsync(fd) != 0) {
        const int e = errno;
        ::close(fd);
        io_fail("cannot fsync directory", dir, e);
    }
    ::close(fd);
}

/// Writes a file through a buffer, hashing every byte; fsyncs it on finish().
class FileWriter {
public:
    explicit FileWriter(fs::path path) : path_(std::move(path)) {
        fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd_ < 0) io_fail("cannot create", path_, errno);
        buf_.reserve(kBuf);
    }
    ~FileWriter() {
        if (fd_ >= 0) ::close(fd_);
    }
    FileWriter(const FileWriter&) = delete;
    FileWriter& operator=(const FileWriter&) = delete;

    void write(const void* data, std::size_t n) {
        const char* p = static_cast<const char*>(data);
        if (buf_.size() + n <= kBuf) {
            hash_.update(p, n);
            buf_.append(p, n);
            return;
        }
        flush();
        // Large data: hashed, then written, a chunk at a time (still in cache).
        while (n > 0) {
            const std::size_t k = std::min(n, kChunk);
            hash_.update(p, k);
            write_all(p, k);
            p += k;
            n -= k;
        }
    }
    template <class T>
    void put(T v) {
        std::string s;
        detail::checkpoint_put_le(v, s);
        write(s.data(), s.size());
    }
    /// Flushes, fsyncs and closes; returns {size, xxh64}.
    std::pair<std::uint64_t, std::uint64_t> finish() {
        flush();
        if (::fsync(fd_) != 0) io_fail("cannot fsync", path_, errno);
        const int fd = fd_;
        fd_ = -1;
        if (::close(fd) != 0) io_fail("cannot close", path_, errno);
        return {size_, hash_.digest()};
    }

private:
    static constexpr std::size_t kBuf = 1 << 20;
    static constexpr std::size_t kChunk = 4 << 20;

    void flush() {
        if (!buf_.empty()) write_all(buf_.data(), buf_.size());
        buf_.clear();
    }
    void write_all(const char* p, std::size_t n) {
        while (n > 0) {
            const ssize_t r = ::write(fd_, p, std::min<std::size_t>(n, std::size_t{1} << 30));
            if (r < 0) {
                if (errno == EINTR) continue;
                io_fail("cannot write", path_, errno);
            }
            if (r == 0) io_fail("cannot write", path_, ENOSPC);
            p += r;
            n -= static_cast<std::size_t>(r);
            size_ += static_cast<std::uint64_t>(r);
        }
    }

    fs::path path_;
    int fd_ = -1;
    std::string buf_;
    Xxh64 hash_;
    std::uint64_t size_ = 0;
};

struct FileSum {
    std::uint64_t size = 0;
    std::uint64_t hash = 0;
};

/// File layout (little-endian): magic[8], u32 version, i32 rank (-1: shared),
/// i64 step, u64 entries; then per entry u32 name length, u32 kind length,
/// u64 data length, name, kind, data.
FileSum write_state_file(const fs::path& path, const StateMap& map, int rank, std::int64_t step) {
    FileWriter w(path);
    w.write(kMagic, sizeof kMagic);
    w.put<std::uint32_t>(kVersion);
    w.put<std::int32_t>(rank);
    w.put<std::int64_t>(step);
    w.put<std::uint64_t>(map.size());
    for (const auto& [name, e] : map.entries()) {
        w.put<std::uint32_t>(static_cast<std::uint32_t>(name.size()));
        w.put<std::uint32_t>(static_cast<std::uint32_t>(e.kind.size()));
        w.put<std::uint64_t>(e.size());
        w.write(name.data(), name.size());
        w.write(e.kind.data(), e.kind.size());
        if (e.pieces.empty())
            w.write(e.data.data(), e.data.size());
        else
            for (const auto p : e.pieces) w.write(p.data(), p.size());
    }
    auto [size, hash] = w.finish();
    return {size, hash};
}

StateMap parse_state_file(const fs::path& path, std::string_view d, int rank, std::int64_t step) {
    std::size_t at = 0;
    auto need = [&](std::size_t n) {
        if (d.size() - at < n)
            corrupt(path, "truncated at byte " + std::to_string(at) + " of " + std::to_string(d.size()));
    };
    auto take = [&]<class T>(T*) {
        need(sizeof(T));
        T v = detail::checkpoint_get_le<T>(d.data() + at);
        at += sizeof(T);
        return v;
    };
    need(sizeof kMagic);
    if (std::memcmp(d.data(), kMagic, sizeof kMagic) != 0) corrupt(path, "not an mpiml checkpoint file");
    at += sizeof kMagic;
    const auto version = take(static_cast<std::uint32_t*>(nullptr));
    if (version != kVersion) corrupt(path, "format version " + std::to_string(version) + ", expected " +
                                               std::to_string(kVersion));
    const auto r = take(static_cast<std::int32_t*>(nullptr));
    const auto s = take(static_cast<std::int64_t*>(nullptr));
    if (r != rank || s != step)
        corrupt(path, "holds rank " + std::to_string(r) + " step " + std::to_string(s) + ", expected rank " +
                          std::to_string(rank) + " step " + std::to_string(step));
    const auto count = take(static_cast<std::uint64_t*>(nullptr));
    StateMap map;
    for (std::uint64_t i = 0; i < count; ++i) {
        const auto nl = take(static_cast<std::uint32_t*>(nullptr));
        const auto kl = take(static_cast<std::uint32_t*>(nullptr));
        const auto dl = take(static_cast<std::uint64_t*>(nullptr));
        need(nl);
        std::string name(d.substr(at, nl));
        at += nl;
        need(kl);
        std::string kind(d.substr(at, kl));
        at += kl;
        need(dl);
        map.put_raw(name, std::move(kind), std::string(d.substr(at, dl)));
        at += dl;
    }
    if (at != d.size()) corrupt(path, std::to_string(d.size() - at) + " bytes after the last entry");
    return map;
}

std::string read_file(const fs::path& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) io_fail("cannot open", path, errno);
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
        const int e = errno;
        ::close(fd);
        io_fail("cannot stat", path, e);
    }
    std::string out(static_cast<std::size_t>(st.st_size), '\0');
    std::size_t done = 0;
    while (done < out.size()) {
        const ssize_t r = ::read(fd, out.data() + done, std::min<std::size_t>(out.size() - done, 1u << 30));
        if (r < 0) {
            if (errno == EINTR) continue;
            const int e = errno;
            ::close(fd);
            io_fail("cannot read", path, e);
        }
        if (r == 0) break;
        done += static_cast<std::size_t>(r);
    }
    ::close(fd);
    out.resize(done);
    return out;
}

/// Size and checksum of data against the MANIFEST's record of file name.
void verify(const fs::path& path, std::string_view data, const nlohmann::json& files) {
    const std::string name = path.filename().string();
    if (!files.contains(name)) corrupt(path, "not listed in the MANIFEST");
    const auto& f = files.at(name);
    const std::uint64_t size = f.at("size").get<std::uint64_t>();
    if (data.size() != size)
        corrupt(path, "is " + std::to_string(data.size()) + " bytes, the MANIFEST says " +
                          std::to_string(size) + " (truncated or torn)");
    const std::string want = f.at("xxh64").get<std::string>();
    const std::string got = hex64(detail::xxh64(data.data(), data.size()));
    if (got != want) corrupt(path, "checksum mismatch (xxh64 " + got + ", the MANIFEST says " + want + ")");
}

/// XXH64 of a MANIFEST's content (all but its own checksum), compact JSON
/// with sorted keys: the same text whenever the content is the same.
std::string manifest_sum(const nlohmann::json& body) {
    const std::string text = body.dump();
    return hex64(detail::xxh64(text.data(), text.size()));
}

/// Parses and checks the MANIFEST of checkpoint step.
nlohmann::json parse_manifest(const fs::path& path, const std::string& text, std::int64_t step) {
    nlohmann::json m;
    try {
        m = nlohmann::json::parse(text);
        if (m.at("format").get<std::string>() != "mpiml-checkpoint") corrupt(path, "not an mpiml MANIFEST");
        if (m.at("version").get<int>() != 1)
            corrupt(path, "format version " + m.at("version").dump() + ", expected 1");
        if (m.at("step").get<std::int64_t>() != step)
            corrupt(path, "is of step " + m.at("step").dump() + ", expected " + std::to_string(step));
        const int world = m.at("world_size").get<int>();
        if (world < 1) corrupt(path, "world_size " + std::to_string(world));
        const auto& files = m.at("files");
        for (int r = -1; r < world; ++r) {
            const std::string n = r < 0 ? kShared : rank_name(r);
            if (!files.contains(n)) corrupt(path, "does not list " + n);
            files.at(n).at("size").get<std::uint64_t>();
            files.at(n).at("xxh64").get<std::string>();
        }
        if (!m.at("metadata").is_object()) corrupt(path, "metadata is not an object");
        if (m.contains("manifest_xxh64")) {  // absent from checkpoints of older versions
            nlohmann::json body = m;
            body.erase("manifest_xxh64");
            if (m.at("manifest_xxh64").get<std::string>() != manifest_sum(body))
                corrupt(path, "checksum mismatch (its metadata or file list was changed)");
        }
    } catch (const nlohmann::json::exception& e) {
        corrupt(path, std::string("unreadable: ") + e.what());
    }
    return m;
}

// -------------------------------------------------------------- collectives

std::string encode(const Failure& f) {
    return std::to_string(f.err) + '\x1f' + f.path + '\x1f' + f.what;
}

Failure decode(const std::string& s) {
    Failure f;
    const auto a = s.find('\x1f');
    const auto b = s.find('\x1f', a + 1);
    if (a == std::string::npos || b == std::string::npos) return {0, "", s};
    f.err = std::atoi(s.substr(0, a).c_str());
    f.path = s.substr(a + 1, b - a - 1);
    f.what = s.substr(b + 1);
    return f;
}

void bcast_string(std::string& s, int root, MPI_Comm comm, const char* call) {
    unsigned long long n = s.size();
    detail::broadcast(&n, 1, MPI_UNSIGNED_LONG_LONG, root, comm, call);
    s.resize(n);
    detail::broadcast(s.data(), s.size(), MPI_CHAR, root, comm, call);
}

/// Every rank's failure flag; the first failing rank's Failure broadcast to all.
std::optional<std::pair<int, Failure>> first_failure(const std::optional<Failure>& mine, MPI_Comm comm,
                                                     const char* call, int* failed_ranks = nullptr) {
    const int size = num_procs(comm);
    const int flag = mine ? 1 : 0;
    std::vector<int> flags(static_cast<std::size_t>(size));
    detail::allgather(&flag, flags.data(), 1, MPI_INT, comm, call);
    int first = -1, count = 0;
    for (int r = 0; r < size; ++r)
        if (flags[r]) {
            if (first < 0) first = r;
            ++count;
        }
    if (failed_ranks) *failed_ranks = count;
    if (first < 0) return std::nullopt;
    std::string s = mine && proc_id(comm) == first ? encode(*mine) : std::string();
    bcast_string(s, first, comm, call);
    return std::pair{first, decode(s)};
}

/// Steps present in dir (complete directories), ascending.
std::vector<std::int64_t> list_steps(const fs::path& dir) {
    std::vector<std::int64_t> out;
    std::error_code ec;
    fs::directory_iterator it(dir, ec);
    if (ec) io_fail("cannot list", dir, ec.value());
    for (; it != fs::directory_iterator(); it.increment(ec)) {
        if (ec) io_fail("cannot list", dir, ec.value());
        const std::int64_t s = parse_step(it->path().filename().string());
        std::error_code ec2;
        if (s >= 0 && it->is_directory(ec2)) out.push_back(s);
    }
    if (ec) io_fail("cannot list", dir, ec.value());
    std::sort(out.begin(), out.end());
    return out;
}

/// The save number in the MANIFEST of checkpoint dir/step-N: saves count up
/// in a directory, so the newest checkpoint is the one saved last, whatever
/// its step (a run resumed from an older step saves lower steps than the
/// abandoned ones). 0 for checkpoints of older versions, -1 when unreadable.
std::int64_t save_number(const fs::path& step_dir) {
    try {
        std::ifstream in(step_dir / kManifest);
        if (!in) return -1;
        const auto m = nlohmann::json::parse(in, nullptr, false);
        if (m.is_discarded() || !m.is_object()) return -1;
        const auto it = m.find("saved");
        return it == m.end() ? 0 : it->get<std::int64_t>();
    } catch (const std::exception&) {
        return -1;
    }
}

/// Steps present in dir, oldest save first (then by step). Those with an
/// unreadable MANIFEST come first, or with unreadable_newest last (a load
/// tries them first and says why it passes over them).
std::vector<std::int64_t> steps_by_save(const fs::path& dir, std::int64_t* last_save = nullptr,
                                        bool unreadable_newest = false) {
    std::vector<std::pair<std::int64_t, std::int64_t>> order;
    std::int64_t last = 0;
    for (const std::int64_t s : list_steps(dir)) {
        std::int64_t n = save_number(dir / step_name(s));
        last = std::max(last, n);
        if (n < 0 && unreadable_newest) n = INT64_MAX;
        order.emplace_back(n, s);
    }
    std::sort(order.begin(), order.end());
    if (last_save) *last_save = last;
    std::vector<std::int64_t> out;
    for (const auto& [n, s] : order) out.push_back(s);
    return out;
}

/// The lock on dir/.lock, taken by a process's first save into dir and held
/// until it exits: another job saving into dir would clear this one's
/// temporary directories and prune its checkpoints.
void hold_dir_lock(const fs::path& dir) {
    static auto* m = new std::mutex;
    static auto* held = new std::map<std::string, int>;  // device:inode -> open lock file
    struct stat st {};
    if (::stat(dir.c_str(), &st) != 0) io_fail("cannot access", dir, errno);
    const std::string key = std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino);
    std::lock_guard lock(*m);
    if (held->count(key)) return;
    const fs::path p = dir / ".lock";
    const int fd = ::open(p.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) io_fail("cannot open", p, errno);
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
        const int err = errno;
        if (err == ENOLCK || err == EOPNOTSUPP || err == ENOSYS) {  // no locks here: go on
            ::close(fd);
            (*held)[key] = -1;
            return;
        }
        char owner[256] = {};
        const ssize_t n = ::pread(fd, owner, sizeof owner - 1, 0);
        ::close(fd);
        if (err != EWOULDBLOCK) io_fail("cannot lock", p, err);
        std::string who(owner, n > 0 ? static_cast<std::size_t>(n) : 0);
        while (!who.empty() && (who.back() == '\n' || who.back() == ' ')) who.pop_back();
        throw FailureError{{0, p.string(), "another job saves checkpoints into " + dir.string() +
                                               (who.empty() ? "" : " (" + who + ")") +
                                               "; give each job a directory of its own"}};
    }
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    const std::string who = "process " + std::to_string(::getpid()) + " on host " + host + "\n";
    if (::ftruncate(fd, 0) == 0) {
        [[maybe_unused]] const ssize_t w = ::pwrite(fd, who.data(), who.size(), 0);
    }
    (*held)[key] = fd;  // kept open: the lock lasts until this process exits
}

void warn(const std::string& line) {
    const std::string text = "[mpiml] warning: " + line + "\n";
    std::fwrite(text.data(), 1, text.size(), stderr);
    std::fflush(stderr);
}

void remove_tree(const fs::path& p) {
    std::error_code ec;
    fs::remove_all(p, ec);
    if (ec) io_fail("cannot remove", p, ec.value());
}

/// Removes old checkpoints in the background once they are renamed out of
/// the way (deleting 300 MB takes a good part of the time of writing it).
/// A save waits for the previous removals first; so does the process at exit.
class Janitor {
public:
    void remove_later(fs::path p) {
        std::lock_guard lock(m_);
        if (!thread_) {
            owner_ = ::getpid();
            thread_ = new std::thread([this] { run(); });
        }
        queue_.push_back(std::move(p));
        cv_.notify_all();
    }
    void wait() {
        std::unique_lock lock(m_);
        cv_.wait(lock, [&] { return queue_.empty() && !busy_; });
    }
    ~Janitor() {
        if (!thread_ || owner_ != ::getpid()) return;  // a forked child has no thread
        {
            std::lock_guard lock(m_);
            stop_ = true;
        }
        cv_.notify_all();
        thread_->join();
        delete thread_;
    }

private:
    void run() {
        std::unique_lock lock(m_);
        for (;;) {
            cv_.wait(lock, [&] { return !queue_.empty() || stop_; });
            if (queue_.empty()) return;
            const fs::path p = std::move(queue_.front());
            queue_.pop_front();
            busy_ = true;
            lock.unlock();
            std::error_code ec;
            fs::remove_all(p, ec);
            if (ec && ec.value() != ENOENT)
                warn("mpiml::Checkpointer: cannot remove " + p.string() + ": " + errno_text(ec.value()));
            lock.lock();
            busy_ = false;
            cv_.notify_all();
        }
    }
    std::mutex m_;
    std::condition_variable cv_;
    std::deque<fs::path> queue_;
    bool busy_ = false, stop_ = false;
    std::thread* thread_ = nullptr;
    pid_t owner_ = 0;
};

Janitor& janitor() {
    static Janitor j;
    return j;
}

/// Renames dir p aside (a hidden name that loads ignore and the next save
/// clears), then removes it in the background.
void discard(const fs::path& p, const fs::path& hidden) {
    if (::rename(p.c_str(), hidden.c_str()) != 0) io_fail("cannot move aside", p, errno);
    janitor().remove_later(hidden);
}

}  // namespace

// ---------------------------------------------------------------- Checkpointer

Checkpointer::Checkpointer(fs::path dir, CheckpointOptions options)
    : dir_(std::move(dir)), options_(options) {
    if (dir_.empty()) detail::fail("mpiml::Checkpointer", "the directory is empty");
    if (options_.keep < 0)
        detail::fail("mpiml::Checkpointer", "keep must be >= 0 (0: keep all), got " +
                                                std::to_string(options_.keep));
}

fs::path Checkpointer::step_path(std::int64_t step) const { return dir_ / step_name(step); }

void Checkpointer::wait_for_removals() { janitor().wait(); }

fs::path Checkpointer::hidden(std::int64_t step, const char* what) const {
    std::string name = ".";  // appends: GCC 12 warns (-Wrestrict) on "." + std::string
    name += step_name(step);
    name += '.';
    name += what;
    name += '-';
    name += std::to_string(::getpid());
    return dir_ / name;
}

std::vector<std::int64_t> Checkpointer::steps() const {
    std::error_code ec;
    if (!fs::exists(dir_, ec)) return {};
    try {
        return list_steps(dir_);
    } catch (const FailureError& e) {
        throw CheckpointError("mpiml::Checkpointer::steps", e.f.what, e.f.path, e.f.err);
    }
}

void Checkpointer::agree_on_call(std::int64_t step, MPI_Comm comm, const char* call) const {
    const std::string d = dir_.string();
    const std::int64_t key[2] = {step, static_cast<std::int64_t>(detail::xxh64(d.data(), d.size()))};
    std::int64_t lo[2], hi[2];
    if (detail::agree(key, 2, comm, call, lo, hi)) return;
    if (lo[0] != hi[0])
        detail::fail(call, "ranks disagree on the step (" + std::to_string(lo[0]) + " to " +
                               std::to_string(hi[0]) + ")");
    detail::fail(call, "ranks disagree on the directory (this rank's: " + d + ")");
}

void Checkpointer::save(std::int64_t step, const CheckpointState& state) {
    const char* call = "mpiml::Checkpointer::save";
    const MPI_Comm comm = options_.comm.get(call);
    const int rank = proc_id(comm);
    const int size = num_procs(comm);
    agree_on_call(step, comm, call);
    if (step < 0) detail::fail(call, "step must be >= 0, got " + std::to_string(step));
    if (step > kMaxStep)
        detail::fail(call, "step must be at most " + std::to_string(kMaxStep) + " (18 digits), got " +
                               std::to_string(step));
    const std::string where = "step " + std::to_string(step) + " not saved in " + dir_.string() + ": ";
    const fs::path final_dir = step_path(step);

    // 1. Rank 0 makes the temporary directory (and clears a crashed save's).
    std::string msg;
    if (rank == 0) {
        try {
            janitor().wait();
            std::error_code ec;
            fs::create_directories(dir_, ec);
            if (ec) io_fail("cannot create directory", dir_, ec.value());
            if (!fs::is_directory(dir_, ec)) io_fail("cannot use directory", dir_, ENOTDIR);
            hold_dir_lock(dir_);
            for (auto it = fs::directory_iterator(dir_, ec); !ec && it != fs::directory_iterator();
                 it.increment(ec)) {
                const std::string n = it->path().filename().string();
                if (n.rfind(".step-", 0) == 0 &&
                    (n.find(".tmp-") != std::string::npos || n.find(".old-") != std::string::npos))
                    remove_tree(it->path());
            }
            if (ec) io_fail("cannot list", dir_, ec.value());
            const fs::path tmp = hidden(step, "tmp");
            if (::mkdir(tmp.c_str(), 0755) != 0) io_fail("cannot create directory", tmp, errno);
            msg = "+" + tmp.string();
        } catch (const FailureError& e) {
            msg = "-" + encode(e.f);
        }
    }
    bcast_string(msg, 0, comm, call);
    if (msg.empty() || msg[0] != '+') {
        const Failure f = decode(msg.substr(std::min<std::size_t>(1, msg.size())));
        throw CheckpointError(call, where + "rank 0: " + f.what, f.path, f.err);
    }
    const fs::path tmp = msg.substr(1);

    // 2. Every rank writes and fsyncs its file; rank 0 also the shared one.
    std::optional<Failure> mine;
    FileSum shared_sum, rank_sum;
    try {
        if (rank == 0) shared_sum = write_state_file(tmp / kShared, state.shared, -1, step);
        rank_sum = write_state_file(tmp / rank_name(rank), state.per_rank, rank, step);
    } catch (const FailureError& e) {
        mine = e.f;
    } catch (const std::exception& e) {
        mine = Failure{0, tmp.string(), e.what()};
    }

    // 3. Every file durable on every rank? Rank 0 gathers sizes and checksums.
    const std::uint64_t me[3] = {mine ? 1u : 0u, rank_sum.size, rank_sum.hash};
    std::vector<std::uint64_t> all(3 * static_cast<std::size_t>(size));
    detail::allgather(me, all.data(), 3, MPI_UINT64_T, comm, call);
    int failed = 0;
    for (int r = 0; r < size; ++r) failed += all[3 * r] ? 1 : 0;
    if (failed) {
        auto first = first_failure(mine, comm, call);
        if (rank == 0) {
            try {
                remove_tree(tmp);
            } catch (const FailureError& e) {
                warn(std::string(call) + ": " + e.f.what);
            }
        }
        const Failure& f = first->second;
        std::string text = where + "rank " + std::to_string(first->first) + ": " + f.what;
        if (failed > 1) text += " (and " + std::to_string(failed - 1) + " more ranks failed)";
        throw CheckpointError(call, text + "; the previous checkpoints are intact", f.path, f.err);
    }

    // 4. Rank 0: MANIFEST, then the rename into place, then pruning.
    std::string result;
    std::vector<std::string> warnings;
    if (rank == 0) {
        bool renamed = false;
        std::vector<std::int64_t> by_save;  // the steps before this save, oldest save first
        try {
            nlohmann::json files = nlohmann::json::object();
            files[kShared] = {{"size", shared_sum.size}, {"xxh64", hex64(shared_sum.hash)}};
            for (int r = 0; r < size; ++r)
                files[rank_name(r)] = {{"size", all[3 * r + 1]}, {"xxh64", hex64(all[3 * r + 2])}};
            nlohmann::json meta = nlohmann::json::object();
            for (const auto& [k, v] : state.metadata) meta[k] = v;
            std::int64_t last_save = 0;
            by_save = steps_by_save(dir_, &last_save);  // read once: pruning uses it too
            nlohmann::json m = {{"format", "mpiml-checkpoint"}, {"version", 1},
                                {"step", step},                 {"world_size", size},
                                {"checksum", "xxh64"},          {"files", files},
                                {"metadata", meta},             {"saved", last_save + 1}};
            std::string text;
            try {
                m["manifest_xxh64"] = manifest_sum(m);
                text = m.dump(2) + "\n";
            } catch (const nlohmann::json::exception& e) {
                throw FailureError{{0, (tmp / kManifest).string(),
                                    std::string("metadata is not valid UTF-8: ") + e.what()}};
            }
            FileWriter w(tmp / kManifest);
            w.write(text.data(), text.size());
            w.finish();
            fsync_dir(tmp);
            std::error_code ec;
            const fs::path old = hidden(step, "old");
            bool replacing = fs::exists(final_dir, ec);
            // A checkpoint of this step is replaced in one step: the two
            // directories swap names (a crash leaves one or the other in place).
            bool swapped = replacing && ::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final_dir.c_str(),
                                                    RENAME_EXCHANGE) == 0;
            if (swapped) {
                renamed = true;
                janitor().remove_later(::rename(tmp.c_str(), old.c_str()) == 0 ? old : tmp);
                replacing = false;
            } else {
                // No exchange on this file system: the previous one is moved
                // aside first (loads fall back to an older step meanwhile).
                if (replacing && ::rename(final_dir.c_str(), old.c_str()) != 0)
                    io_fail("cannot move the previous checkpoint aside:", final_dir, errno);
                if (::rename(tmp.c_str(), final_dir.c_str()) != 0) {
                    const int err = errno;
                    if (replacing) ::rename(old.c_str(), final_dir.c_str());  // put it back
                    io_fail("cannot rename " + tmp.string() + " to", final_dir, err);
                }
                renamed = true;
            }
            fsync_dir(dir_);
            if (replacing) janitor().remove_later(old);
        } catch (const FailureError& e) {
            if (!renamed) {
                result = encode(e.f);
                std::error_code ec;
                fs::remove_all(tmp, ec);
            } else {
                warnings.push_back(e.f.what);
            }
        }
        if (result.empty() && options_.keep > 0) {
            try {
                std::vector<std::int64_t> steps = std::move(by_save);  // the new one is not in it
                std::erase(steps, step);
                const std::size_t others = static_cast<std::size_t>(options_.keep - 1);
                if (steps.size() > others)
                    for (std::size_t i = 0; i < steps.size() - others; ++i)
                        discard(step_path(steps[i]), hidden(steps[i], "old"));
            } catch (const FailureError& e) {
                warnings.push_back("pruning old checkpoints: " + e.f.what);
            }
        }
        for (const auto& w : warnings) warn(std::string(call) + " (step " + std::to_string(step) + "): " + w);
    }
    bcast_string(result, 0, comm, call);
    if (!result.empty()) {
        const Failure f = decode(result);
        throw CheckpointError(call, where + "rank 0: " + f.what + "; the previous checkpoints are intact",
                              f.path, f.err);
    }
}

void Checkpointer::clear() {
    const char* call = "mpiml::Checkpointer::clear";
    const MPI_Comm comm = options_.comm.get(call);
    agree_on_call(-1, comm, call);
    std::string msg;
    if (proc_id(comm) == 0) {
        try {
            janitor().wait();
            std::error_code ec;
            if (fs::is_directory(dir_, ec)) {
                hold_dir_lock(dir_);
                for (auto it = fs::directory_iterator(dir_, ec); !ec && it != fs::directory_iterator();
                     it.increment(ec)) {
                    const std::string n = it->path().filename().string();
                    if (parse_step(n) >= 0 || n.rfind(".step-", 0) == 0) remove_tree(it->path());
                }
                if (ec) io_fail("cannot list", dir_, ec.value());
                fsync_dir(dir_);
            }
        } catch (const FailureError& e) {
            msg = encode(e.f);
        }
    }
    bcast_string(msg, 0, comm, call);
    if (!msg.empty()) {
        const Failure f = decode(msg);
        throw CheckpointError(call, "rank 0: " + f.what, f.path, f.err);
    }
}

std::optional<CheckpointInfo> Checkpointer::load_latest(CheckpointState& state) {
    return load_impl(std::nullopt, state, "mpiml::Checkpointer::load_latest");
}

std::optional<CheckpointInfo> Checkpointer::load(std::int64_t step, CheckpointState& state) {
    return load_impl(step, state, "mpiml::Checkpointer::load");
}

std::optional<CheckpointInfo> Checkpointer::load_impl(std::optional<std::int64_t> only,
                                                      CheckpointState& state, const char* call) {
    const MPI_Comm comm = options_.comm.get(call);
    const int rank = proc_id(comm);
    agree_on_call(only.value_or(-1), comm, call);

    // Rank 0 lists the candidates, newest first.
    std::string msg;
    if (rank == 0) {
        try {
            struct stat st {};
            const bool exists = ::stat(dir_.c_str(), &st) == 0;
            if (!exists && errno != ENOENT) io_fail("cannot access", dir_, errno);
            if (exists && !S_ISDIR(st.st_mode)) io_fail("cannot use directory", dir_, ENOTDIR);
            std::string list;
            if (exists)
                for (std::int64_t s : steps_by_save(dir_, nullptr, true)) list += std::to_string(s) + " ";
            msg = "+" + list;
        } catch (const FailureError& e) {
            msg = "-" + encode(e.f);
        }
    }
    bcast_string(msg, 0, comm, call);
    if (msg.empty() || msg[0] != '+') {
        const Failure f = decode(msg.substr(std::min<std::size_t>(1, msg.size())));
        throw CheckpointError(call, "rank 0: " + f.what, f.path, f.err);
    }
    std::vector<std::int64_t> candidates;
    {
        std::istringstream is(msg.substr(1));
        std::int64_t s;
        while (is >> s) candidates.push_back(s);
    }
    std::reverse(candidates.begin(), candidates.end());
    if (only) {
        const bool present = std::find(candidates.begin(), candidates.end(), *only) != candidates.end();
        candidates.assign(present ? 1 : 0, *only);
    }

    std::vector<std::string> skipped;
    for (const std::int64_t step : candidates) {
        const fs::path path = step_path(step);
        // Rank 0: the MANIFEST and shared.bin.
        std::string manifest_msg, shared_bytes;
        std::optional<StateMap> shared;
        if (rank == 0) {
            try {
                const std::string text = read_file(path / kManifest);
                const nlohmann::json m = parse_manifest(path / kManifest, text, step);
                shared_bytes = read_file(path / kShared);
                verify(path / kShared, shared_bytes, m.at("files"));
                shared = parse_state_file(path / kShared, shared_bytes, -1, step);
                manifest_msg = "+" + text;
            } catch (const FailureError& e) {
                manifest_msg = "-" + encode(e.f);
            }
        }
        bcast_string(manifest_msg, 0, comm, call);
        std::optional<std::pair<int, Failure>> bad;
        int failed = 0;
        nlohmann::json manifest;
        StateMap own;
        int world = 0;
        if (manifest_msg.empty() || manifest_msg[0] != '+') {
            bad = std::pair{0, decode(manifest_msg.substr(std::min<std::size_t>(1, manifest_msg.size())))};
            failed = 1;
        } else {
            std::optional<Failure> mine;
            try {
                manifest = parse_manifest(path / kManifest, manifest_msg.substr(1), step);
                world = manifest.at("world_size").get<int>();
                if (rank < world) {
                    const fs::path f = path / rank_name(rank);
                    const std::string data = read_file(f);
                    verify(f, data, manifest.at("files"));
                    own = parse_state_file(f, data, rank, step);
                }
            } catch (const FailureError& e) {
                mine = e.f;
            }
            bad = first_failure(mine, comm, call, &failed);
        }
        if (bad) {
            std::string why = "checkpoint " + path.string() + " is unusable: rank " +
                              std::to_string(bad->first) + ": " + bad->second.what;
            if (failed > 1) why += " (and " + std::to_string(failed - 1) + " more ranks)";
            if (only) throw CheckpointError(call, why, bad->second.path, bad->second.err);
            skipped.push_back(why);
            if (rank == 0) warn(std::string(call) + ": " + why + "; trying the previous one");
            continue;
        }
        // Everyone verified: rank 0's shared bytes go to every rank.
        unsigned long long n = shared_bytes.size();
        detail::broadcast(&n, 1, MPI_UNSIGNED_LONG_LONG, 0, comm, call);
        if (rank != 0) shared_bytes.resize(n);
        detail::broadcast(shared_bytes.data(), n, MPI_BYTE, 0, comm, call);
        if (rank != 0) {
            try {
                shared = parse_state_file(path / kShared, shared_bytes, -1, step);
            } catch (const FailureError& e) {
                throw CheckpointError(call, e.f.what, e.f.path, e.f.err);
            }
        }
        shared_bytes = std::string();
        state.shared = std::move(*shared);
        state.per_rank = std::move(own);
        state.metadata.clear();
        for (const auto& [k, v] : manifest.at("metadata").items())
            state.metadata[k] = v.is_string() ? v.get<std::string>() : v.dump();
        CheckpointInfo info;
        info.step = step;
        info.world_size = world;
        info.path = path;
        info.skipped = std::move(skipped);
        return info;
    }
    if (!skipped.empty() && rank == 0)
        warn(std::string(call) + ": no usable checkpoint in " + dir_.string());
    return std::nullopt;
}

}  // namespace mpiml
