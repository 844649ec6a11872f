#include "cli.hpp"

#include <sched.h>

#include <charconv>
#include <cmath>
#include <fstream>
#include <set>
#include <thread>
#include <utility>

namespace ppo::cli {

namespace {

std::string shown(double x) {
    std::string s = std::to_string(x);
    s.erase(s.find_last_not_of('0') + 1);
    if (!s.empty() && s.back() == '.') s.pop_back();
    return s;
}

}  // namespace

CLI::Validator whole_at_least(long lo) {
    return CLI::Validator(
        [lo](std::string& s) -> std::string {
            long v = 0;
            const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
            if (ec != std::errc() || end != s.data() + s.size() || s.empty())
                return "must be a whole number, got '" + s + "'";
            if (v < lo) return "must be at least " + std::to_string(lo) + ", got " + s;
            return {};
        },
        "INT>=" + std::to_string(lo));
}

CLI::Validator number_in(double lo, double hi, bool lo_open, bool hi_open) {
    std::string range = std::string(lo_open ? "(" : "[") + shown(lo) + ", " +
                        (std::isinf(hi) ? "inf" : shown(hi)) + (hi_open ? ")" : "]");
    return CLI::Validator(
        [=](std::string& s) -> std::string {
            double v = 0;
            std::size_t used = 0;
            try {
                v = std::stod(s, &used);
            } catch (const std::exception&) {
                used = 0;
            }
            if (used == 0 || used != s.size() || std::isnan(v))
                return "must be a number, got '" + s + "'";
            const bool below = lo_open ? v <= lo : v < lo;
            const bool above = hi_open ? v >= hi : v > hi;
            if (below || above) {
                if (std::isinf(hi))
                    return std::string("must be ") + (lo_open ? "above " : "at least ") +
                           shown(lo) + ", got " + s;
                return "must be in " + range + ", got " + s;
            }
            return {};
        },
        "NUMBER in " + range);
}

CLI::Validator one_of(std::vector<std::string> names) {
    std::string list;
    for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
    return CLI::Validator(
        [names = std::move(names), list](std::string& s) -> std::string {
            for (const auto& n : names)
                if (s == n) return {};
            return "must be one of " + list + ", got '" + s + "'";
        },
        "{" + list + "}");
}

CLI::Validator existing_folder() {
    return CLI::Validator(
        [](std::string& s) -> std::string {
            auto check = CLI::ExistingDirectory;
            std::string copy = s;
            if (check(copy).empty()) return {};
            return "must be an existing folder, got '" + s + "'";
        },
        "FOLDER");
}

CLI::Validator auto_or_folder() {
    return CLI::Validator(
        [](std::string& s) -> std::string {
            if (s == "auto") return {};
            std::string copy = s;
            if (existing_folder()(copy).empty()) return {};
            return "must be auto or an existing folder, got '" + s + "'";
        },
        "auto|FOLDER");
}

CLI::Validator ranks() {
    return CLI::Validator(
        [](std::string& s) -> std::string {
            if (s == "auto") return {};
            std::string copy = s;
            std::string err = whole_at_least(1)(copy);
            if (err.empty()) return {};
            if (err.rfind("must be a whole number", 0) == 0)
                return "must be a whole number or auto, got '" + s + "'";
            return err;
        },
        "N|auto");
}

int node_cores() {
    cpu_set_t mask;
    CPU_ZERO(&mask);
    if (sched_getaffinity(0, sizeof mask, &mask) != 0 || CPU_COUNT(&mask) == 0)
        return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    std::set<std::pair<long, long>> cores;  // (package, core)
    int cpus = 0;
    for (int c = 0; c < CPU_SETSIZE; ++c) {
        if (!CPU_ISSET(c, &mask)) continue;
        ++cpus;
        const std::string dir = "/sys/devices/system/cpu/cpu" + std::to_string(c) + "/topology/";
        long pkg = -1, core = -1;
        std::ifstream(dir + "physical_package_id") >> pkg;
        std::ifstream(dir + "core_id") >> core;
        if (pkg < 0 || core < 0) return cpus > 0 ? CPU_COUNT(&mask) : 1;  // no topology: CPUs
        cores.emplace(pkg, core);
    }
    return std::max<int>(1, static_cast<int>(cores.size()));
}

std::string failure_message(const CLI::App* app, const CLI::Error& e) {
    std::string msg = e.what();
    if (dynamic_cast<const CLI::ValidationError*>(&e))
        if (const auto p = msg.find(": "); p != std::string::npos) msg.erase(p, 1);
    return app->get_name() + ": " + msg + "\nRun with --help for every flag.\n";
}

}  // namespace ppo::cli
