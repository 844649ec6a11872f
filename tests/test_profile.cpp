// Profiler: regions and collective records, per-rank Chrome-trace files, the
// merged timeline and the summary.
#include <mpiml/mpiml.hpp>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

using nlohmann::json;
namespace fs = std::filesystem;

namespace {

// Every rank's MPI processor name (collective).
std::vector<std::string> all_hosts() {
    char name[MPI_MAX_PROCESSOR_NAME] = {};
    int len = 0;
    MPI_Get_processor_name(name, &len);
    std::vector<char> all(static_cast<std::size_t>(mpiml::num_procs()) * MPI_MAX_PROCESSOR_NAME);
    MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR,
                  MPI_COMM_WORLD);
    std::vector<std::string> out;
    for (int r = 0; r < mpiml::num_procs(); ++r) out.emplace_back(all.data() + r * MPI_MAX_PROCESSOR_NAME);
    return out;
}

// A fresh directory name, the same on every rank.
class TempDir {
public:
    TempDir() {
        if (mpiml::proc_id() == 0) {
            char tmpl[] = "/tmp/mpiml_profile_XXXXXX";
            path_ = mkdtemp(tmpl);
        }
        mpiml::broadcast(path_);
    }
    ~TempDir() {
        mpiml::barrier();
        if (mpiml::proc_id() == 0 && !std::getenv("MPIML_TEST_KEEP")) fs::remove_all(path_);
    }
    const std::string& path() const { return path_; }
    std::string operator/(const std::string& name) const { return path_ + "/" + name; }

private:
    std::string path_;
};

json read_json(const std::string& path) {
    std::ifstream f(path);
    if (!f) throw std::runtime_error("cannot open " + path);
    return json::parse(f);  // throws on malformed JSON
}

std::string own_file(const TempDir& d) {
    return d / ("profile_" + std::to_string(mpiml::proc_id()) + ".json");
}

// Complete ("X") events, optionally of one name.
std::vector<json> slices(const json& trace, const std::string& name = "") {
    std::vector<json> out;
    for (const auto& e : trace.at("traceEvents"))
        if (e.at("ph") == "X" && (name.empty() || e.at("name") == name)) out.push_back(e);
    return out;
}

std::set<std::string> names(const json& trace) {
    std::set<std::string> s;
    for (const auto& e : slices(trace)) s.insert(e.at("name").get<std::string>());
    return s;
}

// Timestamps never decrease within one (pid, tid) lane, durations are >= 0.
void expect_monotonic(const json& trace) {
    std::map<std::pair<int, int>, double> last;
    std::size_t n = 0;
    for (const auto& e : trace.at("traceEvents")) {
        if (!e.contains("ts")) continue;
        const auto lane = std::make_pair(e.at("pid").get<int>(), e.at("tid").get<int>());
        const double ts = e.at("ts").get<double>();
        if (last.count(lane)) EXPECT_GE(ts, last[lane]) << e.dump();
        last[lane] = ts;
        if (e.contains("dur")) EXPECT_GE(e.at("dur").get<double>(), 0.0) << e.dump();
        ++n;
    }
    EXPECT_GT(n, 0u);
}

std::vector<std::map<std::string, std::string>> read_csv(const std::string& path) {
    std::ifstream f(path);
    std::string line;
    std::getline(f, line);
    std::vector<std::string> header;
    std::stringstream hs(line);
    for (std::string c; std::getline(hs, c, ',');) header.push_back(c);
    std::vector<std::map<std::string, std::string>> rows;
    while (std::getline(f, line)) {
        std::stringstream ls(line);
        std::map<std::string, std::string> row;
        std::size_t i = 0;
        for (std::string c; std::getline(ls, c, ',') && i < header.size(); ++i) row[header[i]] = c;
        rows.push_back(row);
    }
    return rows;
}

using namespace std::chrono_literals;
constexpr auto step = 30ms;  // "work" lasts rank * step

}  // namespace

