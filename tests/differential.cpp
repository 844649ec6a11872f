// Randomized differential test: seeded random sequences of mpiml operations
// (allreduce, broadcast, mpi_op/sum/avg, statistics, SharedBucket) with random
// element types, ops, sizes (0, 1, odd, around every threshold and chunk
// size, up to a few MiB), roots, communicators (world, split in reverse rank
// order, dup) and shared-memory modes (off, on, auto); node splits come from
// MPIML_NODE_SPLIT (one ctest case per split). Every result is compared bit
// for bit with a reference each rank computes from all ranks' inputs,
// gathered with plain MPI, in mpiml's documented reduction order (src/backends/shm/):
// per node (MPIML_NODE_SPLIT: comm rank / k) a left fold in comm rank order,
// then a left fold over the nodes in order; averages divide the sum by the
// rank count. Where MPI itself reduces (shared memory off or not taken), its
// order is unspecified: floating inputs are then exactly representable
// (small integers; powers of two for products) so any order is exact, and
// results are compared by value (a complex product that cancels to zero may
// have either sign of zero).
// Statistics combine per-rank moments pairwise in rank order (src/tools/stats.cpp).
//
//   mpirun -np 3 test_differential [--seed S] [--ops N] [--first K] [--verbose]
//
// Operation k draws everything from (S, k) alone: a failure prints
// "seed S op K: ..." and `--seed S --first K --ops 1` replays just that one.
#include <mpiml/mpiml.hpp>

#include <algorithm>
#include <complex>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using mpiml::Op;

std::uint64_t seed_opt = 1;
long ops_opt = 100;
long first_opt = 0;
bool verbose = false;
long failures = 0;
std::string current;  // description of the operation under test

void fail(const std::string& what) {
    if (failures < 20)
        std::printf("FAIL rank %d: seed %llu op %s: %s\n", mpiml::proc_id(),
                    static_cast<unsigned long long>(seed_opt), current.c_str(), what.c_str());
    ++failures;
}

template <class T> struct is_cplx : std::false_type {};
template <class T> struct is_cplx<std::complex<T>> : std::true_type {};
template <class T>
constexpr bool is_int = std::is_integral_v<T> && !std::is_same_v<T, bool>;

template <class T>
bool legal(Op o) {
    if constexpr (std::is_same_v<T, bool>) return o == Op::land || o == Op::lor || o == Op::lxor;
    else if constexpr (is_cplx<T>::value) return o == Op::sum || o == Op::prod;
    else if constexpr (std::is_floating_point_v<T>)
        return o == Op::sum || o == Op::prod || o == Op::min || o == Op::max;
    else return true;
}

template <class T>
T apply(Op o, T a, T b) {
    if constexpr (std::is_same_v<T, bool>) {
        if (o == Op::land) return a && b;
        if (o == Op::lor) return a || b;
        return a != b;
    } else if constexpr (is_cplx<T>::value) {
        return o == Op::sum ? a + b : a * b;
    } else if constexpr (std::is_floating_point_v<T>) {
        switch (o) {
            case Op::sum: return a + b;
            case Op::prod: return a * b;
            case Op::min: return b < a ? b : a;
            default: return a < b ? b : a;
        }
    } else {
        using U = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;
        switch (o) {
            case Op::sum: return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
            case Op::prod: return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
            case Op::min: return b < a ? b : a;
            case Op::max: return a < b ? b : a;
            case Op::land: return static_cast<T>((a != 0) && (b != 0));
            case Op::lor: return static_cast<T>((a != 0) || (b != 0));
            case Op::lxor: return static_cast<T>((a != 0) != (b != 0));
            case Op::band: return static_cast<T>(a & b);
            case Op::bor: return static_cast<T>(a | b);
            default: return static_cast<T>(a ^ b);
        }
    }
}

/// Values: general ones when the order is mpiml's, exactly representable ones
/// when MPI reduces floating data; integers are exact in any order.
template <class T>
T draw(std::mt19937_64& g, Op o, bool exact) {
    if constexpr (std::is_same_v<T, bool>) {
        return (g() & 1) != 0;
    } else if constexpr (is_cplx<T>::value) {
        using R = typename T::value_type;
        return {draw<R>(g, o, exact), draw<R>(g, o, exact)};
    } else if constexpr (std::is_floating_point_v<T>) {
        if (o == Op::prod) {
            static const T pow2[] = {0.5, 1, 2, 4, -0.5, -1, -2, 0.25};
            if (exact) return pow2[g() % 8];
            return static_cast<T>(std::uniform_real_distribution<double>(-2.0, 2.0)(g));
        }
        if (exact) return static_cast<T>(static_cast<int>(g() % 2001) - 1000);
        return static_cast<T>(std::uniform_real_distribution<double>(-1e3, 1e3)(g));
    } else {
        T v;
        const std::uint64_t r = g();
        std::memcpy(&v, &r, sizeof v);
        if ((g() & 3) == 0) v = static_cast<T>(v % 3);  // zeros, ones: logical ops
        return v;
    }
}

