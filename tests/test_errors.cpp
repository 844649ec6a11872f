// Bad input and mismatched collectives give clear errors on every rank.
#include <mpiml/mpiml.hpp>

#include <gtest/gtest.h>

#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <string>
#include <vector>

namespace {

int rank() { return mpiml::proc_id(); }
int size() { return mpiml::num_procs(); }
std::string tag() { return "rank " + std::to_string(rank()) + "/" + std::to_string(size()); }

// Runs f, expects mpiml::Error whose message holds every piece in `parts`
// (a piece "a|b": either).
template <class F>
void expect_error(F f, std::vector<std::string> parts) {
    try {
        f();
        ADD_FAILURE() << "expected mpiml::Error";
    } catch (const mpiml::Error& e) {
        const std::string what = e.what();
        for (const auto& p : parts) {  // "a|b": either
            bool found = false;
            for (std::size_t b = 0, e; !found && b <= p.size(); b = e + 1) {
                e = std::min(p.find('|', b), p.size());
                found = what.find(p.substr(b, e - b)) != std::string::npos;
            }
            EXPECT_TRUE(found) << what << " lacks " << p;
        }
        EXPECT_EQ(e.rank(), rank());
    }
}

TEST(Errors, MisSizedSendRecv) {
    std::vector<float> send(3), recv(4);
    expect_error([&] { mpiml::allreduce(send, recv, mpiml::Op::sum); },
                 {"mpiml::allreduce", tag(), "send has 3 elements but recv has 4"});
}

TEST(Errors, RootOutOfRange) {
    int x = 0;
    expect_error([&] { mpiml::broadcast(x, size()); },
                 {"mpiml::broadcast", tag(), "root " + std::to_string(size()) + " is out of range"});
    expect_error([&] { mpiml::broadcast(x, -1); }, {"root -1 is out of range"});
}

TEST(Errors, UnsupportedOpForType) {
    expect_error([&] { mpiml::mpi_op(1.5, mpiml::Op::bxor); },
                 {"mpiml::mpi_op", tag(), "'bxor' is not defined for element type double"});
    expect_error([&] { mpiml::mpi_op(1.5f, mpiml::Op::land); }, {"'land'", "float"});
    expect_error([&] { mpiml::mpi_sum(true); }, {"mpiml::mpi_sum", "'sum'", "bool"});
    expect_error([&] { mpiml::mpi_op(1, MPI_OP_NULL); }, {"MPI_OP_NULL"});
}

TEST(Errors, OverlappingBuffers) {
    std::vector<int> v(8);
    std::span<int> a(v.data(), 4), b(v.data() + 2, 4);
    expect_error([&] { mpiml::allreduce(std::span<const int>(a), b, mpiml::Op::sum); }, {"overlap"});
}

TEST(Errors, NullCommunicator) {
    expect_error([&] { mpiml::mpi_sum(1, MPI_COMM_NULL); }, {"MPI_COMM_NULL"});
}

// Inter-communicators: a clear error on every rank (not the other group's sum,
// nor an allgather writing past its buffer).
TEST(Errors, InterCommunicatorsAreRefused) {
    if (size() < 2) GTEST_SKIP() << "needs 2 ranks";
    MPI_Comm half = MPI_COMM_NULL, inter = MPI_COMM_NULL;
    const int color = rank() == 0 ? 0 : 1;
    ASSERT_EQ(MPI_Comm_split(MPI_COMM_WORLD, color, rank(), &half), MPI_SUCCESS);
    ASSERT_EQ(MPI_Intercomm_create(half, 0, MPI_COMM_WORLD, color == 0 ? 1 : 0, 7, &inter),
              MPI_SUCCESS);
    expect_error([&] { mpiml::mpi_sum(1.0, inter); },
                 {"mpiml::mpi_sum", tag(), "inter-communicators are not supported"});
    expect_error([&] { mpiml::mpi_statistics_scalar(std::vector<double>{1.0}, inter); },
                 {"mpiml::mpi_statistics_scalar", "inter-communicators"});
    MPI_Comm_free(&inter);
    MPI_Comm_free(&half);
}

// Options only start-up sets, asked for after mpiml started MPI: an error, not
// a Session silently running without them.
TEST(Errors, SessionOptionsAfterStartUpAreAnError) {
    mpiml::SessionOptions no_handlers;
    no_handlers.abort_on_failure = false;
    expect_error([&] { mpiml::Session s(no_handlers); },
                 {"mpiml::Session", "abort_on_failure", "make the Session before any other mpiml call"});
    int provided = 0;
    MPI_Query_thread(&provided);
    if (provided < MPI_THREAD_MULTIPLE) {
        mpiml::SessionOptions more;
        more.thread_level = provided + 1;
        expect_error([&] { mpiml::Session s(more); }, {"mpiml::Session", "thread level"});
    }
    mpiml::SessionOptions same;
    same.thread_level = provided;
    mpiml::Session fine(same);  // asks for nothing new
    EXPECT_EQ(fine.thread_level(), provided);
}

// Without MPIML_CHECK, calls MPI carries still compare the ranks' arguments:
// on one host before the call (the check's round; the communicator stays
// usable), across hosts beside it, every rank throwing after MPI's call where
// MPI gave a partial result, a mixed-up sum or (on some ranks) its truncation
// error, and the communicator takes no collective after it. 2 ranks: a tree
// of MPI's could leave a third rank waiting in the call across hosts.
class NoCheck : public ::testing::Test {
protected:
    void SetUp() override {
        if (size() != 2) GTEST_SKIP() << "2 ranks";
        was_ = mpiml::check_enabled();
        mode_ = mpiml::shm::config().mode;
        mpiml::set_check(false);
        mpiml::shm::set_mode(mpiml::shm::Mode::off);  // MPI's path (the shared one checks always)
        MPI_Comm host = MPI_COMM_NULL;
        ASSERT_EQ(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &host), MPI_SUCCESS);
        int n = 0;
        MPI_Comm_size(host, &n);
        MPI_Comm_free(&host);
        across_ = n != size();
    }
    void TearDown() override {
        if (size() != 2) return;
        for (MPI_Comm& c : comms_) MPI_Comm_free(&c);
        EXPECT_EQ(mpiml::mpi_sum(1), size());  // the world is still in step
        mpiml::set_check(was_);
        mpiml::shm::set_mode(mode_);
    }
    MPI_Comm fresh() {
        MPI_Comm c = MPI_COMM_NULL;
        EXPECT_EQ(MPI_Comm_dup(MPI_COMM_WORLD, &c), MPI_SUCCESS);
        return comms_.emplace_back(c);
    }
    // f's error on a fresh communicator: on one host the check's (what each
    // rank called), across hosts the one after the call (what differs, `diff`).
    // Then the communicator is usable on one host, closed across hosts.
    template <class F>
    void expect_mismatch(F f, const std::string& call, const std::string& mine, const std::string& diff) {
        const MPI_Comm c = fresh();
        if (across_) {
            expect_error([&] { f(c); },
                         {call + " on " + tag(), kAfter, diff, "this rank called " + mine,
                          "no collective can run on this communicator again", "MPIML_CHECK=1"});
            expect_error([&] { mpiml::barrier(c); },
                         {"mpiml::barrier", tag(), "an earlier call on this communicator had mismatched arguments"});
        } else {
            expect_error([&] { f(c); }, {call + " on " + tag(), "mismatched collectives", "rank " + std::to_string(rank()) + " called " + mine});
            EXPECT_EQ(mpiml::mpi_sum(rank() + 1, c), 3);  // in step
        }
    }
    static inline const std::string kAfter =
        "mismatched calls on MPI's path, found after the call (its result is not valid)";
    std::vector<MPI_Comm> comms_;
    bool across_ = false;
    bool was_ = false;
    mpiml::shm::Mode mode_{};
};

