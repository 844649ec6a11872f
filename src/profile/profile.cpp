// Profiler: per-thread event buffers in memory, written once at profile_stop
// as Chrome-trace JSON per rank, a merged timeline on rank 0, and a summary.
#include "core/config.hpp"
#include "core/agreement.hpp"
#include "core/profile_hooks.hpp"
#include "core/state.hpp"

#include <mpiml/datatype.hpp>
#include <mpiml/error.hpp>
#include <mpiml/profile.hpp>
#include <mpiml/session.hpp>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <new>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <sys/mman.h>
#include <unistd.h>

namespace mpiml {
namespace detail {

std::atomic<bool> profile_on{false};
std::atomic<std::uint32_t> profile_generation{1};

std::int64_t profile_now() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

namespace {

// 32 bytes: regions are the frequent kind; a collective's details live apart.
struct Event {
    const char* name;     // region name, or kind of collective
    std::int64_t t0, t1;  // local steady clock, ns
    std::uint32_t coll;   // 0: a region; else 1 + index into the thread's collectives
};

struct Collective {
    const char* call;
    const char* type;  // null for none
    std::uint64_t count, bytes, seq;
    std::int64_t check_ns;     // time in the mismatch check, -1: check off
    std::int64_t world_index;  // order among this profile's MPI_COMM_WORLD collectives, or -1
    std::int64_t wait_ns;      // -1: not measured; exact on the world (filled at stop)
    bool wait_exact;           // from entry times (else the mismatch check's time)
    int op, root;
    Kind kind;
};

// Append-only storage in 2 MiB blocks: no relocation as it grows, and the
// blocks are offered to the kernel as huge pages (one fault per block instead
// of one per 4 KiB page, which matters where page faults are slow).
template <class T>
class Blocks {
public:
    static constexpr std::size_t block_bytes = std::size_t{2} << 20;
    static constexpr std::size_t per_block = block_bytes / sizeof(T);
    Blocks() = default;
    Blocks(const Blocks&) = delete;
    Blocks& operator=(const Blocks&) = delete;
    ~Blocks() { clear(); }

