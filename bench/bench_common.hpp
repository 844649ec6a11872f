// Timing protocol shared by the C++ benchmarks (bench/peers/common.py is the
// same protocol in Python):
//   1. warm-up and estimate: every variant runs once, then in batches of 1,
//      2, 4, ... calls, each call timed alone, until at least 8 calls and one
//      round's time have passed (or four rounds' time: slow calls); the
//      estimate is the slowest rank's median call (so that a stall during
//      warm-up does not shrink the rounds, while a machine that is slow most
//      of the time does not stretch them); iterations per round = round
//      target / estimate, clamped to [1, max];
//   2. rounds (fewer, but at least 3, when they would exceed the time
//      budget): each round runs every variant (order rotated round by round
//      so that load changes hit all of them), each as barrier, `iters` calls,
//      per-call time = elapsed / iters on each rank, max over ranks;
//   3. reported: the median and the minimum over rounds, in microseconds.
// Raw MPI calls only (barrier, max-reduce) so the measuring does not depend
// on the library measured. Rank 0 prints one JSON object per line.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace bench {

/// The cheap-operation protocol (bench_profile, bench_history): ns per call of
/// f(i), i < n, median of 7 trials, each after a barrier; this rank's time.
template <class F>
double median_ns(F f, int n) {
    std::vector<double> t;
    for (int trial = 0; trial < 7; ++trial) {
        MPI_Barrier(MPI_COMM_WORLD);
        const auto a = std::chrono::steady_clock::now();
        for (int i = 0; i < n; ++i) f(i);
        t.push_back(std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - a).count() / n);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

struct Variant {
    std::string name;
    std::function<void()> fn;
    bool rank0_only = false;  // e.g. memcpy calibration: other ranks idle
    // OSU-style for non-synchronizing collectives (broadcast): a barrier
    // after every call, outside the timed region, so calls cannot pipeline.
    bool barrier_each = false;
};

struct Timing {
    std::string name;
    long iters = 0;
    int rounds = 0;
    double median_us = 0.0;
    double min_us = 0.0;
};

struct Protocol {
    double round_seconds = 0.02;  // target length of one variant's round
    int rounds = 7;
    long min_iters = 1;
    long max_iters = 20000;
    double budget_seconds = 20.0;  // rounds of one measure() call, all variants
};

inline int rank() {
    int r = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
}

inline int size() {
    int s = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &s);
    return s;
}

