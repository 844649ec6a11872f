// The torch.distributed backend's worker queue, without torch: operations run
// in issue order; a completion callback may push an operation and wait for it,
// or wait for one pushed before it (PowerSGD's pattern); posted requests
// complete while the queue goes on; shutdown ends what never completed. Run
// under ThreadSanitizer in CI.
#include "../python/src/worker_queue.hpp"

#include <mpiml/mpiml.hpp>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

using mpiml_c10d::WorkerQueue;
using namespace std::chrono_literals;

namespace {

WorkerQueue::Op op(std::string name, std::function<void()> run,
                   std::function<void(std::exception_ptr)> complete) {
    return WorkerQueue::Op{std::move(name),
                           [run = std::move(run)] {
                               run();
                               return WorkerQueue::Posted{};
                           },
                           std::move(complete)};
}

std::string what(std::exception_ptr e) {
    try {
        std::rethrow_exception(e);
    } catch (const std::exception& x) {
        return x.what();
    }
}

}  // namespace

TEST(WorkerQueue, RunsInIssueOrderAndCompletesEachOnce) {
    std::vector<int> ran;  // written by whichever thread holds the runner role
    std::vector<std::atomic<int>> completed(500);
    {
        WorkerQueue q("test ");
        for (int i = 0; i < 500; ++i)
            q.push(op("op", [&ran, i] { ran.push_back(i); },
                      [&completed, i](std::exception_ptr e) {
                          EXPECT_FALSE(e);
                          completed[i].fetch_add(1);
                      }));
        q.shutdown();
        EXPECT_EQ(q.threads_started(), 2);  // the runner and one spare: no callback waited
    }
    ASSERT_EQ(ran.size(), 500u);
    for (int i = 0; i < 500; ++i) {
        EXPECT_EQ(ran[i], i);
        EXPECT_EQ(completed[i].load(), 1) << i;
    }
}

TEST(WorkerQueue, ACallbackPushesAndWaits) {
    // Three deep, as PowerSGD chains futures: each callback issues the next
    // operation and blocks until it is done.
    WorkerQueue q("test ");
    std::promise<void> last;
    auto done = last.get_future();
    std::function<void(int)> chain = [&](int depth) {
        auto p = std::make_shared<std::promise<void>>();
        auto f = p->get_future();
        q.push(op("link", [] {}, [&, depth, p](std::exception_ptr) {
            if (depth < 3) chain(depth + 1);
            else last.set_value();
            p->set_value();
        }));
        if (depth > 0) EXPECT_EQ(f.wait_for(10s), std::future_status::ready) << "depth " << depth;
    };
    chain(0);
    EXPECT_EQ(done.wait_for(10s), std::future_status::ready);
    q.shutdown();
}

TEST(WorkerQueue, ACallbackWaitsForAnEarlierOp) {
    // The first op's callback waits for the second, queued before it ran: a
    // spare takes the queue over within two ticks.
    WorkerQueue q("test ");
    std::promise<void> second;
    auto second_done = second.get_future().share();
    std::atomic<bool> waited_ok{false};
    std::promise<void> pushed;
    auto both_pushed = pushed.get_future().share();
    q.push(op("first", [both_pushed] { both_pushed.wait(); }, [&, second_done](std::exception_ptr) {
        waited_ok = second_done.wait_for(10s) == std::future_status::ready;
    }));
    q.push(op("second", [] {}, [&](std::exception_ptr) { second.set_value(); }));
    pushed.set_value();
    const auto t0 = std::chrono::steady_clock::now();
    q.shutdown();
    EXPECT_TRUE(waited_ok.load());
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
    EXPECT_GE(q.threads_started(), 2);
}

