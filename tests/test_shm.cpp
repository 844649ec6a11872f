// Shared-memory allreduce / broadcast / SharedBucket, against MPI itself.
// Run flat, and with MPIML_NODE_SPLIT (simulated nodes: hierarchical path).
#include <mpiml/mpiml.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <span>

#include <cmath>
#include <complex>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <chrono>
#include <type_traits>
#include <vector>

namespace {

using mpiml::Op;
namespace shm = mpiml::shm;

// Forces the shared-memory path for the scope of a test.
struct ForceShm {
    shm::Mode saved = shm::config().mode;
    explicit ForceShm(shm::Mode m = shm::Mode::on) { shm::set_mode(m); }
    ~ForceShm() { shm::set_mode(saved); }
};

int rank() { return mpiml::proc_id(); }
int size() { return mpiml::num_procs(); }

std::uint64_t mix(std::uint64_t x) {
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}
double unit(std::uint64_t h) { return static_cast<double>(h >> 11) / 9007199254740992.0; }

// From the public type registry (include/mpiml/datatype.hpp).
template <class T>
struct is_complex
    : std::bool_constant<mpiml::mpi_type_traits<T>::type_class == mpiml::TypeClass::complex> {};

// Input of rank r at index i for op.
template <class T>
T value(int r, std::size_t i, Op op, std::uint64_t seed = 0) {
    const std::uint64_t h = mix(seed * 1315423911ULL + static_cast<std::uint64_t>(r) * 1000003ULL + i);
    if constexpr (std::is_same_v<T, bool>) {
        return (h & 1) != 0;
    } else if constexpr (is_complex<T>::value) {
        using R = typename T::value_type;
        if (op == Op::prod) return {R(0.5 + unit(h)), R(unit(mix(h)) - 0.5)};
        return {R(2 * unit(h) - 1), R(2 * unit(mix(h)) - 1)};
    } else if constexpr (std::is_floating_point_v<T>) {
        if (op == Op::prod) return T(0.5 + unit(h));
        return T(2 * unit(h) - 1);
    } else {
        switch (op) {
            case Op::prod: return static_cast<T>(static_cast<int>(h % 7) - 3);
            case Op::land:
            case Op::lor:
            case Op::lxor: return static_cast<T>(h % 3);  // 0, 1 and 2
            default: return static_cast<T>(h);           // full range: sums wrap
        }
    }
}

template <class T>
bool close(T got, T want) {
    if constexpr (is_complex<T>::value) {
        return close(got.real(), want.real()) && close(got.imag(), want.imag());
    } else if constexpr (std::is_floating_point_v<T>) {
        const double tol = std::is_same_v<T, float> ? 1e-5 : 1e-12;
        return std::abs(static_cast<double>(got) - static_cast<double>(want)) <=
               tol * (1.0 + std::abs(static_cast<double>(want)));
    } else {
        return got == want;
    }
}

// Bytes that carry the value (long double has padding).
template <class T>
std::size_t value_bytes() {
    if constexpr (std::is_same_v<T, long double>) return 10;
    if constexpr (std::is_same_v<T, std::complex<long double>>) return 10;
    return sizeof(T);
}

// A plain array (std::vector<bool> has no data()).
template <class T>
struct Buf {
    explicit Buf(std::size_t n_ = 0) : p(new T[n_]()), n(n_) {}
    Buf(const Buf& o) : Buf(o.n) { std::copy(o.begin(), o.end(), begin()); }
    T& operator[](std::size_t i) { return p[i]; }
    T* begin() const { return p.get(); }
    T* end() const { return p.get() + n; }
    T* data() const { return p.get(); }
    std::size_t size() const { return n; }
    std::unique_ptr<T[]> p;
    std::size_t n;
};

template <class V>
std::uint64_t fingerprint(const V& v) {
    using T = std::remove_cvref_t<decltype(*v.data())>;
    std::uint64_t h = 1469598103934665603ULL;
    for (const T& x : v) {
        const auto* b = reinterpret_cast<const unsigned char*>(&x);
        for (std::size_t k = 0; k < value_bytes<T>(); ++k) h = (h ^ b[k]) * 1099511628211ULL;
    }
    return h;
}

// True on every rank when every rank holds the same fingerprint.
bool same_on_all_ranks(std::uint64_t h) {
    std::vector<std::uint64_t> all(static_cast<std::size_t>(size()));
    MPI_Allgather(&h, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, MPI_COMM_WORLD);
    for (auto x : all)
        if (x != all[0]) return false;
    return true;
}

template <class T>
constexpr bool op_allowed(Op op) {
    constexpr bool integer = std::is_integral_v<T> && !std::is_same_v<T, bool>;
    constexpr bool flt = std::is_floating_point_v<T>;
    constexpr bool cpx = is_complex<T>::value;
    switch (op) {
        case Op::sum:
        case Op::prod: return integer || flt || cpx;
        case Op::min:
        case Op::max: return integer || flt;
        case Op::land:
        case Op::lor:
        case Op::lxor: return integer || std::is_same_v<T, bool>;
        default: return integer;
    }
}

// Small, odd and prime sizes, and sizes around chunk boundaries when chunks
// are small (the MPIML_SHM_CHUNK=4096 variants) or the type is float.
template <class T>
std::vector<std::size_t> sizes_for() {
    std::vector<std::size_t> v = {0, 1, 2, 3, 7, 13, 31, 97, 1021, 4093};
    // Both sides of the one-barrier round's limit (16 KiB, one node).
    for (std::size_t n : {16384 / sizeof(T), 16384 / sizeof(T) + 1}) v.push_back(n);
    const std::size_t c = shm::config().chunk / sizeof(T);  // elements per chunk
    if (shm::config().chunk <= 65536 || std::is_same_v<T, float>)
        for (std::size_t n : {c - 1, c, c + 1, 2 * c + 5}) v.push_back(n);
    return v;
}

// The op as the fixed order applies it (integers wrap).
template <class T>
T apply(Op op, T a, T b) {
    if constexpr (std::is_same_v<T, bool>) {
        switch (op) {
            case Op::land: return a && b;
            case Op::lor: return a || b;
            default: return a != b;
        }
    } else if constexpr (is_complex<T>::value) {
        return op == Op::sum ? a + b : a * b;
    } else if constexpr (std::is_floating_point_v<T>) {
        switch (op) {
            case Op::sum: return a + b;
            case Op::prod: return a * b;
            case Op::min: return b < a ? b : a;
            default: return a < b ? b : a;
        }
    } else {
        using U = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;
        switch (op) {
            case Op::sum: return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
            case Op::prod: return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
            case Op::min: return b < a ? b : a;
            case Op::max: return a < b ? b : a;
            case Op::land: return static_cast<T>(a != 0 && b != 0);
            case Op::lor: return static_cast<T>(a != 0 || b != 0);
            case Op::lxor: return static_cast<T>((a != 0) != (b != 0));
            case Op::band: return static_cast<T>(a & b);
            case Op::bor: return static_cast<T>(a | b);
            default: return static_cast<T>(a ^ b);
        }
    }
}

// Ranks that share a node: blocks of K world ranks under MPIML_NODE_SPLIT,
// else the real nodes (blocks of consecutive ranks, as mpirun places them by slot).
int node_split() {
    const char* v = std::getenv("MPIML_NODE_SPLIT");
    const int k = v ? std::atoi(v) : 0;
    if (k > 0) return k;
    static const int real = [] {
        MPI_Comm node;
        MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank(), MPI_INFO_NULL, &node);
        int n = 0;
        MPI_Comm_size(node, &n);
        MPI_Comm_free(&node);
        return n;
    }();
    return real;
}

