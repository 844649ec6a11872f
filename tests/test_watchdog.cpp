// The watchdog thread reads the deadline while the program changes it and runs
// collectives (run under ThreadSanitizer in CI); a deadline that is not
// exceeded never fires.
#include <mpiml/mpiml.hpp>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string>
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

namespace {

std::string describe_test_sig(const std::int64_t* s) {
    return "door(" + std::to_string(s[0]) + ", " + std::to_string(s[1]) + ")";
}

// A door collective (as the torch.distributed backend runs them) on comm:
// one agreement round on {worker, i}, a watch of `timeout` s, a core
// allreduce inside.
void door_allreduce(MPI_Comm comm, int worker, int i, double timeout, int& failures) {
    const std::int64_t sig[] = {worker, i};
    mpiml::detail::DoorScope scope({5, "test door allreduce", comm, sig, 2, describe_test_sig, true,
                                    timeout, " (test worker)"});
    int x[2] = {1, worker};
    mpiml::detail::allreduce(MPI_IN_PLACE, x, 2, MPI_INT, mpiml::TypeClass::integer, mpiml::Op::sum,
                             comm, "test worker allreduce");
    if (x[0] != mpiml::num_procs() || x[1] != worker * mpiml::num_procs()) ++failures;
}

}  // namespace

// Several collectives watched at once, each with its own deadline: the main
// thread's (the global timeout) and two worker threads' door collectives on
// their own communicators, plus waits outside a collective. None expires.
// Each door collective runs exactly one agreement round, the core call inside
// it none; the main thread's (checks on) one each.
TEST(Watchdog, SeveralWatchesAtOnce) {
    const int n = mpiml::num_procs();
    const double before = mpiml::timeout();
    const bool check = mpiml::check_enabled();
    mpiml::set_timeout(30.0);
    mpiml::set_check(true);
    constexpr int kWorkers = 2, kOps = 60;
    MPI_Comm comms[kWorkers];
    int failures = 0;
    for (int w = 0; w < kWorkers; ++w) {
        ASSERT_EQ(MPI_Comm_dup(MPI_COMM_WORLD, &comms[w]), MPI_SUCCESS);
        door_allreduce(comms[w], w, -1, 20.0, failures);  // sets up the comm's state
    }
    mpiml::barrier();
    const std::uint64_t rounds0 = mpiml::detail::agreement_rounds();
    int worker_failures[kWorkers] = {};
    std::vector<std::thread> workers;
    for (int w = 0; w < kWorkers; ++w)
        workers.emplace_back([&, w] {
            for (int i = 0; i < kOps; ++i) {
                mpiml::detail::DoorWatch posted("test posted wait", 25.0 + w, "");
                door_allreduce(comms[w], w, i, 20.0 + w, worker_failures[w]);
            }
        });
    for (int i = 0; i < kOps; ++i) {
        std::vector<double> x(1 + i % 3, 1.0);
        mpiml::allreduce(x, mpiml::Op::sum);
        if (x[0] != n) ++failures;
        if (i % 20 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(60));  // a watchdog tick
    }
    for (auto& t : workers) t.join();
    const std::uint64_t rounds = mpiml::detail::agreement_rounds() - rounds0;
    for (int w = 0; w < kWorkers; ++w) {
        EXPECT_EQ(worker_failures[w], 0) << "worker " << w;
        MPI_Comm_free(&comms[w]);
    }
    EXPECT_EQ(failures, 0);
    EXPECT_EQ(rounds, static_cast<std::uint64_t>((kWorkers + 1) * kOps));
    mpiml::set_check(check);
    mpiml::set_timeout(before);
    mpiml::barrier();
}

