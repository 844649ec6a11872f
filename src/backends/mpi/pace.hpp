// How long a quiet wait sleeps between two tests of its requests.
//
// Sleeps start short (a message about to complete costs little) and double
// up to a cap. Each wake-up takes the core from the computation for a context
// switch and a round of MPI's progress, so fewer are better; but the TCP
// transport moves data only inside MPI calls, so a sleep must end before the
// link drains what the last test queued. The cap is therefore the time the
// link takes to move kBytesPerSleep at the rate this thread's large transfers
// reached (one test moves several times that), between kShortestCap (fast
// links, and before any transfer was timed) and kLongestCap. The rate is a
// decaying maximum: a transfer slowed by a late peer lowers it only slowly,
// and a sleep-limited transfer would still show several times the rate the
// cap was made from, so the cap never slows the link it is measured on.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>

namespace mpiml::detail {

class WaitPace {
public:
    static constexpr auto kFirstSleep = std::chrono::microseconds(20);
    static constexpr auto kShortestCap = std::chrono::microseconds(250);
    static constexpr auto kLongestCap = std::chrono::microseconds(2000);
    static constexpr double kBytesPerSleep = 128.0 * 1024;
    /// Transfers smaller than this are not timed (latency, not rate).
    static constexpr std::size_t kTimedBytes = std::size_t{1} << 20;
    static constexpr double kDecay = 0.9;

    /// The longest sleep between two tests.
    std::chrono::microseconds cap() const {
        if (rate_ <= 0) return kShortestCap;
        const auto us = std::chrono::microseconds(static_cast<long long>(kBytesPerSleep / rate_ * 1e6));
        return std::clamp(us, kShortestCap, kLongestCap);
    }

    /// A wait of bytes (the larger direction) took seconds.
    void timed(std::size_t bytes, double seconds) {
        if (bytes < kTimedBytes || seconds <= 0) return;
        rate_ = std::max(static_cast<double>(bytes) / seconds, rate_ * kDecay);
    }

    /// Bytes per second, 0 before any transfer was timed.
    double rate() const { return rate_; }

private:
    double rate_ = 0;
};

}  // namespace mpiml::detail