inline double max_over_ranks(double v) {
    double out = 0.0;
    MPI_Allreduce(&v, &out, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return out;
}

/// Seconds per call of v over n calls on this rank (0 for idle ranks).
inline double time_calls(const Variant& v, long n) {
    MPI_Barrier(MPI_COMM_WORLD);
    if (v.rank0_only && rank() != 0) return 0.0;
    if (v.barrier_each) {
        double total = 0.0;
        for (long i = 0; i < n; ++i) {
            const double t0 = MPI_Wtime();
            v.fn();
            total += MPI_Wtime() - t0;
            MPI_Barrier(MPI_COMM_WORLD);
        }
        return total / static_cast<double>(n);
    }
    const double t0 = MPI_Wtime();
    for (long i = 0; i < n; ++i) v.fn();
    return (MPI_Wtime() - t0) / static_cast<double>(n);
}

/// Warm-up batch of n calls, each timed alone: appends the call times on
/// this rank to `times` (nothing on idle ranks) and returns their total.
inline double warm_calls(const Variant& v, long n, std::vector<double>& times) {
    MPI_Barrier(MPI_COMM_WORLD);
    if (v.rank0_only && rank() != 0) return 0.0;
    double total = 0.0;
    for (long i = 0; i < n; ++i) {
        const double t0 = MPI_Wtime();
        v.fn();
        const double dt = MPI_Wtime() - t0;
        times.push_back(dt);
        total += dt;
        if (v.barrier_each) MPI_Barrier(MPI_COMM_WORLD);
    }
    return total;
}

inline double median(std::vector<double> s) {
    if (s.empty()) return 0.0;
    std::sort(s.begin(), s.end());
    const std::size_t m = s.size();
    return m % 2 ? s[m / 2] : 0.5 * (s[m / 2 - 1] + s[m / 2]);
}

inline std::vector<Timing> measure(const std::vector<Variant>& variants, const Protocol& p = {}) {
    const std::size_t nv = variants.size();
    std::vector<long> iters(nv);
    double round_cost = 0.0;  // seconds of one round, all variants
    for (std::size_t i = 0; i < nv; ++i) {
        std::vector<double> times;
        warm_calls(variants[i], 1, times);
        times.clear();
        double spent = 0.0;
        long calls = 0;
        // spent is the same on every rank, so every rank leaves at the same n.
        for (long n = 1;; n *= 2) {
            spent += max_over_ranks(warm_calls(variants[i], n, times));
            calls += n;
            if ((calls >= 8 && spent >= p.round_seconds) || spent >= 4 * p.round_seconds ||
                calls >= p.max_iters)
                break;
        }
        const double est = std::max(max_over_ranks(median(times)), 1e-9);
        iters[i] = std::clamp(static_cast<long>(p.round_seconds / est), p.min_iters, p.max_iters);
        round_cost += static_cast<double>(iters[i]) * est;
    }
    const int rounds =
        std::clamp(static_cast<int>(p.budget_seconds / round_cost), std::min(3, p.rounds), p.rounds);
    std::vector<std::vector<double>> samples(nv);
    for (int r = 0; r < rounds; ++r)
        for (std::size_t k = 0; k < nv; ++k) {
            const std::size_t i = (k + static_cast<std::size_t>(r)) % nv;
            samples[i].push_back(max_over_ranks(time_calls(variants[i], iters[i])));
        }
    std::vector<Timing> out;
    for (std::size_t i = 0; i < nv; ++i) {
        const double lo = *std::min_element(samples[i].begin(), samples[i].end());
        out.push_back({variants[i].name, iters[i], rounds, median(samples[i]) * 1e6, lo * 1e6});
    }
    return out;
}

/// Minimal JSON object writer for one output line.
class Json {
public:
    Json& add(const std::string& k, const std::string& v) {
        std::string q(1, '"');
        q.append(escape(v)).push_back('"');
        return raw(k, q);
    }
    Json& add(const std::string& k, const char* v) { return add(k, std::string(v)); }
    Json& add(const std::string& k, double v) {
        if (!std::isfinite(v)) return raw(k, "null");
        char buf[64];
        std::snprintf(buf, sizeof buf, "%.6g", v);
        return raw(k, buf);
    }
    Json& add(const std::string& k, long v) { return raw(k, std::to_string(v)); }
    Json& add(const std::string& k, int v) { return raw(k, std::to_string(v)); }
    Json& add(const std::string& k, std::size_t v) { return raw(k, std::to_string(v)); }
    Json& add(const std::string& k, bool v) { return raw(k, v ? "true" : "false"); }
    void print() const {
        std::printf("{%s}\n", body_.c_str());
        std::fflush(stdout);
    }

private:
    Json& raw(const std::string& k, const std::string& v) {
        if (!body_.empty()) body_.append(", ");
        body_.append(1, '"').append(escape(k)).append("\": ").append(v);
        return *this;
    }
    static std::string escape(const std::string& s) {
        std::string o;
        for (char c : s) {
            if (c == '"' || c == '\\') o += '\\';
            o += c;
        }
        return o;
    }
    std::string body_;
};

/// A JSON line for one timing, with the common fields filled in.
inline Json timing_json(const std::string& suite, const std::string& bench, const Timing& t) {
    Json j;
    j.add("suite", suite).add("bench", bench).add("impl", t.name).add("ranks", size());
    j.add("iters", t.iters).add("rounds", t.rounds);
    j.add("median_us", t.median_us).add("min_us", t.min_us);
    return j;
}

/// Value of --name=value on the command line, or def.
inline std::string arg(int argc, char** argv, const std::string& name, const std::string& def) {
    const std::string key = "--" + name + "=";
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a.rfind(key, 0) == 0) return a.substr(key.size());
    }
    return def;
}

}  // namespace bench