/// Bit for bit; by value where MPI reduces (exact inputs, but the sign of a
/// zero that complex products cancel to depends on MPI's order).
template <class T>
bool same_value(const T* a, const T* b, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i)
        if (!(a[i] == b[i])) return false;
    return true;
}

template <class T>
bool same_bits(const T* a, const T* b, std::size_t n) {
    if constexpr (std::is_same_v<T, bool>) {
        for (std::size_t i = 0; i < n; ++i)
            if (a[i] != b[i]) return false;
        return true;
    } else {
        return n == 0 || std::memcmp(a, b, n * sizeof(T)) == 0;
    }
}

/// Communicator info for the reference: size, my rank, node split.
struct CommInfo {
    MPI_Comm comm;
    int size, rank;
    int split;  // ranks per node in comm rank space; 0: one node (this box)
};

/// mpiml's order: left fold per node in rank order, then over nodes in order.
template <class T>
std::vector<T> reference(const std::vector<std::vector<T>>& all, std::size_t n, Op o,
                         const CommInfo& ci) {
    const int k = ci.split > 0 ? ci.split : ci.size;
    std::vector<T> out(n);
    std::vector<T> node(n);
    bool first_node = true;
    for (int lo = 0; lo < ci.size; lo += k) {
        const int hi = std::min(ci.size, lo + k);
        for (std::size_t i = 0; i < n; ++i) {
            T acc = all[lo][i];
            for (int r = lo + 1; r < hi; ++r) acc = apply(o, acc, all[r][i]);
            node[i] = acc;
        }
        for (std::size_t i = 0; i < n; ++i) out[i] = first_node ? node[i] : apply(o, out[i], node[i]);
        first_node = false;
    }
    return out;
}

template <class T>
std::vector<std::vector<T>> gather_all(const std::vector<T>& mine, const CommInfo& ci) {
    std::vector<T> flat(mine.size() * static_cast<std::size_t>(ci.size));
    if (!mine.empty())
        MPI_Allgather(mine.data(), static_cast<int>(mine.size() * sizeof(T)), MPI_BYTE, flat.data(),
                      static_cast<int>(mine.size() * sizeof(T)), MPI_BYTE, ci.comm);
    std::vector<std::vector<T>> all(static_cast<std::size_t>(ci.size));
    for (int r = 0; r < ci.size; ++r)
        all[r].assign(flat.begin() + static_cast<std::ptrdiff_t>(r * mine.size()),
                      flat.begin() + static_cast<std::ptrdiff_t>((r + 1) * mine.size()));
    return all;
}

template <class T>
bool has_kernel(Op o) {  // shared-memory kernels: see allowed<T, O> in src/backends/shm/kernels.cpp
    return legal<T>(o);
}

/// Sizes around every threshold and chunk boundary, in elements.
std::size_t draw_count(std::mt19937_64& g, std::size_t tsize, const CommInfo& ci) {
    const auto cfg = mpiml::shm::config();
    const std::size_t per_line = std::max<std::size_t>(1, 64 / tsize);
    const std::size_t marks[] = {cfg.chunk / tsize,
                                 2 * cfg.chunk / tsize,
                                 std::max<std::size_t>(cfg.allreduce_threshold / tsize, 1),
                                 std::max<std::size_t>(cfg.broadcast_threshold / tsize, 1),
                                 (std::size_t{64} << 10) / tsize,
                                 per_line * static_cast<std::size_t>(ci.size),
                                 cfg.chunk / 4 / tsize};
    switch (g() % 8) {
        case 0: return g() % 2;  // 0 or 1
        case 1: return 2 * (g() % 50) + 1;  // small odd
        case 2:
        case 3: {
            const std::size_t m = marks[g() % std::size(marks)];
            const std::size_t d = g() % 3;
            return (g() & 1) ? m + d : (m > d ? m - d : m);
        }
        case 4: return g() % 5000;
        case 5: return g() % 70000;
        case 6: return (g() % 16 == 0) ? (std::size_t{1} << 20) / tsize * (1 + g() % 3) + g() % 7
                                       : g() % 300;  // a few MiB, rarely
        default: return g() % 1000;
    }
}

