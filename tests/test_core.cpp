// Core collectives against exact expected values, for several element types.
#include <mpiml/mpiml.hpp>

#include "backends/mpi/pace.hpp"
#include "core/state.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <complex>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace {

int rank() { return mpiml::proc_id(); }
int size() { return mpiml::num_procs(); }

template <class T>
class Typed : public ::testing::Test {};
using Types = ::testing::Types<int, long, long long, unsigned, std::int8_t, std::uint16_t,
                               float, double, long double>;
TYPED_TEST_SUITE(Typed, Types);

TEST(Core, RankAndSize) {
    int r = -1, n = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    EXPECT_EQ(mpiml::proc_id(), r);
    EXPECT_EQ(mpiml::num_procs(), n);
    EXPECT_TRUE(mpiml::is_initialized());
}

TYPED_TEST(Typed, ScalarOpsPreserveType) {
    using T = TypeParam;
    const T x = static_cast<T>(rank() + 1);
    const auto s = mpiml::mpi_sum(x);
    static_assert(std::is_same_v<decltype(s), const T>);
    EXPECT_EQ(s, static_cast<T>(size() * (size() + 1) / 2));
    EXPECT_EQ(mpiml::mpi_op(x, mpiml::Op::max), static_cast<T>(size()));
    EXPECT_EQ(mpiml::mpi_op(x, mpiml::Op::min), static_cast<T>(1));
    T fact = 1;
    for (int i = 1; i <= size(); ++i) fact = static_cast<T>(fact * i);
    EXPECT_EQ(mpiml::mpi_op(x, mpiml::Op::prod), fact);
}

TYPED_TEST(Typed, RangeSumAndInPlace) {
    using T = TypeParam;
    const std::vector<T> v = {static_cast<T>(rank()), static_cast<T>(1), static_cast<T>(2 * rank())};
    const auto s = mpiml::mpi_sum(v);
    static_assert(std::is_same_v<typename decltype(s)::value_type, T>);
    const int tri = size() * (size() - 1) / 2;
    ASSERT_EQ(s.size(), 3u);
    EXPECT_EQ(s[0], static_cast<T>(tri));
    EXPECT_EQ(s[1], static_cast<T>(size()));
    EXPECT_EQ(s[2], static_cast<T>(2 * tri));

    std::vector<T> w = v;
    mpiml::allreduce(w, mpiml::Op::max);
    EXPECT_EQ(w[0], static_cast<T>(size() - 1));
    EXPECT_EQ(w[1], static_cast<T>(1));
    EXPECT_EQ(w[2], static_cast<T>(2 * (size() - 1)));

    std::vector<T> in_place = v;  // in place: the sum replaces the input
    mpiml::allreduce(in_place, mpiml::Op::sum);
    EXPECT_EQ(in_place, s);

    std::array<T, 3> out{};
    mpiml::allreduce(v, out, mpiml::Op::sum);
    EXPECT_EQ(out[0], s[0]);
    EXPECT_EQ(out[2], s[2]);

    T scalar = static_cast<T>(rank());
    mpiml::allreduce(scalar, mpiml::Op::sum);
    EXPECT_EQ(scalar, static_cast<T>(tri));
}

TYPED_TEST(Typed, Broadcast) {
    using T = TypeParam;
    for (int root = 0; root < size(); ++root) {
        T x = static_cast<T>(rank() == root ? 42 : 0);
        mpiml::broadcast(x, root);
        EXPECT_EQ(x, static_cast<T>(42));
        std::vector<T> v(5, static_cast<T>(rank()));
        mpiml::broadcast(v, root);
        for (const T& e : v) EXPECT_EQ(e, static_cast<T>(root));
    }
}

TEST(Core, AvgOfIntegersIsDouble) {
    const auto a = mpiml::mpi_avg(rank());
    static_assert(std::is_same_v<decltype(a), const double>);
    EXPECT_DOUBLE_EQ(a, (size() - 1) / 2.0);
    const std::vector<int> v = {rank(), 1};
    const auto av = mpiml::mpi_avg(v);
    static_assert(std::is_same_v<decltype(av)::value_type, double>);
    EXPECT_DOUBLE_EQ(av[0], (size() - 1) / 2.0);
    EXPECT_DOUBLE_EQ(av[1], 1.0);
}

