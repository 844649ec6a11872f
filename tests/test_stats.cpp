// mpi_statistics_scalar: pooled, exact count, stable, uneven and empty ranks.
#include <mpiml/mpiml.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace {

int rank() { return mpiml::proc_id(); }
int size() { return mpiml::num_procs(); }

// Deterministic samples for rank r: 3 + r values (uneven across ranks).
std::vector<double> samples_of(int r, double offset = 0.0) {
    std::vector<double> v;
    for (int i = 0; i < 3 + r; ++i) v.push_back(offset + 0.5 * i - 1.25 * r + (i % 2 ? 0.125 : 0.0));
    return v;
}

// Reference: long double two-pass over every rank's samples.
mpiml::Statistics reference(double offset = 0.0) {
    std::vector<double> all;
    for (int r = 0; r < size(); ++r)
        for (double x : samples_of(r, offset)) all.push_back(x);
    long double sum = 0;
    for (double x : all) sum += x;
    const long double mean = sum / all.size();
    long double ss = 0;
    for (double x : all) ss += (x - mean) * (x - mean);
    mpiml::Statistics s;
    s.count = all.size();
    s.mean = static_cast<double>(mean);
    s.std = static_cast<double>(std::sqrt(ss / all.size()));
    s.min = *std::min_element(all.begin(), all.end());
    s.max = *std::max_element(all.begin(), all.end());
    return s;
}

TEST(Stats, UnevenDoubleSamples) {
    const auto st = mpiml::mpi_statistics_scalar(samples_of(rank()), true);
    const auto ref = reference();
    EXPECT_EQ(st.count, ref.count);
    EXPECT_NEAR(st.mean, ref.mean, 1e-14);
    EXPECT_NEAR(st.std, ref.std, 1e-14);
    EXPECT_EQ(st.min, ref.min);
    EXPECT_EQ(st.max, ref.max);
}

// As numpy's mean and std: an inf sample makes the mean inf (NaN with both
// signs) and the std NaN; a NaN makes both NaN. Whichever rank holds it, at
// any rank count; never a std of 0 that hides a diverged run.
TEST(Stats, InfAndNanSamplesGiveNumpysAnswers) {
    const double inf = std::numeric_limits<double>::infinity();
    const auto check = [](const std::vector<double>& x, double mean, bool mean_nan) {
        const auto st = mpiml::mpi_statistics_scalar(x);
        if (mean_nan)
            EXPECT_TRUE(std::isnan(st.mean)) << st.mean;
        else
            EXPECT_EQ(st.mean, mean);
        EXPECT_TRUE(std::isnan(st.std)) << st.std;
    };
    check({inf, 1.0}, inf, false);
    check({-inf, 1.0}, -inf, false);
    check(rank() == 0 ? std::vector<double>{inf} : std::vector<double>{1.0}, inf, false);
    check(rank() == size() - 1 ? std::vector<double>{inf} : std::vector<double>{2.0, 3.0}, inf, false);
    check({std::nan(""), 1.0}, 0.0, true);
    check(rank() == size() - 1 ? std::vector<double>{-inf} : std::vector<double>{inf}, -inf, size() > 1);
    // finite samples still give a std of 0 where all are equal
    EXPECT_EQ(mpiml::mpi_statistics_scalar(std::vector<double>{2.0, 2.0}).std, 0.0);
}

TEST(Stats, FloatAndIntInputsAccumulateInDouble) {
    std::vector<float> f;
    for (double x : samples_of(rank())) f.push_back(static_cast<float>(x));  // exact in float
    const auto sf = mpiml::mpi_statistics_scalar(f);
    const auto ref = reference();
    EXPECT_NEAR(sf.mean, ref.mean, 1e-14);
    EXPECT_NEAR(sf.std, ref.std, 1e-14);

    std::vector<int> ints;
    for (int i = 0; i < 3 + rank(); ++i) ints.push_back(i * (rank() + 1));
    long double sum = 0, n = 0;
    std::vector<long double> all;
    for (int r = 0; r < size(); ++r)
        for (int i = 0; i < 3 + r; ++i) all.push_back(i * (r + 1));
    for (auto x : all) sum += x, n += 1;
    const long double mean = sum / n;
    long double ss = 0;
    for (auto x : all) ss += (x - mean) * (x - mean);
    const auto si = mpiml::mpi_statistics_scalar(ints, true);
    EXPECT_EQ(si.count, all.size());
    EXPECT_NEAR(si.mean, static_cast<double>(mean), 1e-12);
    EXPECT_NEAR(si.std, static_cast<double>(std::sqrt(ss / n)), 1e-12);
    EXPECT_EQ(si.min, 0.0);
    EXPECT_EQ(si.max, (size() + 1.0) * size());  // i = 2 + r at r = size - 1
}

TEST(Stats, LargeOffsetIsNumericallyStable) {
    // 1e8 + small noise: a naive sum of squares in float32 (the seed) or even
    // E[x^2] - E[x]^2 in double loses the small spread entirely.
    const auto st = mpiml::mpi_statistics_scalar(samples_of(rank(), 1e8));
    const auto ref = reference(0.0);
    EXPECT_NEAR(st.mean, 1e8 + ref.mean, 1e-6);
    EXPECT_NEAR(st.std, ref.std, 1e-7 * ref.std);
}