TEST(WorkerQueue, AFailedRunCompletesWithItsError) {
    WorkerQueue q("test ");
    std::promise<std::string> err;
    q.push(op("bad", [] { mpiml::detail::fail("test bad", "it broke"); },
              [&](std::exception_ptr e) { err.set_value(e ? what(e) : "no error"); }));
    auto f = err.get_future();
    ASSERT_EQ(f.wait_for(10s), std::future_status::ready);
    EXPECT_NE(f.get().find("it broke"), std::string::npos);
    std::promise<bool> ok;
    q.push(op("good", [] {}, [&](std::exception_ptr e) { ok.set_value(!e); }));
    EXPECT_TRUE(ok.get_future().get());
    q.shutdown();
    try {
        q.push(op("late", [] {}, [](std::exception_ptr) {}));
        ADD_FAILURE() << "pushed after shutdown";
    } catch (const mpiml::Error& e) {
        EXPECT_NE(std::string(e.what()).find("test late"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("has been shut down"), std::string::npos) << e.what();
    }
}

TEST(WorkerQueue, PostedRequestsCompleteWhileTheQueueGoesOn) {
    // A ring, the receive queued before the send on every rank: posted, not
    // blocking, so the sends are reached.
    const int n = mpiml::num_procs(), me = mpiml::proc_id();
    MPI_Comm comm;
    ASSERT_EQ(MPI_Comm_dup(MPI_COMM_WORLD, &comm), MPI_SUCCESS);
    auto in = std::make_shared<int>(-1);
    auto out = std::make_shared<int>(me);
    std::atomic<int> completed{0}, source{-2};
    {
        WorkerQueue q("test ");
        q.push(WorkerQueue::Op{"recv",
                               [&, in] {
                                   WorkerQueue::Posted p;
                                   MPI_Irecv(in.get(), 1, MPI_INT, (me + n - 1) % n, 5, comm, &p.req);
                                   p.done = [&](const MPI_Status& st) { source = st.MPI_SOURCE; };
                                   p.hold = in;
                                   return p;
                               },
                               [&](std::exception_ptr e) {
                                   EXPECT_FALSE(e);
                                   ++completed;
                               }});
        q.push(WorkerQueue::Op{"send",
                               [&, out] {
                                   WorkerQueue::Posted p;
                                   MPI_Isend(out.get(), 1, MPI_INT, (me + 1) % n, 5, comm, &p.req);
                                   p.hold = out;
                                   return p;
                               },
                               [&](std::exception_ptr e) {
                                   EXPECT_FALSE(e);
                                   ++completed;
                               }});
        // Shutdown would cancel what is still pending: wait for both first.
        const auto deadline = std::chrono::steady_clock::now() + 10s;
        while (completed.load() < 2 && std::chrono::steady_clock::now() < deadline)
            std::this_thread::sleep_for(1ms);
        q.shutdown();
    }
    EXPECT_EQ(completed.load(), 2);
    EXPECT_EQ(*in, (me + n - 1) % n);
    EXPECT_EQ(source.load(), (me + n - 1) % n);
    MPI_Comm_free(&comm);
}

TEST(WorkerQueue, ShutdownEndsARequestThatNeverCompletes) {
    MPI_Comm comm;
    ASSERT_EQ(MPI_Comm_dup(MPI_COMM_SELF, &comm), MPI_SUCCESS);
    auto buf = std::make_shared<int>(0);
    std::string err;
    {
        WorkerQueue q("test ");
        q.push(WorkerQueue::Op{"recv nobody sends",
                               [&, buf] {
                                   WorkerQueue::Posted p;
                                   MPI_Irecv(buf.get(), 1, MPI_INT, 0, 99, comm, &p.req);
                                   p.hold = buf;
                                   return p;
                               },
                               [&](std::exception_ptr e) { err = e ? what(e) : "no error"; }});
        std::this_thread::sleep_for(20ms);
        q.shutdown();
    }
    EXPECT_NE(err.find("test recv nobody sends"), std::string::npos) << err;
    EXPECT_NE(err.find("shut down before it completed"), std::string::npos) << err;
    MPI_Comm_free(&comm);
}

namespace {

WorkerQueue::Op tagged(std::function<void()> run, std::function<void(std::exception_ptr)> complete,
                       const void* tag) {
    auto o = op("tagged", std::move(run), std::move(complete));
    o.tag = tag;
    return o;
}

}  // namespace

TEST(WorkerQueue, RunHereRunsTheOpOnTheWaitingThread) {
    WorkerQueue q("test ");
    int here = 0;
    // Many tries: under a sanitizer on busy cores the woken runner often
    // takes the op first.
    for (int i = 0; i < 2000 && here < 20; ++i) {
        std::this_thread::sleep_for(100us);  // the runner back to waiting
        std::atomic<bool> completed{false};
        std::thread::id ran_on;
        const int tag = 0;
        q.push(tagged([&] { ran_on = std::this_thread::get_id(); },
                      [&](std::exception_ptr e) {
                          EXPECT_FALSE(e);
                          completed = true;
                      },
                      &tag));
        if (q.run_here(&tag)) {
            // Ran and completed here, before run_here returned.
            EXPECT_TRUE(completed.load());
            EXPECT_EQ(ran_on, std::this_thread::get_id());
            ++here;
        } else {
            for (int k = 0; k < 10000 && !completed; ++k) std::this_thread::sleep_for(1ms);
            ASSERT_TRUE(completed.load());
            EXPECT_NE(ran_on, std::this_thread::get_id());
        }
        EXPECT_FALSE(q.run_here(&tag));  // gone from the queue
    }
    // The runner waits for work between the pushes nearly always.
    EXPECT_GT(here, 0);
    q.shutdown();
}

TEST(WorkerQueue, RunHereDeclinesWhileTheRunnerWorksOrAnotherOpIsAhead) {
    WorkerQueue q("test ");
    std::promise<void> release;
    auto released = release.get_future().share();
    std::promise<void> started;
    std::vector<int> order;
    q.push(op("busy", [&, released] {
        started.set_value();
        released.wait();
        order.push_back(0);
    }, [](std::exception_ptr) {}));
    started.get_future().wait();
    const int a = 0, b = 0;
    std::atomic<int> done{0};
    q.push(tagged([&] { order.push_back(1); }, [&](std::exception_ptr) { ++done; }, &a));
    q.push(tagged([&] { order.push_back(2); }, [&](std::exception_ptr) { ++done; }, &b));
    EXPECT_FALSE(q.run_here(&a));  // the runner is busy
    EXPECT_FALSE(q.run_here(&b));  // and a is ahead of b
    release.set_value();
    q.shutdown();
    EXPECT_EQ(done.load(), 2);
    EXPECT_EQ(order, (std::vector<int>{0, 1, 2}));
}

TEST(WorkerQueue, RunHereFromManyThreadsKeepsOneAtATimeInIssueOrder) {
    constexpr int kThreads = 4, kOps = 1500;
    WorkerQueue q("test ");
    std::mutex issue;  // issue order: the order of pushes
    int next = 0;
    std::vector<int> ran;
    std::atomic<int> inside{0}, overlaps{0}, here{0};
    std::vector<std::atomic<int>> completed(kThreads * kOps);
    std::vector<std::thread> ts;
    for (int t = 0; t < kThreads; ++t)
        ts.emplace_back([&] {
            for (int i = 0; i < kOps; ++i) {
                auto done = std::make_shared<std::promise<void>>();
                auto f = done->get_future();
                const char tag = 0;
                {
                    std::lock_guard lock(issue);
                    const int seq = next++;
                    q.push(tagged(
                        [&, seq] {
                            if (inside.fetch_add(1) != 0) ++overlaps;
                            ran.push_back(seq);
                            inside.fetch_sub(1);
                        },
                        [&completed, seq, done](std::exception_ptr e) {
                            EXPECT_FALSE(e);
                            completed[seq].fetch_add(1);
                            done->set_value();
                        },
                        &tag));
                }
                if (q.run_here(&tag)) ++here;
                ASSERT_EQ(f.wait_for(30s), std::future_status::ready);
            }
        });
    for (auto& t : ts) t.join();
    q.shutdown();
    EXPECT_EQ(overlaps.load(), 0);
    ASSERT_EQ(ran.size(), static_cast<std::size_t>(kThreads * kOps));
    for (int i = 0; i < kThreads * kOps; ++i) {
        EXPECT_EQ(ran[i], i);
        EXPECT_EQ(completed[i].load(), 1) << i;
    }
    EXPECT_GT(here.load(), 0);
}