    void push(const T& v) {
        if (used_ == per_block) grow();
        new (blocks_.back() + used_++) T(v);
    }
    std::size_t size() const { return blocks_.empty() ? 0 : (blocks_.size() - 1) * per_block + used_; }
    const T& operator[](std::size_t i) const { return blocks_[i / per_block][i % per_block]; }
    T& operator[](std::size_t i) { return blocks_[i / per_block][i % per_block]; }
    void clear() {
        for (T* b : blocks_) std::free(b);
        blocks_.clear();
        used_ = per_block;
    }
    /// Allocates the first block ahead of the first push.
    void prepare() {
        if (blocks_.empty()) grow();
    }

private:
    void grow() {
        void* p = std::aligned_alloc(block_bytes, block_bytes);
        if (!p) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
        madvise(p, block_bytes, MADV_HUGEPAGE);
#endif
        static_cast<volatile char*>(p)[0] = 0;  // take the fault now
        blocks_.push_back(static_cast<T*>(p));
        used_ = 0;
    }
    std::vector<T*> blocks_;
    std::size_t used_ = per_block;
};

struct ThreadBuffer {
    std::mutex m;
    Blocks<Event> events;
    Blocks<Collective> colls;
    int tid = 0;
};

struct Clock {
    std::int64_t mid = 0;    // local time of the sample
    double offset = 0;       // rank 0 clock - local clock, ns (used)
    double measured = 0;     // ping-pong estimate, ns
    std::int64_t rtt = 0;    // round trip of the best sample, ns
    bool same_host = true;
    std::string host;        // MPI_Get_processor_name, for the lane names
};

struct Profiler {
    std::mutex m;  // guards the members below
    std::vector<std::unique_ptr<ThreadBuffer>> threads;
    std::set<std::string> names;
    std::string dir;
    std::int64_t start = 0;
    int main_tid = 0;
    bool from_env = false;
    std::optional<Clock> clock0;  // sync at profile_start (not with MPIML_PROFILE)
    bool hook = false;
    std::atomic<std::int64_t> world_count{0};
};

// Never destroyed: profile_stop may run inside MPI_Finalize called from atexit.
Profiler& prof() {
    static auto* p = new Profiler;
    return *p;
}

thread_local ThreadBuffer* tl_buffer = nullptr;

ThreadBuffer& buffer() {
    if (tl_buffer) return *tl_buffer;
    auto& p = prof();
    std::lock_guard lock(p.m);
    p.threads.push_back(std::make_unique<ThreadBuffer>());
    p.threads.back()->tid = static_cast<int>(p.threads.size() - 1);
    tl_buffer = p.threads.back().get();
    return *tl_buffer;
}

void push(const Event& e) {
    auto& b = buffer();
    std::lock_guard lock(b.m);
    b.events.push(e);
}

void push(Event e, const Collective& c) {
    auto& b = buffer();
    std::lock_guard lock(b.m);
    b.colls.push(c);
    e.coll = static_cast<std::uint32_t>(b.colls.size());
    b.events.push(e);
}

void stop_at_finalize() {
    if (!profiling()) return;
    try {
        profile_stop();
    } catch (const std::exception& e) {
        std::fprintf(stderr, "[mpiml] profile not written: %s\n", e.what());
    }
}

// Clears old events and starts the clock; profiling is switched on by the caller.
void begin_recording(const std::string& dir, bool from_env) {
    auto& p = prof();
    std::lock_guard lock(p.m);
    for (auto& t : p.threads) {
        std::lock_guard tl(t->m);
        t->events.clear();
        t->colls.clear();
    }
    p.dir = dir;
    p.from_env = from_env;
    p.clock0.reset();
    p.world_count = 0;
    profile_generation.fetch_add(1);
    if (!p.hook) {
        register_finalize_hook(stop_at_finalize);
        p.hook = true;
    }
    p.start = profile_now();
}

std::string make_dir(const std::string& dir) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) return "cannot create directory '" + dir + "': " + ec.message();
    return "";
}

// ------------------------------------------------------------ clock sync

// Offset of this rank's steady clock to rank 0's: min-RTT ping-pong sample.
// Ranks on rank 0's host share its CLOCK_MONOTONIC, so their offset is 0
// (the estimate is still reported), unless MPIML_PROFILE_CLOCK=measure.
Clock sync_clocks(MPI_Comm comm, const char* call) {
    constexpr int rounds = 20;
    int rank = 0, size = 0;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    Clock c;
    char host[MPI_MAX_PROCESSOR_NAME + 1] = {};
    char host0[MPI_MAX_PROCESSOR_NAME + 1] = {};
    int len = 0;
    check_mpi(MPI_Get_processor_name(host, &len), call);
    std::memcpy(host0, host, sizeof host);
    check_mpi(MPI_Bcast(host0, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, 0, comm), call);
    c.same_host = std::strcmp(host, host0) == 0;
    for (const char* h = host; *h; ++h)  // kept JSON-safe
        c.host += (*h == '"' || *h == '\\' || static_cast<unsigned char>(*h) < 0x20) ? '_' : *h;
    const bool force = profile_clock_measure();
    if (rank == 0) {
        for (int r = 1; r < size; ++r)
            for (int k = 0; k < rounds; ++k) {
                check_mpi(MPI_Recv(nullptr, 0, MPI_BYTE, r, 1, comm, MPI_STATUS_IGNORE), call);
                const std::int64_t t = profile_now();
                check_mpi(MPI_Send(&t, 1, MPI_INT64_T, r, 2, comm), call);
            }
        c.mid = profile_now();
        return c;
    }
    c.rtt = INT64_MAX;
    for (int k = 0; k < rounds; ++k) {
        std::int64_t t = 0;
        const std::int64_t a = profile_now();
        check_mpi(MPI_Send(nullptr, 0, MPI_BYTE, 0, 1, comm), call);
        check_mpi(MPI_Recv(&t, 1, MPI_INT64_T, 0, 2, comm, MPI_STATUS_IGNORE), call);
        const std::int64_t b = profile_now();
        if (b - a < c.rtt) {
            c.rtt = b - a;
            c.mid = a + (b - a) / 2;
            c.measured = static_cast<double>(t - a) - static_cast<double>(b - a) / 2.0;
        }
    }
    c.offset = c.same_host && !force ? 0.0 : c.measured;
    return c;
}

// Local time -> rank 0's clock: offsets interpolated between the two syncs.
struct ClockMap {
    std::optional<Clock> c0;
    Clock c1;
    std::int64_t operator()(std::int64_t t) const {
        double off = c1.offset;
        if (c0 && c1.mid != c0->mid) {
            const double f = static_cast<double>(t - c0->mid) / static_cast<double>(c1.mid - c0->mid);
            off = c0->offset + (c1.offset - c0->offset) * f;
        }
        return t + std::llround(off);
    }
};

// ----------------------------------------------------------------- JSON

void append_escaped(std::string& out, const char* s) {
    out += '"';
    for (; *s; ++s) {
        const unsigned char ch = static_cast<unsigned char>(*s);
        if (ch == '"' || ch == '\\') {
            out += '\\';
            out += static_cast<char>(ch);
        } else if (ch < 0x20) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\u%04x", ch);
            out += buf;
        } else {
            out += static_cast<char>(ch);
        }
    }
    out += '"';
}

// ns as microseconds with three decimals, exactly.
void append_us(std::string& out, std::int64_t ns) {
    const std::uint64_t a = ns < 0 ? -static_cast<std::uint64_t>(ns) : static_cast<std::uint64_t>(ns);
    char buf[32];
    char* p = buf;
    if (ns < 0) *p++ = '-';
    p = std::to_chars(p, buf + sizeof buf, a / 1000).ptr;
    const auto frac = static_cast<unsigned>(a % 1000);
    *p++ = '.';
    *p++ = static_cast<char>('0' + frac / 100);
    *p++ = static_cast<char>('0' + frac / 10 % 10);
    *p++ = static_cast<char>('0' + frac % 10);
    out.append(buf, p);
}

void append_int(std::string& out, long long v) {
    char buf[24];
    out.append(buf, std::to_chars(buf, buf + sizeof buf, v).ptr);
}

const char* op_label(int op) {
    if (op < 0) return nullptr;
    if (op < 10) return op_name(static_cast<Op>(op));
    return "user-defined";
}

struct ThreadEvents {
    int tid = 0;
    std::vector<Event> events;  // sorted by before()
    std::vector<Collective> colls;
};

// Parents before children: by start, then longer first, regions before collectives.
bool before(const Event& a, const Event& b) {
    if (a.t0 != b.t0) return a.t0 < b.t0;
    if (a.t1 != b.t1) return a.t1 > b.t1;
    return (a.coll == 0) > (b.coll == 0);
}