TEST(Core, AvgKeepsFloatAndDoublePrecision) {
    // The seed downcasts to float32; 1 + 1e-12 survives only in double.
    const double d = 1.0 + 1e-12 * rank();
    EXPECT_DOUBLE_EQ(mpiml::mpi_avg(d), 1.0 + 1e-12 * (size() - 1) / 2.0);
    const float f = 0.5f * static_cast<float>(rank());
    const auto af = mpiml::mpi_avg(f);
    static_assert(std::is_same_v<decltype(af), const float>);
    EXPECT_FLOAT_EQ(af, 0.25f * static_cast<float>(size() - 1));
    // int64 beyond 2^24 stays exact in a sum (float32 would round it).
    const std::int64_t big = (std::int64_t{1} << 40) + rank();
    EXPECT_EQ(mpiml::mpi_sum(big), size() * (std::int64_t{1} << 40) + size() * (size() - 1) / 2);
}

TEST(Core, LogicalAndBitwise) {
    const unsigned bit = 1u << rank();
    EXPECT_EQ(mpiml::mpi_op(bit, mpiml::Op::bor), (1u << size()) - 1);
    EXPECT_EQ(mpiml::mpi_op(bit, mpiml::Op::band), size() == 1 ? 1u : 0u);
    EXPECT_EQ(mpiml::mpi_op(0xFFu, mpiml::Op::bxor), size() % 2 ? 0xFFu : 0u);
    const bool mine = rank() == 0;
    EXPECT_EQ(mpiml::mpi_op(mine, mpiml::Op::lor), true);
    EXPECT_EQ(mpiml::mpi_op(mine, mpiml::Op::land), size() == 1);
    EXPECT_EQ(mpiml::mpi_op(mine, mpiml::Op::lxor), true);
    EXPECT_EQ(mpiml::mpi_op(rank(), mpiml::Op::land), size() == 1 ? 0 : 0);
}

// bool is MPI_CXX_BOOL (its registry line): lor and land over ranks, small and
// large enough for the shared-memory path.
TEST(Core, BoolArraysLorLand) {
    for (const std::size_t n : {std::size_t{5}, std::size_t{1} << 20}) {
        auto mine = std::make_unique<bool[]>(n), any = std::make_unique<bool[]>(n),
             all = std::make_unique<bool[]>(n);
        for (std::size_t i = 0; i < n; ++i) mine[i] = (i + static_cast<std::size_t>(rank())) % 3 == 0;
        mpiml::allreduce(std::span<const bool>(mine.get(), n), std::span<bool>(any.get(), n), mpiml::Op::lor);
        mpiml::allreduce(std::span<const bool>(mine.get(), n), std::span<bool>(all.get(), n), mpiml::Op::land);
        for (std::size_t i = 0; i < n; ++i) {
            bool want_any = false, want_all = true;
            for (int r = 0; r < size(); ++r) {
                const bool v = (i + static_cast<std::size_t>(r)) % 3 == 0;
                want_any = want_any || v;
                want_all = want_all && v;
            }
            ASSERT_EQ(any[i], want_any) << "n " << n << " i " << i;
            ASSERT_EQ(all[i], want_all) << "n " << n << " i " << i;
        }
    }
    EXPECT_EQ(mpiml::mpi_datatype<bool>(), MPI_CXX_BOOL);
}

TEST(Core, RawMpiOpAccepted) {
    EXPECT_EQ(mpiml::mpi_op(rank(), MPI_MAX), size() - 1);
    const std::vector<double> v = {1.0 * rank()};
    EXPECT_DOUBLE_EQ(mpiml::mpi_op(v, MPI_SUM)[0], size() * (size() - 1) / 2.0);
    std::vector<double> w(1);
    mpiml::allreduce(v, w, MPI_MIN);
    EXPECT_EQ(w[0], 0.0);
}