// Two threads of one rank in collectives on one communicator at once: MPI
// matches collectives by their order on each rank, so that is a hang or
// mixed-up data; the second thread's call is an error naming the first's.
// Threads on communicators of their own are left alone.
TEST(Watchdog, TwoThreadsOnOneCommunicatorIsAnError) {
    if (mpiml::num_procs() < 2) GTEST_SKIP() << "needs 2 ranks";
    const int me = mpiml::proc_id(), n = mpiml::num_procs();
    MPI_Comm comm, signal;
    ASSERT_EQ(MPI_Comm_dup(MPI_COMM_WORLD, &comm), MPI_SUCCESS);
    ASSERT_EQ(MPI_Comm_dup(MPI_COMM_WORLD, &signal), MPI_SUCCESS);
    mpiml::barrier(comm);
    std::vector<double> x(3, 1.0);
    if (me == 0) {
        // A thread waits in a barrier on comm that the others join only after
        // this thread's second call has failed (the signal barrier).
        std::atomic<bool> started{false};
        std::thread inside([&] {
            started = true;
            mpiml::barrier(comm);
        });
        while (!started) std::this_thread::yield();
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        try {
            mpiml::allreduce(x, mpiml::Op::sum, comm);
            ADD_FAILURE() << "no error";
        } catch (const mpiml::Error& e) {
            const std::string what = e.what();
            EXPECT_NE(what.find("mpiml::allreduce on rank 0/" + std::to_string(n)), std::string::npos) << what;
            EXPECT_NE(what.find("another thread of this rank is inside barrier #2 on this communicator"),
                      std::string::npos) << what;
        }
        mpiml::barrier(signal);
        inside.join();
    } else {
        mpiml::barrier(signal);
        mpiml::barrier(comm);
    }
    // Still in step on comm: the failed call issued nothing.
    mpiml::allreduce(x, mpiml::Op::sum, comm);
    EXPECT_EQ(x[0], n);
    // Two threads, each on a communicator of its own, at once.
    int bad[2] = {0, 0};
    std::thread other([&] {
        for (int i = 0; i < 200; ++i)
            if (mpiml::mpi_sum(i, signal) != i * n) ++bad[1];
    });
    for (int i = 0; i < 200; ++i)
        if (mpiml::mpi_sum(2 * i, comm) != 2 * i * n) ++bad[0];
    other.join();
    EXPECT_EQ(bad[0], 0);
    EXPECT_EQ(bad[1], 0);
    MPI_Comm_free(&comm);
    MPI_Comm_free(&signal);
    mpiml::barrier();
}

// A door collective that disagrees across ranks fails on every rank with the
// core's mismatch message, describing each rank's signature.
TEST(Watchdog, DoorMismatchIsTheCoresError) {
    if (mpiml::num_procs() < 2) GTEST_SKIP() << "needs 2 ranks";
    int failures = 0;
    try {
        door_allreduce(MPI_COMM_WORLD, 7, mpiml::proc_id(), 0, failures);
        ADD_FAILURE() << "no error";
    } catch (const mpiml::Error& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find("test door allreduce"), std::string::npos) << what;
        EXPECT_NE(what.find("mismatched collectives"), std::string::npos) << what;
        EXPECT_NE(what.find("rank 0 called door(7, 0); rank 1 called door(7, 1)"), std::string::npos) << what;
    }
    mpiml::barrier();
}

// Run alone (ctest watchdog_expiry.*): two collectives of rank 0 watched at
// once, the main thread's and a worker's, while rank 1 never arrives; only
// the one whose deadline is short (MPIML_TEST_EXPIRE: main or worker) may
// end the job, naming itself.
TEST(WatchdogExpiry, OneOfTwo) {
    const char* which = std::getenv("MPIML_TEST_EXPIRE");
    if (!which) GTEST_SKIP() << "run by the watchdog_expiry tests";
    if (mpiml::num_procs() < 2) GTEST_SKIP() << "needs 2 ranks";
    const bool main_short = std::string(which) == "main";
    MPI_Comm comm;
    ASSERT_EQ(MPI_Comm_dup(MPI_COMM_WORLD, &comm), MPI_SUCCESS);
    mpiml::barrier();  // sets up the arrival board and the exit guard on every rank
    if (mpiml::proc_id() != 0) {
        std::this_thread::sleep_for(std::chrono::seconds(30));  // never arrives
        return;
    }
    std::thread worker([&] {
        mpiml::detail::DoorScope scope({4, "test worker barrier", comm, nullptr, 0, nullptr, false,
                                        main_short ? 30.0 : 1.0, " (the worker's)"});
        MPI_Barrier(comm);
    });
    mpiml::set_timeout(main_short ? 1.0 : 30.0);
    mpiml::barrier();
    worker.join();
}