// First test: finds the node layout collectively, on every rank at once.
// Real nodes must be of equal size for node_split() to describe them; simulated
// ones (MPIML_NODE_SPLIT) may end with a smaller node, as the library allows.
TEST(ShmLayout, EqualNodes) {
    const char* v = std::getenv("MPIML_NODE_SPLIT");
    if (v && std::atoi(v) > 0) GTEST_SKIP() << "simulated nodes: the last one may be smaller";
    EXPECT_EQ(size() % node_split(), 0) << "nodes of unequal size";
}

// What every rank must get at index i: node by node in rank order, then
// across nodes in node order, exactly as the fixed order promises.
template <class T>
T expected(Op op, std::size_t i, std::uint64_t seed = 0) {
    const int k = node_split(), p = size();
    T acc{};
    for (int first = 0; first < p; first += k) {
        T node = value<T>(first, i, op, seed);
        for (int r = first + 1; r < std::min(p, first + k); ++r)
            node = apply(op, node, value<T>(r, i, op, seed));
        acc = first == 0 ? node : apply(op, acc, node);
    }
    return acc;
}

template <class T>
bool same_bits(const T& a, const T& b) {
    return std::memcmp(&a, &b, value_bytes<T>()) == 0;
}

// allreduce through the shared-memory path vs MPI_Allreduce, out of place and
// in place, every op the type allows.
template <class T>
void check_type() {
    ForceShm on;
    const MPI_Datatype dt = mpiml::mpi_datatype<T>();
    for (Op op : mpiml::all_ops) {
        if (!op_allowed<T>(op)) continue;
        const mpiml::ReduceOp rop(op);
        for (std::size_t n : sizes_for<T>()) {
            SCOPED_TRACE(std::string("op ") + mpiml::op_name(op) + ", n " + std::to_string(n));
            Buf<T> in(n), out(n), ref(n);
            for (std::size_t i = 0; i < n; ++i) in[i] = value<T>(rank(), i, op);
            // The reference: MPI with mpiml's replacements for integer ops
            // this MPI library gets wrong (test_core checks those).
            MPI_Allreduce(in.data(), ref.data(), static_cast<int>(n), dt,
                          mpiml::detail::mpi_op_for(dt, rop), MPI_COMM_WORLD);
            mpiml::allreduce(in, out, op);
            std::size_t bad = 0, inexact = 0;
            for (std::size_t i = 0; i < n; ++i) {
                if (!close(out[i], ref[i]) && bad++ == 0)
                    ADD_FAILURE() << "first difference from MPI_Allreduce at " << i;
                if (!same_bits(out[i], expected<T>(op, i)) && inexact++ == 0)
                    ADD_FAILURE() << "first difference from the fixed order at " << i;
            }
            EXPECT_EQ(bad, 0u);
            EXPECT_EQ(inexact, 0u);
            EXPECT_TRUE(same_on_all_ranks(fingerprint(out))) << "results differ across ranks";
            Buf<T> again = in;
            mpiml::allreduce(again, op);  // in place
            EXPECT_EQ(fingerprint(again), fingerprint(out)) << "in place differs, or not deterministic";
        }
    }
}