// Integer ops through MPI itself (shared-memory path off) wrap like C and
// order unsigned values as unsigned, although Open MPI 4.1 (AVX sums of 8/16-bit
// types, MPI_UNSIGNED_LONG min/max) and MPICH 4.0 (unsigned min/max) do not.
template <class T>
void check_integer_ops_through_mpi() {
    struct ShmOff {
        mpiml::shm::Mode saved = mpiml::shm::config().mode;
        ShmOff() { mpiml::shm::set_mode(mpiml::shm::Mode::off); }
        ~ShmOff() { mpiml::shm::set_mode(saved); }
    } off;
    constexpr T top = std::numeric_limits<T>::max();
    using U = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;
    constexpr std::size_t m = 300;
    // Near the top, so that sums overflow and must wrap.
    auto big = [](int r, std::size_t i) { return static_cast<T>(top - i % 5 - r); };
    // Rank 0: the top bit set (unsigned) or the minimum (signed); others small.
    auto mixed = [](int r, std::size_t i) {
        if (r != 0) return static_cast<T>(r + i % 7);
        return std::is_unsigned_v<T> ? static_cast<T>(top - i % 3)
                                     : static_cast<T>(std::numeric_limits<T>::min() + i % 3);
    };
    std::vector<T> mine(m), got(m), lo(m), hi(m);
    for (std::size_t i = 0; i < m; ++i) mine[i] = big(rank(), i);
    mpiml::allreduce(mine, got, mpiml::Op::sum);
    for (std::size_t i = 0; i < m; ++i) {
        U want = 0;
        for (int r = 0; r < size(); ++r) want = static_cast<U>(want + static_cast<U>(big(r, i)));
        ASSERT_EQ(got[i], static_cast<T>(want)) << "sum at " << i;
    }
    for (std::size_t i = 0; i < m; ++i) mine[i] = mixed(rank(), i);
    mpiml::allreduce(mine, lo, mpiml::Op::min);
    mpiml::allreduce(mine, hi, mpiml::Op::max);
    for (std::size_t i = 0; i < m; ++i) {
        T want_lo = mixed(0, i), want_hi = want_lo;
        for (int r = 1; r < size(); ++r) {
            want_lo = std::min(want_lo, mixed(r, i));
            want_hi = std::max(want_hi, mixed(r, i));
        }
        ASSERT_EQ(lo[i], want_lo) << "min at " << i;
        ASSERT_EQ(hi[i], want_hi) << "max at " << i;
    }
}

TEST(Core, IntegerOpsExactThroughMpi) {
    check_integer_ops_through_mpi<std::int8_t>();
    check_integer_ops_through_mpi<unsigned char>();
    check_integer_ops_through_mpi<short>();
    check_integer_ops_through_mpi<unsigned short>();
    check_integer_ops_through_mpi<int>();
    check_integer_ops_through_mpi<unsigned>();
    check_integer_ops_through_mpi<long>();
    check_integer_ops_through_mpi<unsigned long>();
    check_integer_ops_through_mpi<unsigned long long>();
}

TEST(Core, UserDefinedMpiOp) {
    MPI_Op absmax;
    MPI_Op_create(
        [](void* in, void* inout, int* len, MPI_Datatype*) {
            auto* a = static_cast<double*>(in);
            auto* b = static_cast<double*>(inout);
            for (int i = 0; i < *len; ++i) b[i] = std::max(std::abs(a[i]), std::abs(b[i]));
        },
        1, &absmax);
    const double x = -1.0 * (rank() + 1);
    // With one rank MPI applies no operation at all.
    EXPECT_DOUBLE_EQ(mpiml::mpi_op(x, absmax), size() == 1 ? -1.0 : static_cast<double>(size()));
    MPI_Op_free(&absmax);
}

TEST(Core, ComplexSum) {
    const std::complex<double> z(rank(), 1.0);
    const auto s = mpiml::mpi_sum(z);
    EXPECT_DOUBLE_EQ(s.real(), size() * (size() - 1) / 2.0);
    EXPECT_DOUBLE_EQ(s.imag(), static_cast<double>(size()));
}