template <class T>
void op_allreduce(std::mt19937_64& sg, std::mt19937_64& dg, const CommInfo& ci) {
    std::vector<Op> ops;
    for (Op o : mpiml::all_ops)
        if (legal<T>(o)) ops.push_back(o);
    const Op o = ops[sg() % ops.size()];
    const std::size_t n = draw_count(sg, sizeof(T), ci);
    const int form = static_cast<int>(sg() % 5);  // separate, in place, mpi_op, mpi_sum, MPI_Op
    const Op used = form == 3 ? Op::sum : o;
    if (!legal<T>(used)) return;
    const bool shm_path = mpiml::shm::takes_shared_path(n * sizeof(T), ci.comm) && has_kernel<T>(used);
    const bool exact = !shm_path;
    current += " allreduce<" + std::string(mpiml::mpi_type_traits<T>::name) + "> op=" +
               mpiml::op_name(used) + " n=" + std::to_string(n) + " form=" + std::to_string(form) +
               (shm_path ? " (shared path)" : " (MPI path)");
    std::vector<T> x(n);
    for (auto& v : x) v = draw<T>(dg, used, exact);
    const auto all = gather_all(x, ci);
    const auto want = reference(all, n, used, ci);
    std::vector<T> got;
    if (form == 0) {
        got.resize(n);
        mpiml::allreduce(x, got, used, ci.comm);
    } else if (form == 1) {
        got = x;
        mpiml::allreduce(got, used, ci.comm);
    } else if (form == 2) {
        got = mpiml::mpi_op(x, used, ci.comm);
    } else if (form == 3) {
        got = mpiml::mpi_sum(x, ci.comm);
    } else {
        got = x;
        mpiml::allreduce(got, mpiml::ReduceOp(used).native(), ci.comm);
    }
    auto same = [&](const T* a, const T* b, std::size_t m) {
        return shm_path ? same_bits(a, b, m) : same_value(a, b, m);
    };
    if (!same(got.data(), want.data(), n)) {
        std::size_t i = 0;
        while (i < n && same(&got[i], &want[i], 1)) ++i;
        fail("result differs from the reference at element " + std::to_string(i));
    }
}

template <class T>
void op_avg(std::mt19937_64& sg, std::mt19937_64& dg, const CommInfo& ci) {
    using A = mpiml::avg_t<T>;
    const std::size_t n = draw_count(sg, sizeof(A), ci);
    const bool shm_path = mpiml::shm::takes_shared_path(n * sizeof(A), ci.comm);
    current += " mpi_avg<" + std::string(mpiml::mpi_type_traits<T>::name) + "> n=" + std::to_string(n);
    std::vector<T> x(n);
    for (auto& v : x) {
        if constexpr (is_int<T>) v = static_cast<T>(dg() % 1000);  // exact in double in any order
        else v = draw<T>(dg, Op::sum, !shm_path || std::is_integral_v<T>);
    }
    const auto all = gather_all(x, ci);
    std::vector<std::vector<A>> conv(all.size());
    for (std::size_t r = 0; r < all.size(); ++r) conv[r].assign(all[r].begin(), all[r].end());
    auto want = reference(conv, n, Op::sum, ci);
    for (auto& v : want) v /= static_cast<A>(ci.size);
    const auto got = mpiml::mpi_avg(x, ci.comm);
    if (!same_bits(got.data(), want.data(), n)) fail("average differs from the reference");
}

template <class T>
void op_broadcast(std::mt19937_64& sg, std::mt19937_64& dg, const CommInfo& ci) {
    const std::size_t n = draw_count(sg, sizeof(T), ci);
    const int root = static_cast<int>(sg() % static_cast<std::uint64_t>(ci.size));
    current += " broadcast<" + std::string(mpiml::mpi_type_traits<T>::name) + "> n=" +
               std::to_string(n) + " root=" + std::to_string(root);
    std::vector<T> x(n);
    for (auto& v : x) v = draw<T>(dg, Op::sum, false);
    std::vector<T> want = x;
    if (n) MPI_Bcast(want.data(), static_cast<int>(n * sizeof(T)), MPI_BYTE, root, ci.comm);
    mpiml::broadcast(x, root, ci.comm);
    if (!same_bits(x.data(), want.data(), n)) fail("broadcast differs from the root's data");
}

