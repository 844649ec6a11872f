// Per-rank profiling: scoped regions, automatic records of every mpiml
// collective, Chrome-trace files per rank, a merged timeline and a summary.
//
//   MPIML_PROFILE=prof mpirun -np 2 ./train      (or mpiml::profile_start("prof"))
//
//   void train_epoch() {
//       mpiml::Region r("rollout");   // one branch when profiling is off
//       ...
//   }
//
// Output, written by profile_stop() (or inside MPI_Finalize):
//   DIR/profile_<rank>.json  Chrome Trace Event format, one file per rank
//   DIR/timeline.json        all ranks, one process lane per rank, clocks aligned
//   DIR/summary.csv, .json   per region and collective: min/mean/max over ranks,
//                            share of wall time, load imbalance (max - mean) / max
// See docs/PROFILING.md.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

namespace mpiml {

namespace detail {
extern std::atomic<bool> profile_on;
extern std::atomic<std::uint32_t> profile_generation;
std::int64_t profile_now();  // steady clock, ns
void profile_region(const char* name, std::int64_t t0, std::uint32_t generation);
const char* profile_intern(const std::string& name);
}  // namespace detail

/// A named span of time on the calling thread, from construction to
/// destruction. The name must be a string literal or otherwise outlive the
/// profile; the std::string overload copies it (only when profiling).
/// A region still open when the profile stops is not recorded.
class Region {
public:
    explicit Region(const char* name) {
        if (detail::profile_on.load(std::memory_order_relaxed)) [[unlikely]]
            begin(name);
    }
    explicit Region(const std::string& name) {
        if (detail::profile_on.load(std::memory_order_relaxed)) [[unlikely]]
            begin(detail::profile_intern(name));
    }
    ~Region() {
        if (name_) [[unlikely]]
            detail::profile_region(name_, start_, generation_);
    }
    Region(const Region&) = delete;
    Region& operator=(const Region&) = delete;

private:
    void begin(const char* name) {
        generation_ = detail::profile_generation.load(std::memory_order_relaxed);
        start_ = detail::profile_now();
        name_ = name;
    }
    const char* name_ = nullptr;
    std::int64_t start_ = 0;
    std::uint32_t generation_ = 0;
};

/// Starts profiling into directory dir (created if needed). Collective over
/// MPI_COMM_WORLD: call on every rank. If profiling is already on (e.g. from
/// MPIML_PROFILE), recording continues and the output goes to dir.
void profile_start(std::string dir);

/// Stops profiling and writes the files; rank 0 prints the summary table.
/// Collective over MPI_COMM_WORLD. Does nothing when profiling is off. Runs
/// automatically inside MPI_Finalize if profiling is still on.
void profile_stop();

/// True between profile_start (or MPIML_PROFILE at initialization) and profile_stop.
inline bool profiling() { return detail::profile_on.load(std::memory_order_relaxed); }

/// The output directory of the current profile ("" when off).
std::string profile_dir();

}  // namespace mpiml