TEST_F(NoCheck, BroadcastCounts) {
    // root sends more (MPI: truncated on the receiver), then less (MPI: a partial result)
    for (int more = 0; more < 2; ++more) {
        std::vector<int> v((rank() == 0) == (more == 1) ? 4 : 2, 5);
        expect_mismatch([&](MPI_Comm c) { mpiml::broadcast(v, 0, c); }, "mpiml::broadcast",
                        "broadcast(count=" + std::to_string(v.size()) + ", type=int, root=0)",
                        "count 2 on one rank, 4 on another");
    }
}

TEST_F(NoCheck, AllreduceCounts) {
    for (int shorter = 0; shorter < 2; ++shorter) {
        std::vector<float> v(rank() == shorter ? 999 : 1000, 1.0f);
        expect_mismatch([&](MPI_Comm c) { mpiml::allreduce(v, mpiml::Op::sum, c); }, "mpiml::allreduce",
                        "allreduce(count=" + std::to_string(v.size()) + ", type=float, op=sum)",
                        "count 999 on one rank, 1000 on another");
    }
}

TEST_F(NoCheck, OpsTypesAndRoots) {
    const mpiml::Op op = rank() == 0 ? mpiml::Op::max : mpiml::Op::min;
    expect_mismatch([&](MPI_Comm c) { mpiml::mpi_op(rank() + 1, op, c); }, "mpiml::mpi_op",
                    std::string("allreduce(count=1, type=int, op=") + (rank() == 0 ? "max" : "min") + ")",
                    "op min on one rank, max on another");
    expect_mismatch(
        [&](MPI_Comm c) {
            if (rank() == 0) mpiml::mpi_sum(1.0f, c);
            else mpiml::mpi_sum(1, c);
        },
        "mpiml::mpi_sum", std::string("allreduce(count=1, type=") + (rank() == 0 ? "float" : "int") + ", op=sum)",
        "type ");
    expect_mismatch(
        [&](MPI_Comm c) {
            int x = 1;
            mpiml::broadcast(x, rank(), c);
        },
        "mpiml::broadcast", "broadcast(count=1, type=int, root=" + std::to_string(rank()) + ")",
        "root 0 on one rank, 1 on another");
}