// Text built in a fixed buffer and handed to a sink in pieces of about 1 MiB.
class Chunker {
public:
    explicit Chunker(std::function<void(const std::string&)> sink) : sink_(std::move(sink)) {
        out.reserve(limit + 4096);
    }
    void maybe_flush() {
        if (out.size() >= limit) flush();
    }
    void flush() {
        if (!out.empty()) sink_(out);
        out.clear();
    }
    std::string out;

private:
    static constexpr std::size_t limit = std::size_t{1} << 20;
    std::function<void(const std::string&)> sink_;
};

// The traceEvents entries of this rank (without brackets), times aligned and
// relative to origin.
// Lanes are named "rank R (host)".
void events_json(Chunker& ch, int rank, int main_tid, const std::vector<ThreadEvents>& threads,
                 const ClockMap& map, std::int64_t origin) {
    std::string& out = ch.out;
    const std::string pid = std::to_string(rank);
    out += "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" + pid +
           ",\"tid\":0,\"args\":{\"name\":\"rank " + pid + " (" + map.c1.host + ")\",\"host\":\"" +
           map.c1.host + "\"}}";
    out += ",\n{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":" + pid +
           ",\"tid\":0,\"args\":{\"sort_index\":" + pid + "}}";
    for (const auto& t : threads) {
        const std::string tid = std::to_string(t.tid);
        const std::string tname = t.tid == main_tid ? "main" : "thread " + tid;
        out += ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":" + pid + ",\"tid\":" + tid +
               ",\"args\":{\"name\":\"" + tname + "\"}}";
        out += ",\n{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":" + pid +
               ",\"tid\":" + tid + ",\"args\":{\"sort_index\":" + tid + "}}";
    }
    for (const auto& t : threads) {
        const std::string where = ",\"pid\":" + pid + ",\"tid\":" + std::to_string(t.tid);
        for (const auto& ev : t.events) {
            ch.maybe_flush();
            const std::int64_t a = map(ev.t0) - origin, b = map(ev.t1) - origin;
            out += ",\n{\"name\":";
            append_escaped(out, ev.name);
            out += ev.coll ? ",\"cat\":\"mpi\"" : ",\"cat\":\"region\"";
            out += ",\"ph\":\"X\",\"ts\":";
            append_us(out, a);
            out += ",\"dur\":";
            append_us(out, b - a);
            out += where;
            if (ev.coll) {
                const Collective& e = t.colls[ev.coll - 1];
                out += ",\"args\":{\"call\":";
                append_escaped(out, e.call);
                out += ",\"bytes\":";
                append_int(out, static_cast<long long>(e.bytes));
                out += ",\"count\":";
                append_int(out, static_cast<long long>(e.count));
                if (e.type) {
                    out += ",\"type\":";
                    append_escaped(out, e.type);
                }
                if (const char* op = op_label(e.op)) {
                    out += ",\"op\":";
                    append_escaped(out, op);
                }
                if (e.root >= 0) {
                    out += ",\"root\":";
                    append_int(out, e.root);
                }
                out += ",\"seq\":";
                append_int(out, static_cast<long long>(e.seq));
                if (e.wait_ns >= 0) {
                    out += ",\"wait_us\":";
                    append_us(out, e.wait_ns);
                    out += e.wait_exact ? ",\"wait_from\":\"entry times\""
                                        : ",\"wait_from\":\"mismatch check\"";
                }
                if (e.check_ns >= 0) {
                    out += ",\"check_us\":";
                    append_us(out, e.check_ns);
                }
                out += "}}";
                // The wait as a child slice, so that it shows in the timeline.
                if (e.wait_ns > 0) {
                    out += ",\n{\"name\":\"wait\",\"cat\":\"mpi_wait\",\"ph\":\"X\",\"ts\":";
                    append_us(out, a);
                    out += ",\"dur\":";
                    append_us(out, std::min(e.wait_ns, b - a));
                    out += where + "}";
                }
            } else {
                out += "}";
            }
        }
    }
    ch.flush();
}

// -------------------------------------------------------------- summary

struct Agg {
    std::uint64_t calls = 0;
    std::int64_t total = 0;  // ns inside the region / collective
    std::int64_t mpi = 0;    // ns in collectives inside it
    std::int64_t wait = 0;   // ns waiting for other ranks inside it
};
using AggKey = std::pair<int, std::string>;  // kind (0 region, 1 collective), name

std::map<AggKey, Agg> aggregate(const std::vector<ThreadEvents>& threads) {
    // By name pointer first (cheap), then merged by name text.
    std::map<std::pair<int, const char*>, Agg> agg;
    for (const auto& t : threads) {
        std::vector<const Event*> open;  // enclosing regions
        for (const auto& e : t.events) {
            while (!open.empty() && open.back()->t1 <= e.t0) open.pop_back();
            const std::int64_t dur = e.t1 - e.t0;
            if (!e.coll) {
                auto& a = agg[{0, e.name}];
                ++a.calls;
                a.total += dur;
                open.push_back(&e);
                continue;
            }
            const std::int64_t wait = std::max<std::int64_t>(t.colls[e.coll - 1].wait_ns, 0);
            auto& a = agg[{1, e.name}];
            ++a.calls;
            a.total += dur;
            a.mpi += dur;
            a.wait += wait;
            for (std::size_t i = 0; i < open.size(); ++i) {
                bool repeat = false;  // a recursive region counts once
                for (std::size_t j = 0; j < i && !repeat; ++j)
                    repeat = std::strcmp(open[j]->name, open[i]->name) == 0;
                if (repeat) continue;
                auto& ra = agg[{0, open[i]->name}];
                ra.mpi += dur;
                ra.wait += wait;
            }
        }
    }
    std::map<AggKey, Agg> out;
    for (const auto& [k, a] : agg) {
        auto& o = out[{k.first, k.second}];
        o.calls += a.calls;
        o.total += a.total;
        o.mpi += a.mpi;
        o.wait += a.wait;
    }
    return out;
}