TEST(ShmAllreduce, Int8) { check_type<std::int8_t>(); }
TEST(ShmAllreduce, UInt8) { check_type<unsigned char>(); }
TEST(ShmAllreduce, Short) { check_type<short>(); }
TEST(ShmAllreduce, UShort) { check_type<unsigned short>(); }
TEST(ShmAllreduce, Int) { check_type<int>(); }
TEST(ShmAllreduce, UInt) { check_type<unsigned>(); }
TEST(ShmAllreduce, Long) { check_type<long>(); }
TEST(ShmAllreduce, ULong) { check_type<unsigned long>(); }
TEST(ShmAllreduce, LongLong) { check_type<long long>(); }
TEST(ShmAllreduce, ULongLong) { check_type<unsigned long long>(); }

// MPI defines no reduction on MPI_WCHAR: both paths refuse it alike.
TEST(ShmAllreduce, WCharIsLeftToMpi) {
    ForceShm on;
    std::vector<wchar_t> w(100000, L'a');
    EXPECT_THROW(mpiml::allreduce(w, Op::max), mpiml::Error);
}
TEST(ShmAllreduce, Float) { check_type<float>(); }
TEST(ShmAllreduce, Double) { check_type<double>(); }
TEST(ShmAllreduce, LongDouble) { check_type<long double>(); }
TEST(ShmAllreduce, Bool) { check_type<bool>(); }
TEST(ShmAllreduce, ComplexFloat) { check_type<std::complex<float>>(); }
TEST(ShmAllreduce, ComplexDouble) { check_type<std::complex<double>>(); }

// The sum every rank must get: node by node in rank order, then across nodes
// in node order, exactly as the fixed order promises.
template <class T>
std::vector<T> expected_sum(std::size_t n, std::uint64_t seed, bool average) {
    const int k = node_split(), p = size();
    std::vector<T> total(n);
    for (std::size_t i = 0; i < n; ++i) {
        T acc{};
        for (int first = 0; first < p; first += k) {
            T node = value<T>(first, i, Op::sum, seed);
            for (int r = first + 1; r < std::min(p, first + k); ++r)
                node = node + value<T>(r, i, Op::sum, seed);
            acc = first == 0 ? node : acc + node;
        }
        total[i] = average ? acc / static_cast<T>(p) : acc;
    }
    return total;
}

TEST(ShmAllreduce, FixedOrderIsExact) {
    ForceShm on;
    for (std::size_t n : {std::size_t{1}, std::size_t{1000}, std::size_t{777777}}) {
        std::vector<float> x(n);
        for (std::size_t i = 0; i < n; ++i) x[i] = value<float>(rank(), i, Op::sum, 7);
        mpiml::allreduce(x, Op::sum);
        EXPECT_TRUE(x == expected_sum<float>(n, 7, false)) << "n " << n;
        std::vector<double> y(n);
        for (std::size_t i = 0; i < n; ++i) y[i] = value<double>(rank(), i, Op::sum, 8);
        mpiml::allreduce(y, Op::sum);
        EXPECT_TRUE(y == expected_sum<double>(n, 8, false)) << "n " << n;
    }
}

// Rounds of every size in quick succession, a rank now and then late: no
// rank rewrites its buffers while a peer still reads this round's (a wrong
// sum if one did). Small rounds have one barrier, larger ones two.
// Ranks on one node with a core each run a round in microseconds. Across
// nodes (real or simulated) a round waits on the network, with more ranks
// than cores on the scheduler: 700 rounds there (100 of each size).
int back_to_back_rounds() {
    const bool own_cores = size() <= static_cast<int>(std::thread::hardware_concurrency());
    return node_split() >= size() && own_cores ? 3000 : 700;
}

TEST(ShmAllreduce, BackToBackRoundsOfMixedSizes) {
    ForceShm on;
    const std::size_t sizes[] = {1, 5, 4096, 4097, 16, 100000, 3};
    std::vector<std::int64_t> x;
    const int rounds = back_to_back_rounds();
    for (int it = 0; it < rounds; ++it) {
        const std::size_t n = sizes[static_cast<std::size_t>(it) % std::size(sizes)];
        x.resize(n);
        for (std::size_t i = 0; i < n; ++i) x[i] = (rank() + 1) * 1000003LL * (it + 1) + static_cast<std::int64_t>(i);
        if (mix(static_cast<std::uint64_t>(it * 31 + rank())) % 97 == 0)
            std::this_thread::sleep_for(std::chrono::microseconds(30));
        mpiml::allreduce(x, Op::sum);
        const std::int64_t p = size();
        std::size_t bad = 0;
        for (std::size_t i = 0; i < n; ++i)
            bad += x[i] != p * (p + 1) / 2 * 1000003LL * (it + 1) + p * static_cast<std::int64_t>(i);
        ASSERT_EQ(bad, 0u) << "round " << it << ", " << n << " elements";
    }
}

