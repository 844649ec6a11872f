// The watchdog thread reads the deadline while the program changes it and runs
// collectives (run under ThreadSanitizer in CI); a deadline that is not
// exceeded never fires.
#include <mpiml/mpiml.hpp>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

// First in this file: the arrival board is set up on the first world
// collective, which must not depend on a setting that differs between ranks.
TEST(Watchdog, DeadlineOnSomeRanksOnly) {
    const int n = mpiml::num_procs();
    const double before = mpiml::timeout();
    mpiml::set_timeout(mpiml::proc_id() == 0 ? 30.0 : 0.0);
    for (int i = 0; i < 50; ++i) {
        std::vector<double> x(1 + i % 4, 1.0);
        mpiml::allreduce(x, mpiml::Op::sum);
        EXPECT_EQ(x[0], n);
    }
    mpiml::set_timeout(mpiml::proc_id() == n - 1 ? 30.0 : 0.0);
    mpiml::barrier();
    mpiml::set_timeout(before);
    mpiml::barrier();
}

TEST(Watchdog, DeadlineChangedWhileArmed) {
    const int n = mpiml::num_procs();
    const double before = mpiml::timeout();
    // Another thread moves the deadline while the watchdog thread reads it.
    std::atomic<bool> done{false};
    std::thread mover([&] {
        for (int i = 0; !done.load(); ++i) mpiml::set_timeout(40.0 + i % 5);
    });
    for (int i = 0; i < 100; ++i) {
        std::vector<int> x(3, 1);
        mpiml::allreduce(x, mpiml::Op::sum);
        EXPECT_EQ(x[0], n);
        if (i % 25 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(60));  // a watchdog tick
    }
    done = true;
    mover.join();
    for (int i = 0; i < 300; ++i) {
        const double t = 30.0 + i % 7;
        mpiml::set_timeout(t);
        EXPECT_EQ(mpiml::timeout(), t);
        std::vector<int> x(1 + i % 5, 1);
        mpiml::allreduce(x, mpiml::Op::sum);
        EXPECT_EQ(x[0], n);
        if (i % 50 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(60));  // a watchdog tick
    }
    mpiml::set_timeout(0);
    EXPECT_EQ(mpiml::timeout(), 0.0);
    mpiml::barrier();
    mpiml::set_timeout(before);
}

TEST(Watchdog, SettingsReadFromAnotherThread) {
    // set_timeout/set_check on one thread, timeout()/check_enabled() on another:
    // every value read is one that was written, and after the writer stops the
    // reader sees its last values.
    const bool check = mpiml::check_enabled();
    const double start = 20.0;
    mpiml::set_timeout(start);
    std::atomic<bool> done{false}, started{false};
    long reads = 0, strays = 0;
    double last_timeout = -1;
    bool last_check = true;
    std::thread reader([&] {
        while (!done.load()) {
            const double t = mpiml::timeout();
            if (t != start && t != 10.0 && t != 11.0 && t != 12.0) ++strays;
            ++reads;
            started = true;
        }
        last_timeout = mpiml::timeout();
        last_check = mpiml::check_enabled();
    });
    while (!started.load()) std::this_thread::yield();
    for (int i = 0; i < 1000; ++i) {
        mpiml::set_timeout(10.0 + i % 3);
        mpiml::set_check(i % 2 == 0);
    }
    done = true;
    reader.join();
    EXPECT_GT(reads, 0);
    EXPECT_EQ(strays, 0);
    EXPECT_EQ(last_timeout, 10.0);  // i = 999: 10 + 999 % 3
    EXPECT_FALSE(last_check);       // i = 999 is odd
    mpiml::set_check(check);
    mpiml::set_timeout(0);
    mpiml::barrier();
}