TEST(Profile, RegionWhenOffRecordsNothing) {
    ASSERT_FALSE(mpiml::profiling());
    EXPECT_EQ(mpiml::profile_dir(), "");
    {
        mpiml::Region r("off_region");
        EXPECT_EQ(mpiml::mpi_sum(1), mpiml::num_procs());
    }
    TempDir d1, d2;
    std::optional<mpiml::Region> across_start;
    across_start.emplace("open_across_start");
    mpiml::profile_start(d1.path());
    EXPECT_TRUE(mpiml::profiling());
    across_start.reset();
    { mpiml::Region r("on_region"); }
    std::optional<mpiml::Region> across_stop;
    across_stop.emplace("open_across_stop");
    mpiml::profile_stop();
    across_stop.reset();
    EXPECT_FALSE(mpiml::profiling());
    { mpiml::Region r("after_stop"); }

    const auto n1 = names(read_json(own_file(d1)));
    EXPECT_TRUE(n1.count("on_region"));
    for (const char* absent : {"off_region", "open_across_start", "open_across_stop",
                               "after_stop", "allreduce"})
        EXPECT_FALSE(n1.count(absent)) << absent;

    // A second profile starts empty.
    mpiml::profile_start(d2.path());
    { mpiml::Region r("second"); }
    mpiml::profile_stop();
    const auto n2 = names(read_json(own_file(d2)));
    EXPECT_TRUE(n2.count("second"));
    EXPECT_FALSE(n2.count("on_region"));
}