TEST(ShmAllreduce, Above64MiB) {
    ForceShm on;
    const std::size_t n = (std::size_t{64} << 20) / sizeof(float) + 12347;
    std::vector<float> x(n), ref(n);
    for (std::size_t i = 0; i < n; ++i) x[i] = value<float>(rank(), i, Op::sum, 3);
    MPI_Allreduce(x.data(), ref.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    mpiml::allreduce(x, Op::sum);
    std::size_t bad = 0;
    for (std::size_t i = 0; i < n; ++i) bad += !close(x[i], ref[i]);
    EXPECT_EQ(bad, 0u);
    EXPECT_TRUE(x == expected_sum<float>(n, 3, false));
    EXPECT_TRUE(same_on_all_ranks(fingerprint(x)));
}

TEST(ShmAllreduce, AutoAndOffMatchMpi) {
    for (shm::Mode m : {shm::Mode::automatic, shm::Mode::off}) {
        ForceShm mode(m);
        for (std::size_t n : {std::size_t{3}, std::size_t{1} << 20}) {
            std::vector<long long> x(n), ref(n), want(n);
            for (std::size_t i = 0; i < n; ++i) {
                x[i] = value<long long>(rank(), i, Op::sum);
                std::uint64_t sum = 0;  // every rank's input, summed with wrap-around here
                for (int r = 0; r < size(); ++r)
                    sum += static_cast<std::uint64_t>(value<long long>(r, i, Op::sum));
                want[i] = static_cast<long long>(sum);
            }
            MPI_Allreduce(x.data(), ref.data(), static_cast<int>(n), MPI_LONG_LONG, MPI_SUM,
                          MPI_COMM_WORLD);
            mpiml::allreduce(x, Op::sum);
            EXPECT_TRUE(x == want) << "mode " << static_cast<int>(m) << ", n " << n;
            EXPECT_TRUE(ref == want) << "MPI_Allreduce itself, n " << n;
        }
    }
}

TEST(ShmAllreduce, SubCommunicator) {
    ForceShm on;
    MPI_Comm half;
    MPI_Comm_split(MPI_COMM_WORLD, rank() % 2, rank(), &half);
    int want = 0;  // ranks of this half (same parity) hold rank + 1
    for (int r = rank() % 2; r < size(); r += 2) want += r + 1;
    std::vector<int> x(100003, rank() + 1), ref(x.size(), want);
    mpiml::allreduce(x, Op::sum, half);
    EXPECT_TRUE(x == ref);
    MPI_Comm_free(&half);  // frees the communicator's shared context too
}

// Communicators freed and created again (MPI may hand out the same handle):
// each gets its own context, never a freed one's.
TEST(ShmAllreduce, FreedAndRecreatedCommunicators) {
    ForceShm on;
    for (int round = 0; round < 6; ++round) {
        MPI_Comm c;
        const int color = round % 2 == 0 ? rank() % 2 : 0;  // halves, then everyone
        MPI_Comm_split(MPI_COMM_WORLD, color, rank(), &c);
        int n = 0;
        MPI_Comm_size(c, &n);
        // Members: world ranks of this color; the root (rank 0 of c) is the lowest.
        const int first = round % 2 == 0 ? rank() % 2 : 0, step = round % 2 == 0 ? 2 : 1;
        int want = 0;
        for (int r = first; r < size(); r += step) want += r + 1;
        std::vector<int> x(1000 + round, rank() + 1), ref(x.size(), want);
        mpiml::allreduce(x, Op::sum, c);
        EXPECT_TRUE(x == ref) << "round " << round << ", communicator of " << n << " ranks";
        int crank = 0;
        MPI_Comm_rank(c, &crank);
        std::vector<int> b(77, crank == 0 ? 1000 * rank() + round : -1);
        const std::vector<int> bref(77, 1000 * first + round);
        mpiml::broadcast(b, 0, c);
        EXPECT_TRUE(b == bref) << "round " << round;
        MPI_Comm_free(&c);
    }
}

TEST(ShmBroadcast, EveryRootAndSize) {
    ForceShm on;
    const std::size_t c = shm::config().chunk;
    for (int root = 0; root < size(); ++root) {
        for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{13}, c - 1, c, c + 1,
                              3 * c + 7}) {
            std::vector<unsigned char> b(n, 0);
            if (rank() == root)
                for (std::size_t i = 0; i < n; ++i) b[i] = static_cast<unsigned char>(mix(i));
            mpiml::broadcast(b, root);
            std::size_t bad = 0;
            for (std::size_t i = 0; i < n; ++i) bad += b[i] != static_cast<unsigned char>(mix(i));
            EXPECT_EQ(bad, 0u) << "root " << root << ", n " << n;
        }
        std::vector<double> d(12345, rank() == root ? 2.5 : -1.0);
        mpiml::broadcast(d, root);
        EXPECT_TRUE(d == std::vector<double>(12345, 2.5));
    }
}

// ------------------------------------------------------------ SharedBucket

TEST(SharedBucket, AllreduceInPlace) {
    ForceShm on;
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{31}, std::size_t{300007}}) {
        mpiml::SharedBucket b(n * sizeof(double) + 8);  // a little slack
        ASSERT_EQ(b.size_bytes(), n * sizeof(double) + 8);
        auto x = b.as_span<double>();
        for (std::size_t i = 0; i < n; ++i) x[i] = value<double>(rank(), i, Op::sum, 11);
        b.allreduce<double>(n, Op::sum);
        const auto want = expected_sum<double>(n, 11, false);
        EXPECT_TRUE(std::equal(want.begin(), want.end(), x.begin()));

        std::vector<int> ref(n);
        auto y = std::span<int>(static_cast<int*>(b.data()), n);
        for (std::size_t i = 0; i < n; ++i) y[i] = value<int>(rank(), i, Op::max);
        MPI_Allreduce(y.data(), ref.data(), static_cast<int>(n), MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        b.allreduce<int>(n, Op::max);
        EXPECT_TRUE(std::equal(ref.begin(), ref.end(), y.begin()));
    }
}