TEST_F(NoCheck, AllgatherAndAverage) {
    std::vector<double> mine(rank() == 0 ? 3 : 4, 1.0), all(8);
    expect_mismatch(
        [&](MPI_Comm c) { mpiml::detail::allgather(mine.data(), all.data(), mine.size(), MPI_DOUBLE, c, "test allgather"); },
        "test allgather", "allgather(count=" + std::to_string(mine.size()) + ", type=double)",
        "count 3 on one rank, 4 on another");
    std::vector<double> g(rank() == 0 ? 5 : 6, 1.0);
    expect_mismatch([&](MPI_Comm c) { mpiml::detail::average(g.data(), g.size(), MPI_DOUBLE, c, "test average"); },
                    "test average", "allreduce(count=" + std::to_string(g.size()) + ", type=double, op=sum)",
                    "count 5 on one rank, 6 on another");
}

TEST_F(NoCheck, MatchingCallsPass) {
    const MPI_Comm c = fresh();
    std::vector<double> v(100, 1.0 + rank());
    mpiml::allreduce(v, mpiml::Op::sum, c);
    EXPECT_EQ(v[99], 3.0);
    int x = rank() == 1 ? 9 : 0;
    mpiml::broadcast(x, 1, c);
    EXPECT_EQ(x, 9);
    std::vector<int> all(2);
    mpiml::detail::allgather(&x, all.data(), 1, MPI_INT, c, "test allgather");
    EXPECT_EQ(all, (std::vector<int>{9, 9}));
}

TEST(Errors, MpiErrorsBecomeExceptions) {
    // MPI rejects a null datatype; its error comes back as mpiml::Error.
    int x = 0;
    expect_error([&] { mpiml::detail::broadcast(&x, 1, MPI_DATATYPE_NULL, 0, MPI_COMM_WORLD, "test"); },
                 {"test", tag(), "MPI error"});
}

class Mismatch : public ::testing::Test {
protected:
    void SetUp() override { mpiml::set_check(true); }
    void TearDown() override { mpiml::set_check(false); }
};