TEST(Profile, FilesTimelineAndSummary) {
    const int rank = mpiml::proc_id(), size = mpiml::num_procs();
    const std::vector<std::string> hosts = all_hosts();
    const auto host = [&] { return hosts[static_cast<std::size_t>(rank)]; };
    const auto host_of_rank_0 = [&] { return hosts[0]; };
    TempDir d;
    mpiml::profile_start(d.path());
    ASSERT_EQ(mpiml::profile_dir(), d.path());
    std::thread worker([] {
        for (int i = 0; i < 5; ++i) {
            mpiml::Region r("worker_step");
            std::this_thread::sleep_for(1ms);
        }
    });
    {
        mpiml::Region outer("outer");
        for (int i = 0; i < 3; ++i) {
            mpiml::Region inner("inner");
            std::vector<double> v(1000, rank);
            mpiml::allreduce(v, mpiml::Op::sum);
        }
        {
            mpiml::Region work("work");
            std::this_thread::sleep_for(rank * step);
        }
        mpiml::barrier();
        mpiml::Region mine(std::string("rank_") + std::to_string(rank));
        double x = rank;
        mpiml::broadcast(x, 0);
        std::vector<double> samples(static_cast<std::size_t>(rank + 2), 1.0);
        (void)mpiml::mpi_statistics_scalar(samples);
    }
    worker.join();
    mpiml::profile_stop();

    // This rank's file.
    const json t = read_json(own_file(d));
    expect_monotonic(t);
    const auto n = names(t);
    for (const std::string r : {"outer", "inner", "work", "worker_step", "allreduce", "barrier",
                                "broadcast", "allgather"})
        EXPECT_TRUE(n.count(r)) << r;
    EXPECT_TRUE(n.count("rank_" + std::to_string(rank)));
    bool named = false;
    for (const auto& e : t.at("traceEvents"))
        if (e.at("ph") == "M" && e.at("name") == "process_name")
            named = e.at("args").at("name") == "rank " + std::to_string(rank) + " (" + host() + ")" &&
                    e.at("args").at("host") == host();
    EXPECT_TRUE(named);

    const auto outer = slices(t, "outer");
    const auto inner = slices(t, "inner");
    ASSERT_EQ(outer.size(), 1u);
    ASSERT_EQ(inner.size(), 3u);
    const double o0 = outer[0].at("ts"), o1 = o0 + outer[0].at("dur").get<double>();
    for (const auto& e : inner) {
        EXPECT_EQ(e.at("pid"), rank);
        EXPECT_EQ(e.at("tid"), outer[0].at("tid"));
        EXPECT_GE(e.at("ts").get<double>(), o0);
        EXPECT_LE(e.at("ts").get<double>() + e.at("dur").get<double>(), o1);
    }
    const auto steps = slices(t, "worker_step");
    ASSERT_EQ(steps.size(), 5u);
    EXPECT_NE(steps[0].at("tid"), outer[0].at("tid"));

    const auto ar = slices(t, "allreduce");
    ASSERT_EQ(ar.size(), 3u);
    for (const auto& e : ar) {
        const auto& a = e.at("args");
        EXPECT_EQ(a.at("bytes"), 8000);
        EXPECT_EQ(a.at("count"), 1000);
        EXPECT_EQ(a.at("type"), "double");
        EXPECT_EQ(a.at("op"), "sum");
        EXPECT_EQ(a.at("call"), "mpiml::allreduce");
        EXPECT_GE(a.at("wait_us").get<double>(), 0.0);
        EXPECT_LE(a.at("wait_us").get<double>(), e.at("dur").get<double>());
    }
    EXPECT_EQ(slices(t, "broadcast").at(0).at("args").at("root"), 0);

    // The barrier after unequal work: one slice, with a wait.
    const auto bar = slices(t, "barrier");
    ASSERT_EQ(bar.size(), 1u);
    EXPECT_GE(bar[0].at("args").at("wait_us").get<double>(), 0.0);

    const auto& clock = t.at("otherData").at("clock");
    EXPECT_EQ(clock.at("same_host_as_rank_0").get<bool>(), host() == host_of_rank_0());
    if (host() == host_of_rank_0()) EXPECT_EQ(clock.at("offset_ns"), 0);

    if (rank != 0) return;

    // The merged timeline: one process lane per rank.
    const json tl = read_json(d / "timeline.json");
    expect_monotonic(tl);
    std::set<int> pids, named_pids;
    for (const auto& e : tl.at("traceEvents")) {
        pids.insert(e.at("pid").get<int>());
        if (e.at("ph") == "M" && e.at("name") == "process_name") {
            const int r = e.at("pid").get<int>();
            EXPECT_EQ(e.at("args").at("name"), "rank " + std::to_string(r) + " (" + hosts[static_cast<std::size_t>(r)] + ")");
            EXPECT_TRUE(named_pids.insert(e.at("pid").get<int>()).second);
        }
    }
    EXPECT_EQ(static_cast<int>(pids.size()), size);
    EXPECT_EQ(pids, named_pids);
    EXPECT_EQ(*pids.begin(), 0);
    EXPECT_EQ(*pids.rbegin(), size - 1);
    const auto tln = names(tl);
    for (int r = 0; r < size; ++r) EXPECT_TRUE(tln.count("rank_" + std::to_string(r))) << r;
    EXPECT_EQ(slices(tl, "inner").size(), 3u * size);

    // Each rank's barrier wait is the last rank's entry minus its own, on the
    // aligned clock; rank 0 waits at least until the slowest rank's work ends.
    // Across hosts the clocks carry the offsets' error: one host only.
    if (std::count(hosts.begin(), hosts.end(), hosts[0]) == size) {
        std::map<int, json> bar_of, work_of;
        for (const auto& e : slices(tl, "barrier")) bar_of[e.at("pid").get<int>()] = e;
        for (const auto& e : slices(tl, "work")) work_of[e.at("pid").get<int>()] = e;
        ASSERT_EQ(static_cast<int>(bar_of.size()), size);
        ASSERT_EQ(static_cast<int>(work_of.size()), size);
        double last = 0;
        for (const auto& [r, e] : bar_of) last = std::max(last, e.at("ts").get<double>());
        for (const auto& [r, e] : bar_of) {
            const double expected =
                std::clamp(last - e.at("ts").get<double>(), 0.0, e.at("dur").get<double>());
            EXPECT_NEAR(e.at("args").at("wait_us").get<double>(), expected, 2.0) << "rank " << r;
        }
        const json& slow = work_of.at(size - 1);
        const double slow_end = slow.at("ts").get<double>() + slow.at("dur").get<double>();
        const double step_us = std::chrono::duration<double, std::micro>(step).count();
        EXPECT_GE(slow.at("dur").get<double>(), step_us * (size - 1));
        EXPECT_GE(bar_of.at(0).at("args").at("wait_us").get<double>() + 2.0,
                  std::min(slow_end - bar_of.at(0).at("ts").get<double>(), bar_of.at(0).at("dur").get<double>()));
    }

    // The summary, as CSV and JSON.
    const auto csv = read_csv(d / "summary.csv");
    ASSERT_FALSE(csv.empty());
    std::map<std::string, std::map<std::string, std::string>> by_name;
    for (const auto& row : csv) {
        const double share = std::stod(row.at("share_of_wall"));
        const double imb = std::stod(row.at("imbalance"));
        EXPECT_GE(share, 0.0);
        EXPECT_LE(share, 1.0);
        EXPECT_GE(imb, 0.0);
        EXPECT_LE(imb, 1.0);
        EXPECT_LE(std::stod(row.at("min_s")), std::stod(row.at("mean_s")));
        EXPECT_LE(std::stod(row.at("mean_s")), std::stod(row.at("max_s")));
        by_name[row.at("name")] = row;
    }
    for (const char* r : {"outer", "inner", "work", "worker_step", "allreduce", "barrier"})
        EXPECT_TRUE(by_name.count(r)) << r;
    EXPECT_EQ(by_name["inner"].at("kind"), "region");
    EXPECT_EQ(by_name["allreduce"].at("kind"), "mpi");
    EXPECT_EQ(by_name["inner"].at("calls_min"), "3");
    EXPECT_EQ(by_name["inner"].at("calls_max"), "3");
    EXPECT_EQ(by_name["inner"].at("ranks"), std::to_string(size));
    EXPECT_EQ(by_name["rank_0"].at("ranks"), "1");
    EXPECT_GT(std::stod(by_name["outer"].at("mpi_mean_s")), 0.0);
    if (size > 1) {
        // (max - mean) / max of the ranks' "work" (about 0.5: rank * step, as
        // long as the machine keeps the sleeps' lengths).
        double sum = 0, most = 0;
        for (const auto& e : slices(tl, "work")) {
            sum += e.at("dur").get<double>();
            most = std::max(most, e.at("dur").get<double>());
        }
        ASSERT_GT(most, 0.0);
        EXPECT_NEAR(std::stod(by_name["work"].at("imbalance")), (most - sum / size) / most, 0.002);
        EXPECT_GT(std::stod(by_name["barrier"].at("wait_mean_s")), 0.0);
    }

    const json sj = read_json(d / "summary.json");
    EXPECT_EQ(sj.at("ranks"), size);
    EXPECT_GT(sj.at("wall_s").get<double>(), 0.0);
    EXPECT_EQ(sj.at("rows").size(), csv.size());
}