void op_string(std::mt19937_64& sg, std::mt19937_64& dg, const CommInfo& ci) {
    const int root = static_cast<int>(sg() % static_cast<std::uint64_t>(ci.size));
    std::string s(dg() % 3000, '\0');
    for (auto& c : s) c = static_cast<char>(dg());
    current += " broadcast<string> root=" + std::to_string(root);
    int len = static_cast<int>(s.size());
    MPI_Bcast(&len, 1, MPI_INT, root, ci.comm);
    std::string want(static_cast<std::size_t>(len), '\0');
    if (ci.rank == root) want = s;
    if (len) MPI_Bcast(want.data(), len, MPI_CHAR, root, ci.comm);
    mpiml::broadcast(s, root, ci.comm);
    if (s != want) fail("string broadcast differs");
}

void op_statistics(std::mt19937_64& sg, std::mt19937_64& dg, const CommInfo& ci) {
    const std::size_t base = 1 + sg() % 2000;
    const std::size_t n = ci.rank % 2 ? sg() % 3 * base : base;  // some ranks may be empty
    current += " statistics n=" + std::to_string(n);
    std::vector<double> x(n);
    for (auto& v : x) v = std::uniform_real_distribution<double>(-5, 5)(dg);
    const auto local = mpiml::detail::local_moments(x.data(), x.size());
    std::vector<mpiml::detail::Moments> all(static_cast<std::size_t>(ci.size));
    MPI_Allgather(&local, sizeof local, MPI_BYTE, all.data(), sizeof local, MPI_BYTE, ci.comm);
    for (std::size_t step = 1; step < all.size(); step *= 2)
        for (std::size_t i = 0; i + step < all.size(); i += 2 * step)
            all[i] = mpiml::detail::combine(all[i], all[i + step]);
    const auto got = mpiml::mpi_statistics_scalar(x, true, ci.comm);
    const auto& g = all[0];
    if (got.count != g.count || got.mean != g.mean || got.std != std::sqrt(g.m2 / static_cast<double>(g.count)) ||
        got.min != g.min || got.max != g.max)
        fail("statistics differ from the rank-order combination");
}

template <class T>
void op_bucket(std::mt19937_64& sg, std::mt19937_64& dg, const CommInfo& ci) {
    std::size_t n = draw_count(sg, sizeof(T), ci);
    n = std::min<std::size_t>(n, (std::size_t{3} << 20) / sizeof(T));
    const bool average = (std::is_floating_point_v<T> || is_cplx<T>::value) && sg() % 2;
    std::vector<Op> ops;
    for (Op o : mpiml::all_ops)
        if (legal<T>(o)) ops.push_back(o);
    const Op o = average ? Op::sum : ops[sg() % ops.size()];
    const bool exact = mpiml::shm::config().mode == mpiml::shm::Mode::off;  // then MPI reduces
    current += " SharedBucket<" + std::string(mpiml::mpi_type_traits<T>::name) + "> " +
               (average ? "average" : mpiml::op_name(o)) + " n=" + std::to_string(n);
    std::vector<T> x(n);
    for (auto& v : x) v = draw<T>(dg, o, exact);
    const auto all = gather_all(x, ci);
    auto want = reference(all, n, o, ci);
    if constexpr (std::is_floating_point_v<T> || is_cplx<T>::value) {
        if (average) {
            using R = std::conditional_t<is_cplx<T>::value, typename is_cplx<T>::type, T>;
            (void)sizeof(R);
            for (auto& v : want) {
                if constexpr (is_cplx<T>::value) v = v / static_cast<typename T::value_type>(ci.size);
                else v = v / static_cast<T>(ci.size);
            }
        }
    }
    mpiml::SharedBucket b(n * sizeof(T) + sg() % 64, ci.comm);
    std::copy(x.begin(), x.end(), b.as_span<T>().begin());
    if (average) {
        if constexpr (std::is_floating_point_v<T> || is_cplx<T>::value) b.average<T>(n);
    } else {
        b.allreduce<T>(n, o);
    }
    if (!(exact ? same_value(b.as_span<T>().data(), want.data(), n)
                : same_bits(b.as_span<T>().data(), want.data(), n)))
        fail("SharedBucket differs from the reference");
}