TEST(SharedBucket, Average) {
    ForceShm on;
    const std::size_t n = 123457;
    mpiml::SharedBucket b(n * sizeof(float));
    auto x = b.as_span<float>();
    for (std::size_t i = 0; i < n; ++i) x[i] = value<float>(rank(), i, Op::sum, 5);
    b.average<float>(n);
    const auto want = expected_sum<float>(n, 5, true);
    EXPECT_TRUE(std::equal(want.begin(), want.end(), x.begin()));
    EXPECT_TRUE(same_on_all_ranks(fingerprint(std::vector<float>(x.begin(), x.end()))));
}

// The average is the sum divided by the number of ranks, bit for bit, at the
// edges of the range too: subnormals, the smallest normal, the largest finite
// value, infinities, signed zeros and random bit patterns (rank 0 holds the
// values, the others negative zeros, so the sum is exact).
template <class R>
void check_average_edges() {
    using L = std::numeric_limits<R>;
    std::vector<R> v = {L::denorm_min(), L::denorm_min() * 3, L::min(), L::min() * 3 / 2,
                        std::nextafter(L::min(), R(0)), L::max(), -L::max(), L::infinity(),
                        -L::infinity(), R(-0.0), R(1) / 3, R(-7), L::epsilon()};
    std::mt19937_64 g(11);
    while (v.size() < 4099) {  // more than one block of the reduction
        R x;
        std::uint64_t bits = g();
        std::memcpy(&x, &bits, sizeof x);
        if (std::isfinite(x)) v.push_back(x);
    }
    for (auto mode : {shm::Mode::on, shm::Mode::off}) {
        ForceShm force(mode);
        for (bool cplx : {false, true}) {
            const std::size_t n = v.size();
            mpiml::SharedBucket b(n * sizeof(R) * 2);
            std::vector<std::complex<R>> want(n);
            for (std::size_t i = 0; i < n; ++i)
                want[i] = {v[i] / static_cast<R>(size()), v[n - 1 - i] / static_cast<R>(size())};
            std::vector<R> got(n * (cplx ? 2 : 1));
            if (cplx) {
                auto x = b.as_span<std::complex<R>>();
                for (std::size_t i = 0; i < n; ++i)
                    x[i] = rank() == 0 ? std::complex<R>(v[i], v[n - 1 - i]) : std::complex<R>(R(-0.0), R(-0.0));
                b.average<std::complex<R>>(n);
                std::memcpy(got.data(), x.data(), got.size() * sizeof(R));
            } else {
                auto x = b.as_span<R>();
                for (std::size_t i = 0; i < n; ++i) x[i] = rank() == 0 ? v[i] : R(-0.0);
                b.average<R>(n);
                std::memcpy(got.data(), x.data(), got.size() * sizeof(R));
            }
            std::size_t bad = 0;
            for (std::size_t i = 0; i < n; ++i) {
                const R w[2] = {want[i].real(), want[i].imag()};
                for (std::size_t c = 0; c < (cplx ? 2u : 1u); ++c)
                    if (std::memcmp(&got[i * (cplx ? 2 : 1) + c], &w[c], sizeof(R)) != 0) ++bad;
            }
            EXPECT_EQ(bad, 0u) << (cplx ? "complex" : "real") << ", mode "
                               << (mode == shm::Mode::on ? "on" : "off");
        }
    }
}

TEST(SharedBucket, AverageIsTheSumDividedBitForBit) {
    check_average_edges<float>();
    check_average_edges<double>();
}

TEST(SharedBucket, OffModeUsesMpi) {
    ForceShm off(shm::Mode::off);
    mpiml::SharedBucket b(1000 * sizeof(double));
    auto x = b.as_span<double>();
    for (auto& v : x) v = rank() + 1;
    b.average<double>(x.size());
    for (double v : x) EXPECT_DOUBLE_EQ(v, (size() + 1) / 2.0);
}

TEST(SharedBucket, Misuse) {
    mpiml::SharedBucket b(64);
    EXPECT_THROW(b.allreduce<double>(9, Op::sum), mpiml::Error);   // 72 bytes > 64
    EXPECT_THROW(b.average<int>(4), mpiml::Error);                 // integers do not average
    if (size() > 1)  // ranks asking for different sizes
        EXPECT_THROW(mpiml::SharedBucket(rank() == 0 ? 64 : 128), mpiml::Error);
    mpiml::SharedBucket moved = std::move(b);
    EXPECT_EQ(b.data(), nullptr);
    EXPECT_NE(moved.data(), nullptr);
}

// A user-defined MPI_Op: elementwise sum of doubles.
void user_sum(void* in, void* inout, int* len, MPI_Datatype*) {
    const auto* a = static_cast<const double*>(in);
    auto* b = static_cast<double*>(inout);
    for (int i = 0; i < *len; ++i) b[i] += a[i];
}

// Integer-valued inputs: every order of summation gives the same doubles.
void fill_exact(std::span<double> x) {
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = rank() * 1000.0 + static_cast<double>(i % 977);
}
double exact_sum(std::size_t i) {
    double s = 0;
    for (int r = 0; r < size(); ++r) s += r * 1000.0 + static_cast<double>(i % 977);
    return s;
}

// How many collectives named call this rank's profile recorded around f.
template <class F>
int profiled_calls(const std::string& call, F&& f) {
    std::string dir;
    if (rank() == 0) {
        char tmpl[] = "/tmp/mpiml_shm_profile_XXXXXX";
        dir = mkdtemp(tmpl);
    }
    mpiml::broadcast(dir);
    mpiml::profile_start(dir);
    f();
    mpiml::profile_stop();
    std::ifstream in(dir + "/profile_" + std::to_string(rank()) + ".json");
    std::stringstream text;
    text << in.rdbuf();
    const std::string t = text.str(), key = "\"call\":\"" + call + "\"";
    int n = 0;
    for (auto at = t.find(key); at != std::string::npos; at = t.find(key, at + 1)) ++n;
    mpiml::barrier();
    if (rank() == 0) std::filesystem::remove_all(dir);
    return n;
}