TEST(Profile, MeasuredClockOffsetIsWithinHalfRoundTrip) {
    TempDir d;
    setenv("MPIML_PROFILE_CLOCK", "measure", 1);
    mpiml::profile_start(d.path());
    { mpiml::Region r("measured"); mpiml::barrier(); }
    mpiml::profile_stop();
    unsetenv("MPIML_PROFILE_CLOCK");
    const json t = read_json(own_file(d));
    expect_monotonic(t);
    const auto& c = t.at("otherData").at("clock");
    const double measured = c.at("measured_offset_ns"), rtt = c.at("rtt_ns");
    if (mpiml::proc_id() == 0) {
        EXPECT_EQ(measured, 0);
    } else {
        // One host, one clock: the estimate is off by at most half the round trip.
        EXPECT_EQ(c.at("offset_ns").get<double>(), measured);
        EXPECT_GT(rtt, 0);
        EXPECT_LE(std::abs(measured), rtt / 2 + 1);
    }
    if (mpiml::proc_id() == 0) expect_monotonic(read_json(d / "timeline.json"));
}

TEST(Profile, StartWhileOnSwitchesDirectory) {
    TempDir a, b;
    mpiml::profile_start(a.path());
    { mpiml::Region r("kept"); }
    mpiml::profile_start(b.path());
    EXPECT_EQ(mpiml::profile_dir(), b.path());
    mpiml::profile_stop();
    mpiml::profile_stop();  // already off: nothing
    EXPECT_FALSE(fs::exists(own_file(a)));
    EXPECT_TRUE(names(read_json(own_file(b))).count("kept"));
}

TEST(Profile, CheckTimeAndSubCommunicator) {
    const int rank = mpiml::proc_id();
    const bool was = mpiml::check_enabled();
    mpiml::set_check(true);
    MPI_Comm half = MPI_COMM_NULL;
    MPI_Comm_split(MPI_COMM_WORLD, rank % 2, rank, &half);
    TempDir d;
    mpiml::profile_start(d.path());
    {
        mpiml::Region r("checked");
        (void)mpiml::mpi_sum(1.0);
        (void)mpiml::mpi_sum(1.0, half);
    }
    mpiml::profile_stop();
    mpiml::set_check(was);
    MPI_Comm_free(&half);

    const auto ar = slices(read_json(own_file(d)), "allreduce");
    ASSERT_EQ(ar.size(), 2u);
    for (const auto& e : ar) {
        EXPECT_EQ(e.at("args").at("call"), "mpiml::mpi_sum");
        EXPECT_GE(e.at("args").at("check_us").get<double>(), 0.0);
        EXPECT_EQ(e.at("args").at("bytes"), 8);
    }
    // World: exact wait from entry times; other communicators: the check's time.
    EXPECT_EQ(ar[0].at("args").at("wait_from"), "entry times");
    EXPECT_EQ(ar[1].at("args").at("wait_from"), "mismatch check");
    EXPECT_EQ(ar[1].at("args").at("wait_us"), ar[1].at("args").at("check_us"));
}