template <class T>
void put(std::string& s, const T& v) {
    s.append(reinterpret_cast<const char*>(&v), sizeof v);
}
template <class T>
T take(const char*& p) {
    T v;
    std::memcpy(&v, p, sizeof v);
    p += sizeof v;
    return v;
}

std::string pack(const std::map<AggKey, Agg>& agg) {
    std::string s;
    for (const auto& [k, a] : agg) {
        put(s, static_cast<std::uint32_t>(k.second.size()));
        s += k.second;
        put(s, static_cast<std::int32_t>(k.first));
        put(s, a);
    }
    return s;
}

void unpack(const char* p, const char* end, int rank, int size,
            std::map<AggKey, std::vector<Agg>>& rows) {
    while (p < end) {
        const auto n = take<std::uint32_t>(p);
        std::string name(p, n);
        p += n;
        const auto kind = take<std::int32_t>(p);
        auto& v = rows[{kind, std::move(name)}];
        v.resize(static_cast<std::size_t>(size));
        v[static_cast<std::size_t>(rank)] = take<Agg>(p);
    }
}

struct Row {
    std::string name;
    const char* kind;
    int ranks = 0;
    std::uint64_t calls_min = 0, calls_max = 0;
    double min = 0, mean = 0, max = 0, share = 0, imbalance = 0, mpi = 0, wait = 0;
};

std::vector<Row> summarize(const std::map<AggKey, std::vector<Agg>>& rows, int size,
                           double wall) {
    std::vector<Row> out;
    for (const auto& [k, v] : rows) {
        Row r;
        r.name = k.second;
        r.kind = k.first == 0 ? "region" : "mpi";
        r.calls_min = UINT64_MAX;
        r.min = INFINITY;
        double sum = 0, mpi = 0, wait = 0;
        for (int i = 0; i < size; ++i) {
            const Agg a = i < static_cast<int>(v.size()) ? v[i] : Agg{};
            const double t = static_cast<double>(a.total) * 1e-9;
            r.ranks += a.calls > 0;
            r.calls_min = std::min(r.calls_min, a.calls);
            r.calls_max = std::max(r.calls_max, a.calls);
            r.min = std::min(r.min, t);
            r.max = std::max(r.max, t);
            sum += t;
            mpi += static_cast<double>(a.mpi) * 1e-9;
            wait += static_cast<double>(a.wait) * 1e-9;
        }
        r.mean = sum / size;
        r.mpi = mpi / size;
        r.wait = wait / size;
        r.share = wall > 0 ? r.mean / wall : 0;
        r.imbalance = r.max > 0 ? (r.max - r.mean) / r.max : 0;
        out.push_back(std::move(r));
    }
    std::stable_sort(out.begin(), out.end(), [](const Row& a, const Row& b) {
        if (std::strcmp(a.kind, b.kind) != 0) return std::strcmp(a.kind, b.kind) > 0;
        return a.mean > b.mean;
    });
    return out;
}

std::string csv_field(const std::string& s) {
    if (s.find_first_of(",\"\n") == std::string::npos) return s;
    std::string q = "\"";
    for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
    return q + "\"";
}

std::string fmt(const char* f, double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, f, v);
    return buf;
}

std::string summary_csv(const std::vector<Row>& rows) {
    std::string s =
        "name,kind,ranks,calls_min,calls_max,min_s,mean_s,max_s,share_of_wall,imbalance,"
        "mpi_mean_s,wait_mean_s\n";
    for (const auto& r : rows)
        s += csv_field(r.name) + "," + r.kind + "," + std::to_string(r.ranks) + "," +
             std::to_string(r.calls_min) + "," + std::to_string(r.calls_max) + "," +
             fmt("%.9f", r.min) + "," + fmt("%.9f", r.mean) + "," + fmt("%.9f", r.max) + "," +
             fmt("%.6f", r.share) + "," + fmt("%.6f", r.imbalance) + "," + fmt("%.9f", r.mpi) +
             "," + fmt("%.9f", r.wait) + "\n";
    return s;
}

std::string summary_json(const std::vector<Row>& rows, int size, double wall) {
    std::string s = "{\"ranks\":" + std::to_string(size) + ",\"wall_s\":" + fmt("%.9f", wall) +
                    ",\n\"rows\":[";
    bool first = true;
    for (const auto& r : rows) {
        s += first ? "\n" : ",\n";
        first = false;
        s += "{\"name\":";
        append_escaped(s, r.name.c_str());
        s += std::string(",\"kind\":\"") + r.kind + "\",\"ranks\":" + std::to_string(r.ranks) +
             ",\"calls_min\":" + std::to_string(r.calls_min) +
             ",\"calls_max\":" + std::to_string(r.calls_max) + ",\"min_s\":" + fmt("%.9f", r.min) +
             ",\"mean_s\":" + fmt("%.9f", r.mean) + ",\"max_s\":" + fmt("%.9f", r.max) +
             ",\"share_of_wall\":" + fmt("%.6f", r.share) +
             ",\"imbalance\":" + fmt("%.6f", r.imbalance) + ",\"mpi_mean_s\":" + fmt("%.9f", r.mpi) +
             ",\"wait_mean_s\":" + fmt("%.9f", r.wait) + "}";
    }
    return s + "\n]}\n";
}