// MPIML_SHM=off and user-defined ops go through mpiml's core (one collective
// recorded, no nested one); the right results; the 3-argument overload.
TEST(SharedBucket, OffModeAndUserOpGoThroughTheCore) {
    MPI_Op user = MPI_OP_NULL;
    ASSERT_EQ(MPI_Op_create(&user_sum, 1, &user), MPI_SUCCESS);
    const std::size_t n = 100003;
    mpiml::SharedBucket b(n * sizeof(double));
    auto x = b.as_span<double>();
    const auto check = [&](double div) {
        for (std::size_t i = 0; i < n; ++i)
            if (x[i] != exact_sum(i) / div) {
                ADD_FAILURE() << "element " << i << ": " << x[i] << " != " << exact_sum(i) / div;
                return;
            }
    };
    for (shm::Mode m : {shm::Mode::off, shm::Mode::on, shm::Mode::automatic}) {
        SCOPED_TRACE(static_cast<int>(m));
        ForceShm mode(m);
        fill_exact(x);
        EXPECT_EQ(profiled_calls("mpiml::SharedBucket::allreduce",
                                 [&] { b.allreduce(n, MPI_DOUBLE, mpiml::ReduceOp(user)); }),
                  1);
        check(1);
        fill_exact(x);
        EXPECT_EQ(profiled_calls("mpiml::SharedBucket::allreduce",
                                 [&] { b.allreduce(n, MPI_DOUBLE, Op::sum); }),
                  1);
        check(1);
        fill_exact(x);
        EXPECT_EQ(profiled_calls("mpiml::SharedBucket::average", [&] { b.average<double>(n); }), 1);
        check(size());
        fill_exact(x);
        b.allreduce(n, MPI_DOUBLE, mpiml::TypeClass::floating, Op::sum);  // the old overload
        check(1);
        auto y = std::span<int>(static_cast<int*>(b.data()), 1000);
        for (std::size_t i = 0; i < y.size(); ++i) y[i] = value<int>(rank(), i, Op::max);
        std::vector<int> ref(y.size());  // every rank's input, max taken here
        for (std::size_t i = 0; i < y.size(); ++i) {
            ref[i] = value<int>(0, i, Op::max);
            for (int r = 1; r < size(); ++r) ref[i] = std::max(ref[i], value<int>(r, i, Op::max));
        }
        b.allreduce(y.size(), MPI_INT, Op::max);
        EXPECT_TRUE(std::equal(ref.begin(), ref.end(), y.begin()));
    }
    MPI_Op_free(&user);
}

// Bad op/type combinations: mpiml::Error naming the call, on every rank.
TEST(SharedBucket, BadOpForTypeNamesTheCall) {
    mpiml::SharedBucket b(64);
    for (shm::Mode m : {shm::Mode::off, shm::Mode::on}) {
        ForceShm mode(m);
        const auto expect_error = [](const char* call, const char* what, auto&& f) {
            try {
                f();
                ADD_FAILURE() << "no error from " << call;
            } catch (const mpiml::Error& e) {
                const std::string msg = e.what();
                EXPECT_NE(msg.find(call), std::string::npos) << msg;
                EXPECT_NE(msg.find(what), std::string::npos) << msg;
            }
        };
        expect_error("mpiml::SharedBucket::allreduce", "not defined for element type double",
                     [&] { b.allreduce(4, MPI_DOUBLE, Op::band); });
        expect_error("mpiml::SharedBucket::allreduce", "not defined for element type bool",
                     [&] { b.allreduce<bool>(4, Op::sum); });
        expect_error("mpiml::SharedBucket::allreduce", "not defined for element type complex<float>",
                     [&] { b.allreduce<std::complex<float>>(2, Op::max); });
        expect_error("mpiml::SharedBucket::allreduce", "MPI_OP_NULL",
                     [&] { b.allreduce(4, MPI_DOUBLE, mpiml::ReduceOp(MPI_OP_NULL)); });
        expect_error("mpiml::SharedBucket::average", "averaging needs a floating or complex type",
                     [&] { b.average<int>(4); });
        // Still usable, and in step on every rank.
        auto x = b.as_span<double>();
        std::fill(x.begin(), x.end(), 1.0);
        b.allreduce(x.size(), MPI_DOUBLE, Op::sum);
        for (double v : x) EXPECT_EQ(v, size());
    }
}

// -------------------------------------------------- mismatched arguments
// The shared-memory path compares every rank's count, type, op and root at
// its first barrier: a mismatch is an mpiml::Error on every rank naming each
// rank's arguments, with or without MPIML_CHECK, on every algorithm path
// (the MPIML_NODE_SPLIT variants), and the communicator stays usable. With the
// path off, the same calls are left to MPI (MPI_ERR_TRUNCATE on one rank at
// most), so there the core's check (MPIML_CHECK) is what must catch them.

struct MismatchCase {
    std::string name;
    std::function<void()> call;
    std::vector<std::string> pieces;  // every one in every rank's message
    bool core_sees_it = true;         // the core's check (Kind, count, type, op, root) tells it
};