TEST(Core, SpansAndEmptyRanges) {
    std::vector<float> data = {1.f, 2.f, 3.f, 4.f};
    std::span<float> middle(data.data() + 1, 2);
    mpiml::allreduce(middle, mpiml::Op::sum);
    EXPECT_EQ(data[0], 1.f);
    EXPECT_EQ(data[1], 2.f * size());
    EXPECT_EQ(data[2], 3.f * size());
    EXPECT_EQ(data[3], 4.f);
    std::vector<double> empty;
    EXPECT_TRUE(mpiml::mpi_sum(empty).empty());
    mpiml::broadcast(empty);
}

TEST(Core, BroadcastString) {
    std::string s = rank() == 0 ? std::string("from root \xc3\xa9\0x", 14) : std::string("other");
    mpiml::broadcast(s);
    EXPECT_EQ(s, std::string("from root \xc3\xa9\0x", 14));
}

TEST(Core, SubCommunicator) {
    MPI_Comm half;
    MPI_Comm_split(MPI_COMM_WORLD, rank() % 2, rank(), &half);
    const int n = mpiml::num_procs(half);
    EXPECT_EQ(mpiml::mpi_sum(1, half), n);
    EXPECT_EQ(mpiml::proc_id(half), rank() / 2);
    MPI_Comm_free(&half);
}

TEST(Core, SessionDefaultCommunicator) {
    MPI_Comm self = MPI_COMM_SELF;
    {
        mpiml::SessionOptions opts;
        opts.comm = self;
        mpiml::Session s(opts);
        EXPECT_EQ(mpiml::num_procs(), 1);
        EXPECT_EQ(mpiml::mpi_sum(5), 5);
    }
    EXPECT_EQ(mpiml::num_procs(), size());
}

TEST(Core, PprintOnlyRankZero) {
    ::testing::internal::CaptureStdout();
    mpiml::pprint("hello", "|");
    mpiml::pprint();
    const std::string out = ::testing::internal::GetCapturedStdout();
    EXPECT_EQ(out, rank() == 0 ? "hello|\n" : "");
}

TEST(Core, MsgFormat) {
    ::testing::internal::CaptureStdout();
    mpiml::msg("payload", "desc");
    const std::string out = ::testing::internal::GetCapturedStdout();
    EXPECT_EQ(out, "Message from " + std::to_string(rank()) + ": desc \t payload\n");
}

TEST(Core, AllgatherInRankOrder) {
    const auto all = mpiml::allgather(rank() * 10);
    ASSERT_EQ(static_cast<int>(all.size()), size());
    for (int r = 0; r < size(); ++r) EXPECT_EQ(all[r], r * 10);
}

// The quiet waits' longest sleep follows the rate of the large transfers:
// what the link moves in kBytesPerSleep, within its bounds.
TEST(Core, QuietWaitPace) {
    using mpiml::detail::WaitPace;
    using us = std::chrono::microseconds;
    WaitPace p;
    EXPECT_EQ(p.cap(), WaitPace::kShortestCap) << "before any transfer was timed";
    p.timed(1000, 1.0);  // small: latency, not rate
    EXPECT_EQ(p.rate(), 0.0);
    EXPECT_EQ(p.cap(), WaitPace::kShortestCap);
    // 16 MiB in 134 ms: 1 Gbit/s, 128 KiB in about 1 ms.
    p.timed(16u << 20, 0.134);
    EXPECT_NEAR(p.rate(), (16u << 20) / 0.134, 1.0);
    EXPECT_GT(p.cap(), us(950));
    EXPECT_LT(p.cap(), us(1100));
    // A transfer slowed by a late peer lowers the rate by the decay only.
    p.timed(16u << 20, 10.0);
    EXPECT_NEAR(p.rate(), (16u << 20) / 0.134 * WaitPace::kDecay, 1.0);
    // A faster link: the rate follows at once, the cap at its floor.
    p.timed(64u << 20, 0.05);
    EXPECT_EQ(p.cap(), WaitPace::kShortestCap);
    // A slow link: the cap at its ceiling.
    WaitPace slow;
    slow.timed(1u << 20, 1.0);
    EXPECT_EQ(slow.cap(), WaitPace::kLongestCap);
}