std::string summary_table(const std::vector<Row>& rows, int size, double wall,
                          const std::string& dir) {
    std::size_t w = 6;
    for (const auto& r : rows) w = std::max(w, r.name.size());
    w = std::min<std::size_t>(w, 40);
    std::string s = "mpiml profile: " + std::to_string(size) + (size == 1 ? " rank" : " ranks") +
                    ", wall " + fmt("%.3f", wall) + " s; times in s per rank (min/mean/max over "
                    "ranks), mpi = in collectives, wait = for other ranks\n";
    char line[256];
    std::snprintf(line, sizeof line, "%-*s %-6s %5s %11s %10s %10s %10s %6s %6s %10s %10s\n",
                  static_cast<int>(w), "name", "kind", "ranks", "calls", "min", "mean", "max",
                  "%wall", "imbal", "mpi", "wait");
    s += line;
    for (const auto& r : rows) {
        const std::string calls = r.calls_min == r.calls_max
                                      ? std::to_string(r.calls_max)
                                      : std::to_string(r.calls_min) + "-" + std::to_string(r.calls_max);
        std::string name = r.name.size() > w ? r.name.substr(0, w - 3) + "..." : r.name;
        std::snprintf(line, sizeof line,
                      "%-*s %-6s %5d %11s %10.4f %10.4f %10.4f %5.1f%% %6.3f %10.4f %10.4f\n",
                      static_cast<int>(w), name.c_str(), r.kind, r.ranks, calls.c_str(), r.min, r.mean,
                      r.max, 100.0 * r.share, r.imbalance, r.mpi, r.wait);
        s += line;
    }
    s += "files: " + dir + "/profile_<rank>.json, " + dir + "/timeline.json (open in " +
         "https://ui.perfetto.dev or chrome://tracing), " + dir + "/summary.csv, " + dir +
         "/summary.json, " + dir + "/imbalance.svg";
    return s;
}

std::string write_file(const std::string& path, const std::string& head, const std::string& body,
                       const std::string& tail) {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f << head << body << tail;
    f.close();
    return f ? "" : "cannot write '" + path + "'";
}

// Wait for the slowest rank of each MPI_COMM_WORLD collective, from entry
// times on the aligned clock: max over ranks (broadcast: root's) - my entry.
// Returns false when ranks recorded different numbers of world collectives.
bool measure_waits(std::vector<ThreadEvents>& threads, const ClockMap& map, MPI_Comm comm,
                   int rank) {
    struct World {
        const Event* e;
        Collective* c;
    };
    std::vector<World> world;
    for (auto& t : threads)
        for (const auto& e : t.events)
            if (e.coll && t.colls[e.coll - 1].world_index >= 0)
                world.push_back({&e, &t.colls[e.coll - 1]});
    std::sort(world.begin(), world.end(),
              [](const World& a, const World& b) { return a.c->world_index < b.c->world_index; });
    const auto n = static_cast<std::int64_t>(world.size());
    if (!agree(&n, 1, comm, "mpiml::profile_stop")) return false;
    std::vector<std::int64_t> entry(2 * static_cast<std::size_t>(n), INT64_MIN);
    for (std::int64_t i = 0; i < n; ++i) {
        const auto [e, c] = world[i];
        entry[i] = map(e->t0);
        if (c->kind == Kind::broadcast && c->root == rank) entry[n + i] = entry[i];
    }
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, entry.data(), static_cast<int>(2 * n), MPI_INT64_T,
                            MPI_MAX, comm),
              "mpiml::profile_stop");
    for (std::int64_t i = 0; i < n; ++i) {
        const auto [e, c] = world[i];
        const std::int64_t last = c->kind == Kind::broadcast ? entry[n + i] : entry[i];
        const std::int64_t dur = map(e->t1) - map(e->t0);
        c->wait_ns = std::clamp<std::int64_t>(last - map(e->t0), 0, std::max<std::int64_t>(dur, 0));
        c->wait_exact = true;
    }
    return true;
}

// A rank's events text travels to rank 0 in chunks; an empty one ends it.
void send_chunk(const std::string& text, MPI_Comm comm) {
    check_mpi(MPI_Send(text.data(), static_cast<int>(text.size()), MPI_CHAR, 0, 4, comm),
              "mpiml::profile_stop");
}

void recv_text(int from, std::ofstream& f, MPI_Comm comm) {
    std::string buf;
    for (;;) {
        MPI_Status st;
        check_mpi(MPI_Probe(from, 4, comm, &st), "mpiml::profile_stop");
        int n = 0;
        MPI_Get_count(&st, MPI_CHAR, &n);
        buf.resize(static_cast<std::size_t>(n));
        check_mpi(MPI_Recv(buf.data(), n, MPI_CHAR, from, 4, comm, MPI_STATUS_IGNORE),
                  "mpiml::profile_stop");
        if (n == 0) return;
        f << buf;
    }
}