// "rank r" and "count=N" for every rank.
std::vector<std::string> counts_named(const std::function<std::size_t(int)>& count) {
    std::vector<std::string> v;
    for (int r = 0; r < size(); ++r) {
        v.push_back("rank " + std::to_string(r) + " ");
        v.push_back("count=" + std::to_string(count(r)));
    }
    return v;
}

// Every rank runs f and gets mpiml::Error holding every piece; then
// allreduces (one chunk and several) and a broadcast still work.
void expect_mismatch(const MismatchCase& c, const std::string& mode) {
    std::string msg;
    try {
        c.call();
    } catch (const mpiml::Error& e) {
        msg = e.what();
    }
    EXPECT_FALSE(msg.empty()) << c.name << " (" << mode << "): no mpiml::Error on rank " << rank();
    if (!msg.empty())
        for (const auto& p : c.pieces)
            EXPECT_NE(msg.find(p), std::string::npos)
                << c.name << " (" << mode << "): '" << p << "' missing from: " << msg;
    for (std::size_t n : {std::size_t{1000}, shm::config().chunk / sizeof(float) * 2 + 77}) {
        std::vector<float> v(n, 1.0f);
        mpiml::allreduce(v, Op::sum);
        EXPECT_EQ(v.front(), static_cast<float>(size())) << c.name << " (" << mode << ")";
        EXPECT_EQ(v.back(), static_cast<float>(size())) << c.name << " (" << mode << ")";
    }
    std::vector<double> d(5000, rank() == 0 ? 2.5 : 0.0);
    mpiml::broadcast(d, 0);
    EXPECT_EQ(d.back(), 2.5) << c.name << " (" << mode << ")";
}

std::vector<MismatchCase> mismatch_cases() {
    const std::size_t big = shm::config().chunk / sizeof(float) * 2 + 1001;  // several chunks
    std::vector<MismatchCase> v;
    // 4097 floats: rank 0 above the one-barrier round's 16 KiB, the others at or below it.
    for (std::size_t base : {std::size_t{1000}, std::size_t{4097}, big}) {
        const auto n = [base](int r) { return base - static_cast<std::size_t>(r); };
        const std::string tag = base == 1000 ? " small" : base == 4097 ? " around 16 KiB" : " large";
        v.push_back({"allreduce count" + tag,
                     [n] {
                         std::vector<float> x(n(rank()), 1.0f), y(x.size());
                         mpiml::allreduce(std::span<const float>(x), std::span<float>(y), Op::sum);
                     },
                     counts_named(n)});
        v.push_back({"allreduce in place count" + tag,
                     [n] {
                         std::vector<float> x(n(rank()), 1.0f);
                         mpiml::allreduce(x, Op::sum);
                     },
                     counts_named(n)});
        v.push_back({"broadcast count" + tag,
                     [n] {
                         std::vector<float> x(n(rank()), 1.0f);
                         mpiml::broadcast(x, 0);
                     },
                     counts_named(n)});
        v.push_back({"bucket count" + tag,
                     [base, n] {
                         mpiml::SharedBucket b(base * sizeof(float));
                         b.allreduce<float>(n(rank()), Op::sum);
                     },
                     counts_named(n)});
    }
    const auto zero = [](int r) { return r == 0 ? std::size_t{0} : std::size_t{1000}; };
    v.push_back({"allreduce count 0",
                 [zero] {
                     std::vector<float> x(zero(rank()), 1.0f);
                     mpiml::allreduce(x, Op::sum);
                 },
                 {"rank 0 ", "count=0", "count=1000"}});
    v.push_back({"broadcast count 0",
                 [zero] {
                     std::vector<float> x(zero(rank()), 1.0f);
                     mpiml::broadcast(x, 1);
                 },
                 {"rank 0 ", "count=0", "count=1000"}});
    v.push_back({"bucket count 0",
                 [zero] {
                     mpiml::SharedBucket b(4000);
                     b.allreduce<float>(zero(rank()), Op::sum);
                 },
                 {"rank 0 ", "count=0", "count=1000"}});
    v.push_back({"allreduce type",
                 [] {
                     if (rank() == 0) {
                         std::vector<float> x(1000, 1.0f);
                         mpiml::allreduce(x, Op::sum);
                     } else {
                         std::vector<double> x(1000, 1.0);
                         mpiml::allreduce(x, Op::sum);
                     }
                 },
                 {"rank 0 ", "type=float", "type=double"}});
    v.push_back({"allreduce op",
                 [] {
                     std::vector<float> x(1000, 1.0f);
                     mpiml::allreduce(x, rank() == 0 ? Op::sum : Op::max);
                 },
                 {"rank 0 ", "op=sum", "op=max"}});
    v.push_back({"broadcast root",
                 [] {
                     std::vector<double> x(5000, 1.0);
                     mpiml::broadcast(x, rank() == 1 ? 1 : 0);
                 },
                 {"rank 1 ", "root=0", "root=1"}});
    v.push_back({"bucket type",
                 [] {
                     mpiml::SharedBucket b(8000);
                     if (rank() == 0) b.allreduce<float>(1000, Op::sum);
                     else b.allreduce<double>(1000, Op::sum);
                 },
                 {"rank 0 ", "type=float", "type=double"}});
    v.push_back({"bucket op",
                 [] {
                     mpiml::SharedBucket b(8000);
                     b.allreduce<double>(1000, rank() == 0 ? Op::sum : Op::min);
                 },
                 {"rank 0 ", "op=sum", "op=min"}});
    v.push_back({"bucket average",
                 [] {
                     mpiml::SharedBucket b(8000);
                     if (rank() == 0) b.average<double>(1000);
                     else b.allreduce<double>(1000, Op::sum);
                 },
                 {"rank 0 ", "SharedBucket::average", "SharedBucket::allreduce"},
                 false});
    v.push_back({"allreduce and broadcast",
                 [] {
                     std::vector<float> x(2000, 1.0f);
                     if (rank() == 0) mpiml::allreduce(x, Op::sum);
                     else mpiml::broadcast(x, 0);
                 },
                 {"rank 0 ", "allreduce", "broadcast"}});
    return v;
}

