#include <mpiml/stats.hpp>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace mpiml::detail {

namespace {

using D2 = double __attribute__((vector_size(16)));
using F2 = float __attribute__((vector_size(8)));

inline D2 load2(const double* p) {
    D2 v;
    std::memcpy(&v, p, sizeof v);
    return v;
}
inline D2 load2(const float* p) {
#if defined(__SSE2__)
    // GCC lowers the generic conversion of two floats to scalar code.
    const __m128 f = _mm_castsi128_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    return static_cast<D2>(_mm_cvtps_pd(f));
#else
    F2 v;
    std::memcpy(&v, p, sizeof v);
    return __builtin_convertvector(v, D2);
#endif
}

// Two passes: the mean, then squared deviations from it (stable for values
// with a large common offset), corrected for the rounding error of the mean
// (compensated two-pass). Each pass keeps `lanes` independent accumulators
// so that it is not one long chain of dependent additions, held as four
// pairs of doubles in registers; float input is widened two values at a
// time, never copied.
template <class T>
Moments moments(const T* x, std::size_t n) {
    constexpr std::size_t lanes = 8;
    constexpr double inf = std::numeric_limits<double>::infinity();
    Moments m;
    m.count = n;
    m.min = inf;
    m.max = -inf;
    if (n == 0) return m;
    const std::size_t body = n - n % lanes;

    // Lane k takes elements i % 8 == k, as pairs of doubles (16-byte vectors,
    // which every x86-64 and AArch64 target has), four pairs per step.
    D2 vsum[4] = {}, vlo[4], vhi[4];
    for (int j = 0; j < 4; ++j) vlo[j] = D2{inf, inf}, vhi[j] = D2{-inf, -inf};
    for (std::size_t i = 0; i < body; i += lanes)
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) {
            const D2 v = load2(x + i + 2 * j);
            vsum[j] += v;
            vlo[j] = v < vlo[j] ? v : vlo[j];  // as std::min: a NaN is never taken
            vhi[j] = vhi[j] < v ? v : vhi[j];
        }
    double sum[lanes], lo[lanes], hi[lanes];
    for (std::size_t k = 0; k < lanes; ++k)
        sum[k] = vsum[k / 2][k % 2], lo[k] = vlo[k / 2][k % 2], hi[k] = vhi[k / 2][k % 2];
    double total = 0.0;
    for (std::size_t k = 0; k < lanes; ++k) {
        total += sum[k];
        m.min = std::min(m.min, lo[k]);
        m.max = std::max(m.max, hi[k]);
    }
    for (std::size_t i = body; i < n; ++i) {
        const double v = static_cast<double>(x[i]);
        total += v;
        m.min = std::min(m.min, v);
        m.max = std::max(m.max, v);
    }
    m.mean = total / static_cast<double>(n);
    if (std::isnan(total))  // a NaN sample (or inf and -inf): min and max are NaN with a NaN, as numpy's
        for (std::size_t i = 0; i < n; ++i)
            if (std::isnan(static_cast<double>(x[i]))) {
                m.min = m.max = std::numeric_limits<double>::quiet_NaN();
                break;
            }

    D2 vsq[4] = {}, vdev[4] = {};
    for (std::size_t i = 0; i < body; i += lanes)
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) {
            const D2 d = load2(x + i + 2 * j) - m.mean;
            vsq[j] += d * d;
            vdev[j] += d;
        }
    double sq[lanes], dev[lanes];
    for (std::size_t k = 0; k < lanes; ++k) sq[k] = vsq[k / 2][k % 2], dev[k] = vdev[k / 2][k % 2];
    double m2 = 0.0, comp = 0.0;
    for (std::size_t k = 0; k < lanes; ++k) {
        m2 += sq[k];
        comp += dev[k];
    }
    for (std::size_t i = body; i < n; ++i) {
        const double d = static_cast<double>(x[i]) - m.mean;
        m2 += d * d;
        comp += d;
    }
    const double v = m2 - comp * comp / static_cast<double>(n);
    m.m2 = v < 0.0 ? 0.0 : v;  // a NaN (from an inf or a NaN sample) stays NaN, as numpy's std
    return m;
}

}  // namespace

Moments local_moments(const double* x, std::size_t n) {
    Moments m = moments(x, n);
    m.bits = n ? 64 : 0;
    return m;
}
Moments local_moments(const float* x, std::size_t n) {
    Moments m = moments(x, n);
    m.bits = n ? 32 : 0;
    return m;
}

Moments combine(const Moments& a, const Moments& b) {
    if (a.count == 0) return b;
    if (b.count == 0) return a;
    Moments r;
    r.count = a.count + b.count;
    r.bits = std::max(a.bits, b.bits);
    const double na = static_cast<double>(a.count), nb = static_cast<double>(b.count);
    const double n = static_cast<double>(r.count);
    if (!std::isfinite(a.mean) || !std::isfinite(b.mean)) {
        // inf - inf would make the mean NaN: weighted as numpy's mean is
        // (inf with finite values is inf), and the spread is NaN.
        r.mean = a.mean * (na / n) + b.mean * (nb / n);
        r.m2 = std::numeric_limits<double>::quiet_NaN();
    } else {
        const double delta = b.mean - a.mean;
        r.mean = a.mean + delta * (nb / n);
        r.m2 = a.m2 + b.m2 + delta * delta * (na * nb / n);
    }
    // A NaN on either side stays (numpy's min and max propagate NaN).
    r.min = std::isnan(a.min) || std::isnan(b.min) ? std::numeric_limits<double>::quiet_NaN()
                                                    : std::min(a.min, b.min);
    r.max = std::isnan(a.max) || std::isnan(b.max) ? std::numeric_limits<double>::quiet_NaN()
                                                    : std::max(a.max, b.max);
    return r;
}

Statistics reduce_moments(const Moments& local, MPI_Comm comm, const char* call, std::uint64_t* widest_bits) {
    int size = 0;
    check_mpi(MPI_Comm_size(comm, &size), call);
    // One collective: every rank gets every rank's summary and combines them
    // in the same order, so all ranks get bit-identical results.
    std::vector<Moments> all(static_cast<std::size_t>(size));
    detail::allgather(&local, all.data(), sizeof(Moments), MPI_BYTE, comm, call);
    // Pairwise tree combination, in rank order.
    for (std::size_t step = 1; step < all.size(); step *= 2)
        for (std::size_t i = 0; i + step < all.size(); i += 2 * step)
            all[i] = combine(all[i], all[i + step]);
    const Moments& g = all[0];
    if (g.count == 0) fail(call, "no rank has any sample (every rank passed an empty range)");
    if (widest_bits) *widest_bits = g.bits;
    Statistics s;
    s.count = g.count;
    s.mean = g.mean;
    s.std = std::sqrt(g.m2 / static_cast<double>(g.count));
    s.min = g.min;
    s.max = g.max;
    return s;
}

}  // namespace mpiml::detail