// Every rank learns whether any rank failed; throws on all ranks if so.
void all_succeeded(const std::string& error, MPI_Comm comm, const char* call) {
    int bad = error.empty() ? 0 : 1;
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, comm), call);
    if (!error.empty()) fail(call, error);
    if (bad) fail(call, "failed on another rank");
}

// What profile_stop writes with: this rank's place and the aligned clock.
struct Output {
    std::string dir;
    MPI_Comm comm;
    int rank, size;
    ClockMap map;
    std::int64_t origin;  // the timeline's zero, on the aligned clock
    double wall;          // seconds, earliest start to latest stop
    bool waits;           // wait times measured
    int main_tid;
    const char* alone = nullptr;  // written by this rank alone: why
};

// A copy of one thread's buffer (its lock held).
ThreadEvents copy_events(const ThreadBuffer& t) {
    ThreadEvents te;
    te.tid = t.tid;
    te.events.resize(t.events.size());
    for (std::size_t i = 0; i < te.events.size(); ++i) te.events[i] = t.events[i];
    te.colls.resize(t.colls.size());
    for (std::size_t i = 0; i < te.colls.size(); ++i) te.colls[i] = t.colls[i];
    return te;
}

// Every thread's recorded events, moved out of the live buffers and sorted.
std::vector<ThreadEvents> take_events(Profiler& p, std::string& dir) {
    std::vector<ThreadEvents> threads;
    {
        std::lock_guard lock(p.m);
        dir = p.dir;
        for (auto& t : p.threads) {
            std::lock_guard tl(t->m);
            if (t->events.size() == 0 && t->tid != p.main_tid) continue;
            threads.push_back(copy_events(*t));
            t->events.clear();
            t->colls.clear();
        }
    }
    for (auto& t : threads) std::sort(t.events.begin(), t.events.end(), before);
    return threads;
}

// dir/profile_<rank>.json; returns an error text or "".
std::string write_rank_file(const Output& o, const std::vector<ThreadEvents>& threads,
                            bool from_env) {
    const std::string path = o.dir + "/profile_" + std::to_string(o.rank) + ".json";
    char other[512];
    std::snprintf(other, sizeof other,
                  "\n],\n\"displayTimeUnit\":\"ms\",\n\"otherData\":{\"rank\":%d,\"ranks\":%d,"
                  "\"wall_s\":%.9f,\"clock\":{\"offset_ns\":%.0f,\"measured_offset_ns\":%.0f,"
                  "\"rtt_ns\":%lld,\"same_host_as_rank_0\":%s},\"wait_times\":\"%s\","
                  "\"started_by\":\"%s\"}}\n",
                  o.rank, o.size, o.wall, o.map.c1.offset, o.map.c1.measured,
                  static_cast<long long>(o.map.c1.rtt), o.map.c1.same_host ? "true" : "false",
                  o.waits ? "measured"
                          : o.alone ? o.alone
                                    : "omitted: ranks issued different numbers of collectives",
                  from_env ? "MPIML_PROFILE" : "profile_start");
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f << "{\"traceEvents\":[\n";
    Chunker ch([&](const std::string& text) { f << text; });
    events_json(ch, o.rank, o.main_tid, threads, o.map, o.origin);
    f << other;
    f.close();
    return f ? "" : "cannot write '" + path + "'";
}

// The merged timeline, streamed rank by rank into rank 0's dir/timeline.json.
std::string write_timeline(const Output& o, const std::vector<ThreadEvents>& threads) {
    if (o.rank != 0) {
        Chunker ch([&](const std::string& text) { send_chunk(text, o.comm); });
        events_json(ch, o.rank, o.main_tid, threads, o.map, o.origin);
        send_chunk("", o.comm);
        return "";
    }
    std::ofstream f(o.dir + "/timeline.json", std::ios::binary | std::ios::trunc);
    f << "{\"traceEvents\":[\n";
    Chunker ch([&](const std::string& text) { f << text; });
    events_json(ch, o.rank, o.main_tid, threads, o.map, o.origin);
    for (int r = 1; r < o.size; ++r) {
        f << ",\n";
        recv_text(r, f, o.comm);
    }
    char other[256];
    std::snprintf(other, sizeof other,
                  "\n],\n\"displayTimeUnit\":\"ms\",\n\"otherData\":{\"ranks\":%d,"
                  "\"wall_s\":%.9f,\"clocks\":\"aligned to rank 0\"}}\n",
                  o.size, o.wall);
    f << other;
    f.close();
    return f ? "" : "cannot write '" + o.dir + "/timeline.json'";
}

// imbalance.svg: one bar a rank, its wall time split into compute (outside
// collectives), time in collectives and, of that, waiting for other ranks.
// printf into a std::string (the SVG's elements).
template <class... A>
std::string svgf(const char* f, A... a) {
    const int n = std::snprintf(nullptr, 0, f, a...);
    std::string out(static_cast<std::size_t>(std::max(n, 0)), '\0');
    std::snprintf(out.data(), out.size() + 1, f, a...);
    return out;
}

