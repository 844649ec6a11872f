// Bad input and mismatched collectives give clear errors on every rank.
#include <mpiml/mpiml.hpp>

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace {

int rank() { return mpiml::proc_id(); }
int size() { return mpiml::num_procs(); }
std::string tag() { return "rank " + std::to_string(rank()) + "/" + std::to_string(size()); }

// Runs f, expects mpiml::Error whose message holds every piece in `parts`.
template <class F>
void expect_error(F f, std::vector<std::string> parts) {
    try {
        f();
        ADD_FAILURE() << "expected mpiml::Error";
    } catch (const mpiml::Error& e) {
        const std::string what = e.what();
        for (const auto& p : parts) EXPECT_NE(what.find(p), std::string::npos) << what << " lacks " << p;
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
    expect_error([&] { mpiml::mpi_sum(true); }, {"'sum'", "bool"});
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

}  // namespace
