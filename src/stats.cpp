#include <mpiml/stats.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace mpiml::detail {

Moments local_moments(const double* x, std::size_t n) {
    Moments m;
    m.count = n;
    m.min = std::numeric_limits<double>::infinity();
    m.max = -std::numeric_limits<double>::infinity();
    if (n == 0) return m;
    // Two passes: the mean, then squared deviations from it (stable for
    // values with a large common offset).
    double sum = 0.0;
    for (std::size_t i = 0; i < n; ++i) {
        sum += x[i];
        m.min = std::min(m.min, x[i]);
        m.max = std::max(m.max, x[i]);
    }
    m.mean = sum / static_cast<double>(n);
    double m2 = 0.0, comp = 0.0;
    for (std::size_t i = 0; i < n; ++i) {
        const double d = x[i] - m.mean;
        m2 += d * d;
        comp += d;
    }
    // Correct for the rounding error of the mean (compensated two-pass).
    m.m2 = std::max(0.0, m2 - comp * comp / static_cast<double>(n));
    return m;
}

Moments combine(const Moments& a, const Moments& b) {
    if (a.count == 0) return b;
    if (b.count == 0) return a;
    Moments r;
    r.count = a.count + b.count;
    const double na = static_cast<double>(a.count), nb = static_cast<double>(b.count);
    const double n = static_cast<double>(r.count);
    const double delta = b.mean - a.mean;
    r.mean = a.mean + delta * (nb / n);
    r.m2 = a.m2 + b.m2 + delta * delta * (na * nb / n);
    r.min = std::min(a.min, b.min);
    r.max = std::max(a.max, b.max);
    return r;
}

Statistics reduce_moments(const Moments& local, MPI_Comm comm, const char* call) {
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
    Statistics s;
    s.count = g.count;
    s.mean = g.mean;
    s.std = std::sqrt(g.m2 / static_cast<double>(g.count));
    s.min = g.min;
    s.max = g.max;
    return s;
}

}  // namespace mpiml::detail