std::string imbalance_svg(const std::map<AggKey, std::vector<Agg>>& rows, int size, double wall) {
    std::vector<double> mpi(static_cast<std::size_t>(size)), wait(static_cast<std::size_t>(size));
    for (const auto& [k, v] : rows) {
        if (k.first != 1) continue;
        for (int r = 0; r < size && r < static_cast<int>(v.size()); ++r) {
            mpi[r] += static_cast<double>(v[r].total) * 1e-9;
            wait[r] += static_cast<double>(v[r].wait) * 1e-9;
        }
    }
    const double w = 520, x0 = 70, bar = 18, gap = 8, top = 40;
    const double height = top + size * (bar + gap) + 40;
    const double scale = wall > 0 ? w / wall : 0;
    std::string s = svgf("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"640\" height=\"%.0f\" "
                        "font-family=\"sans-serif\" font-size=\"12\">\n", height);
    s += svgf("<text x=\"10\" y=\"20\">time per rank, wall %.3f s: compute, in collectives "
             "(busy), waiting for other ranks</text>\n", wall);
    for (int r = 0; r < size; ++r) {
        const double m = std::min(mpi[r], wall), wt = std::min(wait[r], m);
        const double compute = std::max(wall - m, 0.0), busy = m - wt;
        const double y = top + r * (bar + gap);
        s += svgf("<text x=\"10\" y=\"%.1f\">rank %d</text>\n", y + 13, r);
        double x = x0;
        const std::pair<const char*, double> parts[] = {
            {"compute", compute}, {"mpi", busy}, {"wait", wt}};
        const char* colors[] = {"#4c78a8", "#f58518", "#e45756"};
        for (int i = 0; i < 3; ++i) {
            const double len = parts[i].second * scale;
            s += svgf("<rect class=\"%s\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.0f\" "
                     "fill=\"%s\"><title>rank %d %s %.6f s</title></rect>\n",
                     parts[i].first, x, y, len, bar, colors[i], r, parts[i].first, parts[i].second);
            x += len;
        }
    }
    const double ly = top + size * (bar + gap) + 14;
    const char* names[] = {"compute", "in collectives", "waiting"};
    const char* colors[] = {"#4c78a8", "#f58518", "#e45756"};
    for (int i = 0; i < 3; ++i) {
        s += svgf("<rect x=\"%.0f\" y=\"%.0f\" width=\"12\" height=\"12\" fill=\"%s\"/>"
                 "<text x=\"%.0f\" y=\"%.0f\">%s</text>\n",
                 x0 + i * 150.0, ly, colors[i], x0 + i * 150.0 + 16, ly + 11, names[i]);
    }
    return s + "</svg>\n";
}

// Every rank's totals to rank 0, which prints the table and writes
// summary.csv, summary.json and imbalance.svg.
std::string write_summary(const Output& o, const std::vector<ThreadEvents>& threads,
                          std::int64_t stop) {
    constexpr const char* call = "mpiml::profile_stop";
    const std::string mine = pack(aggregate(threads));
    int n = static_cast<int>(mine.size());
    std::vector<int> counts(static_cast<std::size_t>(o.size)), displs(static_cast<std::size_t>(o.size));
    check_mpi(MPI_Gather(&n, 1, MPI_INT, counts.data(), 1, MPI_INT, 0, o.comm), call);
    std::string all;
    if (o.rank == 0) {
        long long total = 0;
        for (int r = 0; r < o.size; ++r) {
            displs[r] = static_cast<int>(total);
            total += counts[r];
        }
        all.resize(static_cast<std::size_t>(total));
    }
    check_mpi(MPI_Gatherv(mine.data(), n, MPI_CHAR, all.data(), counts.data(), displs.data(),
                          MPI_CHAR, 0, o.comm),
              call);
    if (o.rank != 0) return "";
    std::map<AggKey, std::vector<Agg>> rows;
    for (int r = 0; r < o.size; ++r)
        unpack(all.data() + displs[r], all.data() + displs[r] + counts[r], r, o.size, rows);
    const auto table = summarize(rows, o.size, o.wall);
    std::string text = summary_table(table, o.size, o.wall, o.dir);
    text += "; written in " + fmt("%.3f", static_cast<double>(profile_now() - stop) * 1e-9) +
            " s\n";
    if (!o.waits)
        text += "note: ranks issued different numbers of collectives on MPI_COMM_WORLD; "
                "wait times are not measured\n";
    std::fputs(text.c_str(), stdout);
    std::fflush(stdout);
    std::string e = write_file(o.dir + "/summary.csv", "", summary_csv(table), "");
    if (e.empty()) e = write_file(o.dir + "/summary.json", "", summary_json(table, o.size, o.wall), "");
    if (e.empty()) e = write_file(o.dir + "/imbalance.svg", "", imbalance_svg(rows, o.size, o.wall), "");
    return e;
}

}  // namespace

const char* profile_intern(const std::string& name) {
    auto& p = prof();
    std::lock_guard lock(p.m);
    return p.names.insert(name).first->c_str();
}

void profile_region(const char* name, std::int64_t t0, std::uint32_t generation) {
    const std::int64_t t1 = profile_now();
    if (!profile_on.load(std::memory_order_relaxed) ||
        generation != profile_generation.load(std::memory_order_relaxed))
        return;
    push(Event{name, t0, t1, 0});
}

void profile_collective(const ProfileMark& m) {
    const std::int64_t t1 = profile_now();
    if (!profile_on.load(std::memory_order_relaxed) ||
        m.generation != profile_generation.load(std::memory_order_relaxed))
        return;
    Collective c{};
    c.call = m.info.call;
    c.count = m.info.count;
    if (m.info.type != MPI_DATATYPE_NULL) {
        int size = 0;
        MPI_Type_size(m.info.type, &size);
        c.bytes = m.info.count * static_cast<std::uint64_t>(size);
        c.type = datatype_name(m.info.type);
    }
    c.seq = m.seq;
    c.check_ns = m.check_ns;
    c.wait_ns = m.check_ns;  // -1 or the check's time; replaced by the exact wait on the world
    c.op = m.info.op_id;
    c.root = m.info.root;
    c.kind = m.info.kind;
    c.world_index = m.info.comm == MPI_COMM_WORLD ? prof().world_count.fetch_add(1) : -1;
    push(Event{kind_name(m.info.kind), m.t0, t1, 0}, c);
}

