// Distributed statistics of a scalar sampled on every rank.
#pragma once

#include <mpiml/collectives.hpp>
#include <mpiml/report.hpp>

#include <concepts>
#include <cstdint>
#include <type_traits>
#include <span>
#include <vector>

namespace mpiml {

/// Pooled statistics over all ranks' samples. std is the population standard
/// deviation (as the seed's). min and max are always filled in.
struct Statistics {
    double mean = 0.0;
    double std = 0.0;
    double min = 0.0;
    double max = 0.0;
    std::uint64_t count = 0;
};

namespace detail {
/// One rank's summary: count, mean, sum of squared deviations, min, max.
struct Moments {
    std::uint64_t count = 0;
    double mean = 0.0;
    double m2 = 0.0;
    double min = 0.0;
    double max = 0.0;
    std::uint64_t bits = 0;  // the samples' width: 32 (float), 64 (double, others), 0 (none)
};
Moments local_moments(const double* x, std::size_t n);
Moments local_moments(const float* x, std::size_t n);
/// Other element types: converted to double first.
template <class T>
Moments local_moments(const T* x, std::size_t n);
/// Chan et al.'s pairwise combination.
Moments combine(const Moments& a, const Moments& b);
/// widest_bits, if given: the widest samples any rank had (32 or 64), the
/// same on every rank.
Statistics reduce_moments(const Moments& local, MPI_Comm comm, const char* call,
                          std::uint64_t* widest_bits = nullptr);
}  // namespace detail

/// mpi_statistics_scalar(x, comm): mean and std (and min, max) of every
/// rank's samples pooled, in one collective, accumulated in double. Ranks
/// may hold different numbers of samples, including none. If no rank has any
/// sample, every rank throws mpiml::Error.
template <MpiRange R>
Statistics mpi_statistics_scalar(const R& x, Comm comm = {},
                                 std::source_location loc = std::source_location::current()) {
    detail::SiteMark site(loc);
    const auto* p = std::ranges::data(x);
    const auto n = std::ranges::size(x);
    return detail::reduce_moments(detail::local_moments(p, n), comm.get("mpiml::mpi_statistics_scalar"),
                                  "mpiml::mpi_statistics_scalar");
}

/// The seed's signature, mpi_statistics_scalar(x, with_min_and_max, comm):
/// with_min_and_max is accepted (a bool, nothing else); min and max are
/// computed either way at no extra cost.
template <MpiRange R, std::same_as<bool> B>
Statistics mpi_statistics_scalar(const R& x, B with_min_and_max, Comm comm = {},
                                 std::source_location loc = std::source_location::current()) {
    (void)with_min_and_max;
    return mpi_statistics_scalar(x, comm, loc);
}

/// A number as the second argument is neither a flag nor a communicator.
template <MpiRange R, class B>
    requires(std::is_arithmetic_v<B> && !std::same_as<B, bool> && !std::same_as<B, MPI_Comm>)
Statistics mpi_statistics_scalar(const R& x, B with_min_and_max, Comm comm = {},
                                 std::source_location loc = std::source_location::current()) = delete;

template <class T>
detail::Moments detail::local_moments(const T* x, std::size_t n) {
    std::vector<double> d(x, x + n);
    return local_moments(d.data(), d.size());
}

}  // namespace mpiml