// Every rank to every other: a synchronous send, then a standard one, while
// the receiver only receives (its acknowledgement of the first is the only
// thing it sends). Across hosts with two TCP connections to a peer
// (btl_tcp_links 2), Open MPI 4.1 held that acknowledgement back when the
// message came in over the peer's connection, and the sender waited forever.
TEST(Core, SynchronousSendThenSend) {
    const int size = mpiml::num_procs();
    const int me = rank();
    for (int from = 0; from < size; ++from)
        for (int to = 0; to < size; ++to) {
            if (from == to) continue;
            std::array<double, 2> msg{static_cast<double>(from), static_cast<double>(to)};
            if (me == from) {
                ASSERT_EQ(MPI_Ssend(msg.data(), 2, MPI_DOUBLE, to, 41, MPI_COMM_WORLD), MPI_SUCCESS);
                ASSERT_EQ(MPI_Send(msg.data(), 2, MPI_DOUBLE, to, 42, MPI_COMM_WORLD), MPI_SUCCESS);
            } else if (me == to) {
                for (int tag : {41, 42}) {
                    std::array<double, 2> got{};
                    ASSERT_EQ(MPI_Recv(got.data(), 2, MPI_DOUBLE, from, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE),
                              MPI_SUCCESS);
                    EXPECT_EQ(got, msg) << "rank " << me << " from " << from << ", tag " << tag;
                }
            }
        }
    mpiml::barrier();
}

#ifdef OPEN_MPI
// An Open MPI parameter as Open MPI itself sees it, through MPI_T (whose
// init sets MPI's thread level to the one it is given: the level MPI has).
unsigned ompi_param(const char* name) {
    int level = MPI_THREAD_SINGLE, provided = 0;
    MPI_Query_thread(&level);
    EXPECT_EQ(MPI_T_init_thread(level, &provided), MPI_SUCCESS);
    int index = -1;
    EXPECT_EQ(MPI_T_cvar_get_index(name, &index), MPI_SUCCESS) << name;
    MPI_T_cvar_handle handle{};
    int count = 0;
    EXPECT_EQ(MPI_T_cvar_handle_alloc(index, nullptr, &handle, &count), MPI_SUCCESS) << name;
    EXPECT_EQ(count, 1) << name;
    unsigned value = 0;
    EXPECT_EQ(MPI_T_cvar_read(handle, &value), MPI_SUCCESS) << name;
    MPI_T_cvar_handle_free(&handle);
    MPI_T_finalize();
    return value;
}
#endif

// Open MPI: mpiml turns TCP's put off unless the job set btl_tcp_flags
// (MPIML_TEST_TCP_FLAGS: the value the launch chose), and leaves the one
// connection to each peer (btl_tcp_links) as Open MPI has it (or the job set
// it: MPIML_TEST_TCP_LINKS).
TEST(Core, OpenMpiTcpFlags) {
#ifndef OPEN_MPI
    GTEST_SKIP() << "Open MPI only";
#else
    constexpr unsigned send = 0x1, put = 0x2;  // MCA_BTL_FLAGS_SEND, _PUT
    const unsigned flags = ompi_param("btl_tcp_flags");
    if (const char* want = std::getenv("MPIML_TEST_TCP_FLAGS"))
        EXPECT_EQ(flags, static_cast<unsigned>(std::stoul(want, nullptr, 0))) << "rank " << rank();
    else
        EXPECT_EQ(flags & (send | put), send) << "rank " << rank() << ": btl_tcp_flags " << flags;
    const char* links = std::getenv("MPIML_TEST_TCP_LINKS");  // the job's own choice
    EXPECT_EQ(ompi_param("btl_tcp_links"), links ? static_cast<unsigned>(std::stoul(links)) : 1U)
        << "rank " << rank();
    int after = MPI_THREAD_SINGLE;  // ompi_param's MPI_T init left MPI's thread level alone
    MPI_Query_thread(&after);
    EXPECT_EQ(after, mpiml::detail::state().provided) << "rank " << rank();
#endif
}

}  // namespace