TEST(ShmMismatch, EveryRankThrowsNamingTheRanks) {
    if (size() < 2) GTEST_SKIP() << "needs 2 ranks";
    const bool check = mpiml::check_enabled();
    for (const auto& c : mismatch_cases()) {
        ForceShm on;
        mpiml::set_check(false);
        expect_mismatch(c, "shm on");
        mpiml::set_check(true);
        expect_mismatch(c, "shm on, MPIML_CHECK");
        if (c.core_sees_it) {
            ForceShm off(shm::Mode::off);
            expect_mismatch(c, "shm off, MPIML_CHECK");
        }
        mpiml::set_check(check);
    }
}

// The case of the report: 1000 and 999 floats in the default mode.
TEST(ShmMismatch, DefaultModeCatchesThe999) {
    if (size() < 2) GTEST_SKIP() << "needs 2 ranks";
    if (!shm::takes_shared_path(999 * sizeof(float))) GTEST_SKIP() << "left to MPI here";
    const bool check = mpiml::check_enabled();  // on by default in Debug builds
    mpiml::set_check(false);
    expect_mismatch({"1000 and 999",
                     [] {
                         std::vector<float> x(rank() == 0 ? 1000 : 999, 1.0f);
                         mpiml::allreduce(x, Op::sum);
                     },
                     {"mpiml::allreduce", "rank 0 passed count=1000", "count=999"}},
                    "auto");
    mpiml::set_check(check);
}

// Small broadcasts on one node whose ranks each have a core take the shared
// path in the default mode, so their mismatches are errors without the check.
TEST(ShmMismatch, DefaultModeCatchesSmallBroadcasts) {
    if (size() < 2) GTEST_SKIP() << "needs 2 ranks";
    if (node_split() != size()) GTEST_SKIP() << "several nodes: small broadcasts go to MPI";
    if (static_cast<unsigned>(size()) > std::thread::hardware_concurrency())
        GTEST_SKIP() << "more ranks than cores: small broadcasts go to MPI";
    const bool check = mpiml::check_enabled();
    mpiml::set_check(false);
    expect_mismatch({"3 and 4 ints",
                     [] {
                         std::vector<int> x(rank() == 0 ? 4 : 3, 7);
                         mpiml::broadcast(x, 0);
                     },
                     {"mpiml::broadcast", "rank 0 passed count=4", "count=3"}},
                    "auto");
    expect_mismatch({"roots",
                     [] {
                         double x = 1.0;
                         mpiml::broadcast(x, rank() == 0 ? 0 : 1);
                     },
                     {"mpiml::broadcast", "root=0", "root=1"}},
                    "auto");
    mpiml::set_check(check);
}

// A small data-parallel training loop (linear regression, SGD), gradients
// averaged either in ordinary vectors through MPI, or in place in a shared
// bucket. The trained weights must agree (bit for bit at 2 ranks, where the
// sum of two terms does not depend on order).
std::vector<double> train(bool bucket_view) {
    const std::size_t dim = 4099, steps = 20, batch = 8;
    std::vector<double> w(dim, 0.0), grad_plain(dim);
    mpiml::SharedBucket bucket(bucket_view ? dim * sizeof(double) : 0);
    std::span<double> grad =
        bucket_view ? bucket.as_span<double>() : std::span<double>(grad_plain);
    for (std::size_t step = 0; step < steps; ++step) {
        std::fill(grad.begin(), grad.end(), 0.0);
        for (std::size_t s = 0; s < batch; ++s) {
            const std::uint64_t id = (step * 1000 + s) * 64 + static_cast<std::uint64_t>(rank());
            double pred = 0, target = unit(mix(id)) - 0.5;
            for (std::size_t i = 0; i < dim; i += 97) pred += w[i] * value<double>(0, i + id, Op::sum);
            for (std::size_t i = 0; i < dim; i += 97)
                grad[i] += 2 * (pred - target) * value<double>(0, i + id, Op::sum) / batch;
        }
        if (bucket_view) {
            bucket.average<double>(dim);
        } else {
            ForceShm off(shm::Mode::off);
            mpiml::allreduce(grad_plain, Op::sum);
            for (auto& g : grad_plain) g /= size();
        }
        for (std::size_t i = 0; i < dim; ++i) w[i] -= 0.1 * grad[i];
    }
    return w;
}

TEST(SharedBucket, TrainingMatchesPlainMode) {
    ForceShm on;
    const auto plain = train(false);
    const auto view = train(true);
    if (size() <= 2 && node_split() >= size()) {
        EXPECT_TRUE(plain == view);
    } else {
        for (std::size_t i = 0; i < plain.size(); ++i) ASSERT_NEAR(plain[i], view[i], 1e-12);
    }
    EXPECT_TRUE(same_on_all_ranks(fingerprint(view)));
}

}  // namespace