TEST(Stats, SomeRanksEmpty) {
    std::vector<double> mine;
    if (rank() == 0) mine = {1.0, 2.0, 3.0, 4.0};
    const auto st = mpiml::mpi_statistics_scalar(mine, true);
    EXPECT_EQ(st.count, 4u);
    EXPECT_DOUBLE_EQ(st.mean, 2.5);
    EXPECT_DOUBLE_EQ(st.std, std::sqrt(1.25));
    EXPECT_EQ(st.min, 1.0);
    EXPECT_EQ(st.max, 4.0);
}

TEST(Stats, NoSamplesAnywhereThrowsOnEveryRank) {
    const std::vector<double> none;
    try {
        mpiml::mpi_statistics_scalar(none);
        FAIL() << "expected mpiml::Error";
    } catch (const mpiml::Error& e) {
        EXPECT_NE(std::string(e.what()).find("mpi_statistics_scalar"), std::string::npos);
        EXPECT_NE(std::string(e.what()).find("no rank has any sample"), std::string::npos);
        EXPECT_EQ(e.rank(), rank());
    }
    // The job is still usable afterwards (every rank took the same path).
    EXPECT_EQ(mpiml::mpi_sum(1), size());
}

TEST(Stats, BitIdenticalAcrossRanks) {
    std::mt19937_64 gen(1234 + rank());
    std::normal_distribution<double> d(3.0, 2.0);
    std::vector<double> x(1000 + 17 * rank());
    for (auto& v : x) v = d(gen);
    const auto st = mpiml::mpi_statistics_scalar(x);
    const auto means = mpiml::allgather(st.mean);
    const auto stds = mpiml::allgather(st.std);
    for (int r = 0; r < size(); ++r) {
        EXPECT_EQ(std::memcmp(&means[r], &st.mean, sizeof(double)), 0);
        EXPECT_EQ(std::memcmp(&stds[r], &st.std, sizeof(double)), 0);
    }
}

TEST(Stats, ExactCountBeyondFloat32) {
    // Counts are 64-bit integers: 2^24 + 1 samples are not rounded.
    std::vector<float> x(rank() == 0 ? (1u << 24) + 1 : 0, 1.0f);
    const auto st = mpiml::mpi_statistics_scalar(x);
    EXPECT_EQ(st.count, (1u << 24) + 1);
    EXPECT_EQ(st.mean, 1.0);
    EXPECT_EQ(st.std, 0.0);
}

// numpy's min and max propagate NaN: a NaN sample on any rank makes them NaN
// on every rank (a NaN never hides behind the others' values).
TEST(Stats, NanSampleMakesMinAndMaxNan) {
    for (int holder = 0; holder < size(); ++holder) {
        std::vector<double> x = samples_of(rank());
        if (rank() == holder) x[1] = std::numeric_limits<double>::quiet_NaN();
        const auto st = mpiml::mpi_statistics_scalar(x, true);
        EXPECT_TRUE(std::isnan(st.min)) << "NaN on rank " << holder << ": min " << st.min;
        EXPECT_TRUE(std::isnan(st.max)) << "NaN on rank " << holder << ": max " << st.max;
        EXPECT_TRUE(std::isnan(st.mean));
    }
    // Every sample NaN: not min = inf > max = -inf.
    const auto st = mpiml::mpi_statistics_scalar(
        std::vector<double>(2, std::numeric_limits<double>::quiet_NaN()));
    EXPECT_TRUE(std::isnan(st.min) && std::isnan(st.max)) << st.min << " " << st.max;
    // inf and -inf without a NaN: numpy's min and max are -inf and inf.
    const double inf = std::numeric_limits<double>::infinity();
    const auto si = mpiml::mpi_statistics_scalar(std::vector<double>{rank() == 0 ? inf : -inf, 1.0});
    EXPECT_EQ(si.max, inf);
    EXPECT_EQ(si.min, size() > 1 ? -inf : 1.0);
}

// The communicator may come second, as in mpi_sum(x, comm): statistics over
// its ranks only, not over the world.
TEST(Stats, CommunicatorAsSecondArgument) {
    MPI_Comm half = MPI_COMM_NULL;
    ASSERT_EQ(MPI_Comm_split(MPI_COMM_WORLD, rank() % 2, rank(), &half), MPI_SUCCESS);
    const std::vector<double> x{static_cast<double>(rank() * rank())};
    const auto st = mpiml::mpi_statistics_scalar(x, half);
    double sum = 0;
    std::uint64_t n = 0;
    for (int r = rank() % 2; r < size(); r += 2) sum += r * r, ++n;
    EXPECT_EQ(st.count, n);
    EXPECT_DOUBLE_EQ(st.mean, sum / static_cast<double>(n));
    const auto seed_form = mpiml::mpi_statistics_scalar(x, true, half);
    EXPECT_EQ(seed_form.count, n);
    MPI_Comm_free(&half);
}

template <class A>
concept StatsTakes = requires(const std::vector<double>& v, A a) { mpiml::mpi_statistics_scalar(v, a); };
static_assert(StatsTakes<bool>);
static_assert(StatsTakes<MPI_Comm>);
static_assert(StatsTakes<mpiml::Comm>);
static_assert(!StatsTakes<double>, "a number is neither with_min_and_max nor a communicator");
static_assert(!StatsTakes<long>);

}  // namespace