TEST_F(Mismatch, CountsNameTheRanks) {
    if (size() < 2) GTEST_SKIP() << "needs 2 ranks";
    std::vector<double> v(rank() == 1 ? 4 : 3);
    expect_error([&] { mpiml::allreduce(v, mpiml::Op::sum); },
                 {"mismatched collectives", "rank 1 called allreduce(count=4", "count=3"});
    EXPECT_EQ(mpiml::mpi_sum(1), size());  // still in step
}

TEST_F(Mismatch, Types) {
    if (size() < 2) GTEST_SKIP() << "needs 2 ranks";
    expect_error(
        [&] {
            if (rank() == 0) mpiml::mpi_sum(1.0f);
            else mpiml::mpi_sum(1.0);
        },
        {"mismatched", "type=float", "type=double"});
}

TEST_F(Mismatch, OpsAndKinds) {
    if (size() < 2) GTEST_SKIP() << "needs 2 ranks";
    expect_error([&] { mpiml::mpi_op(1, rank() == 0 ? mpiml::Op::max : mpiml::Op::min); },
                 {"op=max", "op=min"});
    expect_error(
        [&] {
            int x = 1;
            if (rank() == 0) mpiml::broadcast(x, 0);
            else mpiml::allreduce(x, mpiml::Op::sum);
        },
        {"broadcast(count=1, type=int, root=0)", "allreduce(count=1, type=int, op=sum)"});
    expect_error(
        [&] {
            int x = 1;
            mpiml::broadcast(x, rank() == 0 ? 0 : 1);
        },
        {"root=0", "root=1"});
}

TEST_F(Mismatch, MatchingCallsPass) {
    std::vector<double> v(5, 1.0);
    mpiml::allreduce(v, mpiml::Op::sum);
    EXPECT_EQ(v[4], 1.0 * size());
}

TEST(Errors, BadEnvironmentValuesAreNamed) {
    // read_environment is applied at init; check the parser through set_timeout.
    expect_error([] { mpiml::set_timeout(-1); }, {"mpiml::set_timeout", ">= 0"});
}

// Stopping on a signal: refused signals name why; a signal on one rank makes
// should_stop() true on every rank.
TEST(Stop, SignalOnOneRankStopsEveryRank) {
    expect_error([] { mpiml::stop_on_signals({SIGUSR1}); }, {"mpiml::stop_on_signals", "report"});
    expect_error([] { mpiml::stop_on_signals({SIGKILL}); }, {"cannot be caught"});
    expect_error([] { mpiml::stop_on_signals({SIGSEGV}); }, {"fatal signal"});
    mpiml::stop_on_signals({SIGUSR2});
    EXPECT_FALSE(mpiml::should_stop());
    if (rank() == size() - 1) std::raise(SIGUSR2);  // the rank goes on
    EXPECT_EQ(mpiml::stop_requested(), rank() == size() - 1);
    EXPECT_EQ(mpiml::stop_signal(), rank() == size() - 1 ? SIGUSR2 : 0);
    EXPECT_TRUE(mpiml::should_stop());
}

// SIGPIPE under the failure handlers: a write to a socket whose peer has gone
// (MPI's transport to a rank that ended) fails with EPIPE and the rank goes
// on; a broken stdout still ends the process by SIGPIPE.
TEST(Failure, BrokenSocketFailsTheWriteBrokenStdoutEndsTheProcess) {
    int sv[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    ::close(sv[1]);
    errno = 0;
    EXPECT_EQ(::write(sv[0], "x", 1), -1) << tag();
    EXPECT_EQ(errno, EPIPE) << tag();
    ::close(sv[0]);
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0) << tag();
    if (pid == 0) {  // async-signal-safe calls only
        int p[2];
        if (::pipe(p) != 0 || ::dup2(p[1], 1) != 1) ::_exit(2);
        ::close(p[0]);
        ::close(p[1]);
        [[maybe_unused]] const ssize_t k = ::write(1, "x", 1);
        ::_exit(3);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid) << tag();
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGPIPE) << tag() << ": child status " << status;
}

}  // namespace