template <class F>
void with_type(int t, F&& f) {
    switch (t) {
        case 0: return f(static_cast<signed char*>(nullptr));
        case 1: return f(static_cast<unsigned char*>(nullptr));
        case 2: return f(static_cast<short*>(nullptr));
        case 3: return f(static_cast<unsigned short*>(nullptr));
        case 4: return f(static_cast<int*>(nullptr));
        case 5: return f(static_cast<unsigned*>(nullptr));
        case 6: return f(static_cast<long*>(nullptr));
        case 7: return f(static_cast<unsigned long*>(nullptr));
        case 8: return f(static_cast<long long*>(nullptr));
        case 9: return f(static_cast<unsigned long long*>(nullptr));
        case 10: return f(static_cast<long*>(nullptr));  // bool: std::vector<bool> is no range of bool
        case 11: return f(static_cast<std::complex<float>*>(nullptr));
        case 12: return f(static_cast<std::complex<double>*>(nullptr));
        case 13:
        case 14: return f(static_cast<double*>(nullptr));
        default: return f(static_cast<float*>(nullptr));
    }
}

}  // namespace

int main(int argc, char** argv) {
    mpiml::Session session(argc, argv);
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--seed" && i + 1 < argc) seed_opt = std::strtoull(argv[++i], nullptr, 10);
        else if (a == "--ops" && i + 1 < argc) ops_opt = std::atol(argv[++i]);
        else if (a == "--first" && i + 1 < argc) first_opt = std::atol(argv[++i]);
        else if (a == "--verbose") verbose = true;
        else {
            std::fprintf(stderr, "usage: test_differential [--seed S] [--ops N] [--first K] [--verbose]\n");
            return 2;
        }
    }
    const int world_rank = session.rank(), world_size = session.size();
    // Communicators: world, world split in two with reversed rank order, a dup.
    MPI_Comm split = MPI_COMM_NULL, dup = MPI_COMM_NULL;
    MPI_Comm_split(MPI_COMM_WORLD, world_rank % 2, world_size - world_rank, &split);
    MPI_Comm_dup(MPI_COMM_WORLD, &dup);
    const int node_split = mpiml::shm::config().node_split;
    const auto original_mode = mpiml::shm::config().mode;
    long done = 0;
    for (long k = first_opt; k < first_opt + ops_opt; ++k) {
        // Shared decisions from (seed, k); data from (seed, k, rank).
        std::mt19937_64 sg(seed_opt * 0x9E3779B97F4A7C15ull + static_cast<std::uint64_t>(k));
        const MPI_Comm comms[] = {MPI_COMM_WORLD, split, dup};
        const int which = static_cast<int>(sg() % 3);
        CommInfo ci{comms[which], 0, 0, node_split};
        MPI_Comm_size(ci.comm, &ci.size);
        MPI_Comm_rank(ci.comm, &ci.rank);
        std::mt19937_64 dg(sg() ^ (0xD1B54A32D192ED03ull * static_cast<std::uint64_t>(world_rank + 1)));
        const mpiml::shm::Mode modes[] = {mpiml::shm::Mode::off, mpiml::shm::Mode::on,
                                          mpiml::shm::Mode::automatic};
        const auto mode = modes[sg() % 3];
        mpiml::shm::set_mode(mode);
        const char* mode_name[] = {"auto", "on", "off"};
        const char* comm_name[] = {"world", "split", "dup"};
        current = std::to_string(k) + " (comm=" + comm_name[which] + " size=" + std::to_string(ci.size) +
                  " shm=" + mode_name[static_cast<int>(mode)] + " node_split=" + std::to_string(node_split) + ")";
        const int kind = static_cast<int>(sg() % 10);
        const int type = static_cast<int>(sg() % 17);
        with_type(type, [&](auto* tag) {
            using T = std::remove_pointer_t<decltype(tag)>;
            if (kind <= 3) op_allreduce<T>(sg, dg, ci);
            else if (kind == 4) {
                if constexpr (!is_cplx<T>::value) op_avg<T>(sg, dg, ci);
                else op_broadcast<T>(sg, dg, ci);
            } else if (kind <= 6) op_broadcast<T>(sg, dg, ci);
            else if (kind == 7) op_string(sg, dg, ci);
            else if (kind == 8) op_statistics(sg, dg, ci);
            else {
                op_bucket<T>(sg, dg, ci);
            }
        });
        if (verbose && world_rank == 0) std::printf("%s\n", current.c_str());
        ++done;
    }
    mpiml::shm::set_mode(original_mode);
    long any = failures;
    MPI_Allreduce(MPI_IN_PLACE, &any, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    if (world_rank == 0)
        std::printf("differential: seed %llu, ops %ld..%ld on %d ranks (node split %d): %s\n",
                    static_cast<unsigned long long>(seed_opt), first_opt, first_opt + done - 1,
                    world_size, node_split, any ? "FAILED" : "all equal to the reference");
    MPI_Comm_free(&split);
    MPI_Comm_free(&dup);
    return any ? 1 : 0;
}