void profile_discard() {
    if (!profile_on.exchange(false)) return;
    profile_generation.fetch_add(1);
}

void profile_from_environment() {
    const std::string& dir_s = env_config().profile_dir;
    if (dir_s.empty() || profiling()) return;
    const char* dir = dir_s.c_str();
    if (const std::string err = make_dir(dir); !err.empty())
        fail("mpiml", std::string("MPIML_PROFILE: ") + err);
    begin_recording(dir, true);
    buffer().events.prepare();
    prof().main_tid = tl_buffer->tid;
    profile_on = true;
}

}  // namespace detail

using detail::prof;

void profile_start(std::string dir) {
    constexpr const char* call = "mpiml::profile_start";
    if (dir.empty()) detail::fail(call, "empty directory name");
    ensure_initialized(call);
    auto& p = prof();
    if (profiling()) {
        std::lock_guard lock(p.m);
        p.dir = std::move(dir);
        return;
    }
    MPI_Comm comm = MPI_COMM_NULL;
    detail::check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &comm), call);
    try {
        detail::all_succeeded(detail::make_dir(dir), comm, call);
        detail::begin_recording(dir, false);
        p.clock0 = detail::sync_clocks(comm, call);
    } catch (...) {
        MPI_Comm_free(&comm);
        throw;
    }
    MPI_Comm_free(&comm);
    detail::buffer().events.prepare();
    p.main_tid = detail::tl_buffer->tid;
    detail::profile_on = true;
}

std::string profile_dir() {
    if (!profiling()) return "";
    auto& p = prof();
    std::lock_guard lock(p.m);
    return p.dir;
}

namespace detail {
void profile_write_own() noexcept {
    if (!profiling()) return;
    try {
        const std::int64_t stop = profile_now();
        profile_on = false;
        auto& p = prof();
        std::unique_lock lock(p.m, std::try_to_lock);  // never wait on the way out
        if (!lock) return;
        std::vector<ThreadEvents> threads;
        for (auto& t : p.threads) {
            std::unique_lock tl(t->m, std::try_to_lock);
            if (!tl || (t->events.size() == 0 && t->tid != p.main_tid)) continue;
            threads.push_back(copy_events(*t));
        }
        for (auto& t : threads) std::sort(t.events.begin(), t.events.end(), before);
        const auto& st = state();
        Clock own;
        char host[256] = {};
        if (::gethostname(host, sizeof host - 1) == 0) own.host = host;
        Output out{p.dir, MPI_COMM_NULL, st.world_rank, st.world_size, {std::nullopt, own},
                   p.start, static_cast<double>(stop - p.start) * 1e-9, false, p.main_tid,
                   "omitted: written by this rank alone as it ended the job (its own clock)"};
        std::string error = make_dir(p.dir);
        if (error.empty()) error = write_rank_file(out, threads, p.from_env);
        const std::string head = "[mpiml] rank " + std::to_string(out.rank) + "/" + std::to_string(out.size);
        const std::string line =
            error.empty() ? head + ": its profile until it ended the job: " + p.dir + "/profile_" +
                                std::to_string(out.rank) + ".json\n"
                          : head + ": its profile not written: " + error + "\n";
        std::fputs(line.c_str(), stderr);
        std::fflush(stderr);
    } catch (...) {
    }
}
}  // namespace detail

void profile_stop() {
    using namespace detail;
    constexpr const char* call = "mpiml::profile_stop";
    if (!profiling()) return;
    const std::int64_t stop = profile_now();
    profile_on = false;
    profile_generation.fetch_add(1);
    if (is_finalized()) fail(call, "MPI is finalized; the profile cannot be written");
    auto& p = prof();
    std::string dir;
    std::vector<ThreadEvents> threads = take_events(p, dir);

    MPI_Comm comm = MPI_COMM_NULL;
    check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &comm), call);
    struct FreeComm {
        MPI_Comm* c;
        ~FreeComm() { MPI_Comm_free(c); }
    } free_comm{&comm};
    Output out{dir, comm, 0, 0, {p.clock0, sync_clocks(comm, call)}, 0, 0.0, false, p.main_tid};
    MPI_Comm_rank(comm, &out.rank);
    MPI_Comm_size(comm, &out.size);
    // Origin of the timeline: the earliest start; wall: to the latest stop.
    std::int64_t span[2] = {-out.map(p.start), out.map(stop)};
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, span, 2, MPI_INT64_T, MPI_MAX, comm), call);
    out.origin = -span[0];
    out.wall = static_cast<double>(span[1] - out.origin) * 1e-9;
    out.waits = measure_waits(threads, out.map, comm, out.rank);

    std::string error = make_dir(dir);
    if (error.empty()) error = write_rank_file(out, threads, p.from_env);
    if (const std::string e = write_timeline(out, threads); error.empty()) error = e;
    if (const std::string e = write_summary(out, threads, stop); error.empty()) error = e;
    all_succeeded(error, comm, call);
}

}  // namespace mpiml
