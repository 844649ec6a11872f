// Checks a profile directory written by mpiml:
//   check_profile DIR RANKS [REGION...] [--inside REGION:EVENT...]
// Every file parses; profile_<r>.json exist for r < RANKS; timestamps never
// decrease and slices nest properly within each (pid, tid) lane; the timeline
// has exactly one process lane "rank r" per rank; every REGION occurs on every
// rank; for --inside A:B, on every rank some slice B lies within a slice A;
// the summary has RANKS ranks and shares and imbalances in [0, 1].
#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <vector>

using nlohmann::json;

namespace {

int failures = 0;
void fail(const std::string& what) {
    std::fprintf(stderr, "check_profile: %s\n", what.c_str());
    ++failures;
}

json load(const std::string& path) {
    std::ifstream f(path);
    if (!f) {
        fail("cannot open " + path);
        return json::object();
    }
    try {
        return json::parse(f);
    } catch (const std::exception& e) {
        fail(path + ": " + e.what());
        return json::object();
    }
}

struct Slice {
    std::string name;
    double ts, end;
};

// Slices by lane; checks order and nesting.
std::map<std::pair<int, int>, std::vector<Slice>> lanes(const json& trace, const std::string& what) {
    std::map<std::pair<int, int>, std::vector<Slice>> out;
    if (!trace.contains("traceEvents")) {
        fail(what + ": no traceEvents");
        return out;
    }
    for (const auto& e : trace["traceEvents"]) {
        if (e.value("ph", "") != "X") continue;
        const double ts = e.at("ts"), dur = e.at("dur");
        if (dur < 0) fail(what + ": negative duration in " + e.dump());
        out[{e.at("pid"), e.at("tid")}].push_back({e.at("name"), ts, ts + dur});
    }
    for (const auto& [lane, v] : out) {
        std::vector<double> open;
        for (std::size_t i = 0; i < v.size(); ++i) {
            if (i && v[i].ts < v[i - 1].ts)
                fail(what + ": timestamps decrease at '" + v[i].name + "' in lane pid " +
                     std::to_string(lane.first) + " tid " + std::to_string(lane.second));
            while (!open.empty() && open.back() <= v[i].ts) open.pop_back();
            if (!open.empty() && v[i].end > open.back() + 1e-3)
                fail(what + ": '" + v[i].name + "' overlaps the end of its enclosing slice");
            open.push_back(v[i].end);
        }
    }
    return out;
}

bool inside(const std::vector<Slice>& lane, const std::string& outer, const std::string& inner) {
    for (const auto& o : lane)
        if (o.name == outer)
            for (const auto& s : lane)
                if (s.name == inner && s.ts >= o.ts && s.end <= o.end) return true;
    return false;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 3) {
        std::fprintf(stderr, "usage: check_profile DIR RANKS [REGION...] [--inside A:B...]\n");
        return 2;
    }
    const std::string dir = argv[1];
    const int ranks = std::atoi(argv[2]);
    std::vector<std::string> regions;
    std::vector<std::pair<std::string, std::string>> nested;
    for (int i = 3; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--inside" && i + 1 < argc) {
            const std::string p = argv[++i];
            const auto colon = p.find(':');
            nested.emplace_back(p.substr(0, colon), p.substr(colon + 1));
        } else {
            regions.push_back(a);
        }
    }

    for (int r = 0; r < ranks; ++r) {
        const std::string what = "profile_" + std::to_string(r) + ".json";
        const auto by_lane = lanes(load(dir + "/" + what), what);
        std::set<std::string> names;
        for (const auto& [lane, v] : by_lane) {
            if (lane.first != r) fail(what + ": pid " + std::to_string(lane.first));
            for (const auto& s : v) names.insert(s.name);
        }
        for (const auto& g : regions)
            if (!names.count(g)) fail(what + ": no region '" + g + "'");
        for (const auto& [a, b] : nested) {
            bool found = false;
            for (const auto& [lane, v] : by_lane) found = found || inside(v, a, b);
            if (!found) fail(what + ": no '" + b + "' inside '" + a + "'");
        }
    }

    const json tl = load(dir + "/timeline.json");
    lanes(tl, "timeline.json");
    std::map<int, std::string> process_names;
    std::set<int> pids;
    if (tl.contains("traceEvents"))
        for (const auto& e : tl["traceEvents"]) {
            pids.insert(e.value("pid", -1));
            if (e.value("ph", "") == "M" && e.value("name", "") == "process_name") {
                const int pid = e.at("pid");
                if (process_names.count(pid)) fail("timeline.json: two process_name for " + std::to_string(pid));
                process_names[pid] = e.at("args").at("name");
            }
        }
    if (static_cast<int>(pids.size()) != ranks)
        fail("timeline.json: " + std::to_string(pids.size()) + " process lanes, expected " +
             std::to_string(ranks));
    for (int r = 0; r < ranks; ++r)
        if (process_names[r].rfind("rank " + std::to_string(r) + " (", 0) != 0 ||
            process_names[r].size() < 9 || process_names[r].back() != ')')
            fail("timeline.json: lane " + std::to_string(r) + " is named '" + process_names[r] + "'");

    const json sj = load(dir + "/summary.json");
    if (sj.value("ranks", -1) != ranks) fail("summary.json: ranks != " + std::to_string(ranks));
    if (sj.contains("rows"))
        for (const auto& row : sj["rows"]) {
            const double share = row.at("share_of_wall"), imb = row.at("imbalance");
            if (share < 0 || share > 1 || imb < 0 || imb > 1)
                fail("summary.json: share or imbalance out of [0, 1] in " + row.dump());
        }
    std::ifstream csv(dir + "/summary.csv");
    std::string header;
    if (!std::getline(csv, header) || header.rfind("name,kind,ranks,", 0) != 0)
        fail("summary.csv: missing or unexpected header");

    // imbalance.svg: compute, mpi and wait bars for every rank, no wider than the wall time.
    std::ifstream svg_in(dir + "/imbalance.svg");
    const std::string svg((std::istreambuf_iterator<char>(svg_in)), std::istreambuf_iterator<char>());
    if (svg.rfind("<svg", 0) != 0 || svg.find("</svg>") == std::string::npos)
        fail("imbalance.svg: missing or not an SVG");
    for (int r = 0; r < ranks; ++r)
        for (const char* part : {"compute", "mpi", "wait"})
            if (svg.find("<title>rank " + std::to_string(r) + " " + part + " ") == std::string::npos)
                fail("imbalance.svg: no " + std::string(part) + " bar for rank " + std::to_string(r));

    if (failures) return 1;
    std::printf("check_profile: %s OK (%d ranks)\n", dir.c_str(), ranks);
    return 0;
}
