// allreduce, broadcast and the seed's mpi_op / mpi_sum / mpi_avg.
//
// Typed templates over a small type-erased core (detail::allreduce,
// detail::broadcast), so that every collective goes through one place that
// checks arguments, runs the watchdog, the mismatch check and the profiler.
// The last argument of each, left to its default, is the caller's source
// location: mismatch errors and reports name it.
#pragma once

#include <mpiml/datatype.hpp>
#include <mpiml/error.hpp>
#include <mpiml/op.hpp>
#include <mpiml/report.hpp>
#include <mpiml/session.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <ranges>
#include <source_location>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace mpiml {

/// Contiguous, sized range of an MPI element type (std::vector, std::array,
/// std::span, C array, ...).
template <class R>
concept MpiRange = std::ranges::contiguous_range<R> && std::ranges::sized_range<R> &&
                   MpiType<std::ranges::range_value_t<R>>;

/// An MpiRange whose elements can be written.
template <class R>
concept MutableMpiRange =
    MpiRange<R> && !std::is_const_v<std::remove_reference_t<std::ranges::range_reference_t<R>>>;

template <class R>
using range_elem_t = std::remove_cv_t<std::ranges::range_value_t<R>>;

namespace detail {

struct CommUse;

/// The type-erased core. send may be MPI_IN_PLACE. count may exceed INT_MAX.
/// call names the call in errors and profiles and must live as long as the
/// profile: a string literal, or detail::profile_intern(name).
void allreduce(const void* send, void* recv, std::size_t count, MPI_Datatype type,
               TypeClass cls, const ReduceOp& op, MPI_Comm comm, const char* call);
/// In place: the sum over ranks divided by their number (floating or
/// complex types). A SharedBucket's memory is reduced in node-shared memory.
void average(void* buf, std::size_t count, MPI_Datatype type, MPI_Comm comm, const char* call);
void broadcast(void* buf, std::size_t count, MPI_Datatype type, int root, MPI_Comm comm,
               const char* call);
/// Gathers count elements from every rank into recv (count * size elements).
void allgather(const void* send, void* recv, std::size_t count, MPI_Datatype type,
               MPI_Comm comm, const char* call);
void barrier(MPI_Comm comm, const char* call);

/// A collective of another door (the torch.distributed backend) that is not
/// one core call: what every rank must agree on and how it is watched.
struct DoorCall {
    int kind;          // for the exit guard: 1 allreduce, 2 broadcast, 3 allgather, 4 barrier, 5 other
    const char* call;  // names it in errors and in the watchdog's message
    MPI_Comm comm;
    const std::int64_t* sig = nullptr;  // nsig values every rank must have passed alike
    int nsig = 0;
    std::function<std::string(const std::int64_t*)> describe;  // one rank's sig, in a mismatch
    bool check = false;  // the agreement round (also run when mpiml::check_enabled())
    double timeout = 0;  // seconds; 0: mpiml::timeout()
    std::string where;   // appended to the watchdog's message
};

/// RAII around a door's collective, on the thread that runs it: its sequence
/// number, exit-guard mark, watchdog slot and (when checking) the one
/// agreement round, through the same code as the core's collectives. Core
/// calls inside it on the same thread and communicator add none of these.
class DoorScope {
public:
    explicit DoorScope(const DoorCall& call);
    ~DoorScope();
    DoorScope(const DoorScope&) = delete;
    DoorScope& operator=(const DoorScope&) = delete;

private:
    friend class CollectiveScope;
    MPI_Comm comm_;
    const DoorScope* outer_;
    std::uint64_t seq_ = 0;
    std::uint64_t watch_ = 0;
    std::int64_t t0_ = 0;
    std::int64_t check_ns_ = -1;
    bool marked_ = false;
    bool checked_ = false;  // ran the agreement round
    std::uint64_t history_ = 0;
    CommUse* use_ = nullptr;
};

/// A door's wait outside a collective (a posted send or receive), watched
/// like a collective: past timeout (0: mpiml::timeout()) the job ends with
/// "watchdog: <call> waited ... s, past the timeout of ... s<where>".
class DoorWatch {
public:
    DoorWatch(std::string call, double timeout, std::string where);
    ~DoorWatch();
    DoorWatch(const DoorWatch&) = delete;
    DoorWatch& operator=(const DoorWatch&) = delete;

private:
    std::uint64_t id_ = 0;
};

/// Agreement rounds run by this process so far (each a small allreduce): one
/// per checked collective, whichever door issued it.
std::uint64_t agreement_rounds();

/// The MPI_Op mpiml hands to MPI for type: op.native(), or mpiml's own
/// implementation for an integer sum/prod/min/max that this MPI library
/// computes wrongly (probed once per process with MPI_Reduce_local).
MPI_Op mpi_op_for(MPI_Datatype type, const ReduceOp& op);

template <class T>
constexpr TypeClass type_class_of() {
    return mpi_type_traits<std::remove_cv_t<T>>::type_class;
}
}  // namespace detail

// ---------------------------------------------------------------- allreduce

/// allreduce(send, recv, op): recv[i] = op over ranks of send[i].
/// send and recv must hold the same number of elements of the same type.
template <MpiRange S, MutableMpiRange R>
void allreduce(const S& send, R&& recv, ReduceOp op, Comm comm = {},
               std::source_location loc = std::source_location::current()) {
    detail::SiteMark site(loc);
    using T = range_elem_t<S>;
    static_assert(std::is_same_v<T, range_elem_t<R>>,
                  "mpiml::allreduce: send and recv must have the same element type");
    const auto n = std::ranges::size(send);
    if (n != std::ranges::size(recv))
        detail::fail("mpiml::allreduce", "send has " + std::to_string(n) +
                                             " elements but recv has " +
                                             std::to_string(std::ranges::size(recv)));
    detail::allreduce(std::ranges::data(send), std::ranges::data(recv), n, mpi_datatype<T>(),
                      detail::type_class_of<T>(), op, comm.get("mpiml::allreduce"), "mpiml::allreduce");
}

/// Scalar allreduce(send, recv, op).
template <MpiType T>
void allreduce(const T& send, T& recv, ReduceOp op, Comm comm = {},
               std::source_location loc = std::source_location::current()) {
    detail::SiteMark site(loc);
    detail::allreduce(&send, &recv, 1, mpi_datatype<T>(), detail::type_class_of<T>(), op,
                      comm.get("mpiml::allreduce"), "mpiml::allreduce");
}

/// In-place allreduce(x, op) of a range.
template <MutableMpiRange R>
void allreduce(R&& x, ReduceOp op, Comm comm = {},
               std::source_location loc = std::source_location::current()) {
    detail::SiteMark site(loc);
    using T = range_elem_t<R>;
    detail::allreduce(MPI_IN_PLACE, std::ranges::data(x), std::ranges::size(x),
                      mpi_datatype<T>(), detail::type_class_of<T>(), op, comm.get("mpiml::allreduce"),
                      "mpiml::allreduce");
}

/// In-place allreduce(x, op) of a scalar.
template <MpiType T>
void allreduce(T& x, ReduceOp op, Comm comm = {},
               std::source_location loc = std::source_location::current()) {
    detail::SiteMark site(loc);
    detail::allreduce(MPI_IN_PLACE, &x, 1, mpi_datatype<T>(), detail::type_class_of<T>(), op,
                      comm.get("mpiml::allreduce"), "mpiml::allreduce");
}

// ---------------------------------------------------------------- broadcast

/// broadcast(x, root): x becomes root's x on every rank (in place).
template <MpiType T>
void broadcast(T& x, int root = 0, Comm comm = {},
               std::source_location loc = std::source_location::current()) {
    detail::SiteMark site(loc);
    detail::broadcast(&x, 1, mpi_datatype<T>(), root, comm.get("mpiml::broadcast"), "mpiml::broadcast");
}

/// In-place broadcast of a range; every rank must pass the same length.
template <MutableMpiRange R>
    requires(!std::is_same_v<std::remove_cvref_t<R>, std::string>)
void broadcast(R&& x, int root = 0, Comm comm = {},
               std::source_location loc = std::source_location::current()) {
    detail::SiteMark site(loc);
    detail::broadcast(std::ranges::data(x), std::ranges::size(x), mpi_datatype<range_elem_t<R>>(),
                      root, comm.get("mpiml::broadcast"), "mpiml::broadcast");
}

/// Broadcast of a string; other ranks' strings are resized to root's.
void broadcast(std::string& s, int root = 0, Comm comm = {},
               std::source_location loc = std::source_location::current());

// ------------------------------------------------- seed: mpi_op, sum, avg

/// mpi_op(x, op): the reduction of scalar x over all ranks, same type as x.
template <MpiType T>
T mpi_op(const T& x, ReduceOp op, Comm comm = {},
               std::source_location loc = std::source_location::current()) {
    detail::SiteMark site(loc);
    T out{};
    detail::allreduce(&x, &out, 1, mpi_datatype<T>(), detail::type_class_of<T>(), op,
                      comm.get("mpiml::mpi_op"), "mpiml::mpi_op");
    return out;
}

/// mpi_op(x, op) of a range: a new vector, same element type as x.
template <MpiRange R>
std::vector<range_elem_t<R>> mpi_op(const R& x, ReduceOp op, Comm comm = {},
               std::source_location loc = std::source_location::current()) {
    detail::SiteMark site(loc);
    using T = range_elem_t<R>;
    std::vector<T> out(std::ranges::size(x));
    detail::allreduce(std::ranges::data(x), out.data(), out.size(), mpi_datatype<T>(),
                      detail::type_class_of<T>(), op, comm.get("mpiml::mpi_op"), "mpiml::mpi_op");
    return out;
}

/// Sum of a scalar or range over all ranks (element type preserved).
template <class X>
    requires MpiType<X> || MpiRange<X>
auto mpi_sum(const X& x, Comm comm = {},
               std::source_location loc = std::source_location::current()) {
    detail::SiteMark site(loc);
    const MPI_Comm c = comm.get("mpiml::mpi_sum");
    if constexpr (MpiType<X>) {
        X out{};
        detail::allreduce(&x, &out, 1, mpi_datatype<X>(), detail::type_class_of<X>(), Op::sum, c,
                          "mpiml::mpi_sum");
        return out;
    } else {
        using T = range_elem_t<X>;
        std::vector<T> out(std::ranges::size(x));
        detail::allreduce(std::ranges::data(x), out.data(), out.size(), mpi_datatype<T>(),
                          detail::type_class_of<T>(), Op::sum, c, "mpiml::mpi_sum");
        return out;
    }
}

/// Result type of mpi_avg: double for integers and bool, else the type itself.
template <class T>
using avg_t = std::conditional_t<detail::type_class_of<T>() == TypeClass::integer ||
                                     detail::type_class_of<T>() == TypeClass::logical,
                                 double, T>;

/// Average of a scalar over all ranks. Integers average to double.
template <MpiType T>
avg_t<T> mpi_avg(const T& x, Comm comm = {},
               std::source_location loc = std::source_location::current()) {
    detail::SiteMark site(loc);
    const MPI_Comm c = comm.get("mpiml::mpi_avg");
    const avg_t<T> v = static_cast<avg_t<T>>(x);
    avg_t<T> sum{};
    detail::allreduce(&v, &sum, 1, mpi_datatype<avg_t<T>>(),
                      detail::type_class_of<avg_t<T>>(), Op::sum, c, "mpiml::mpi_avg");
    return sum / static_cast<avg_t<T>>(num_procs(c));
}

/// Elementwise average of a range over all ranks: a new vector.
template <MpiRange R>
std::vector<avg_t<range_elem_t<R>>> mpi_avg(const R& x, Comm comm = {},
               std::source_location loc = std::source_location::current()) {
    detail::SiteMark site(loc);
    using T = range_elem_t<R>;
    using A = avg_t<T>;
    const MPI_Comm c = comm.get("mpiml::mpi_avg");
    std::vector<A> out;
    if constexpr (std::is_same_v<A, T>) {
        out.resize(std::ranges::size(x));
        detail::allreduce(std::ranges::data(x), out.data(), out.size(), mpi_datatype<A>(),
                          detail::type_class_of<A>(), Op::sum, c, "mpiml::mpi_avg");
    } else {
        out.assign(std::ranges::begin(x), std::ranges::end(x));
        detail::allreduce(MPI_IN_PLACE, out.data(), out.size(), mpi_datatype<A>(),
                          detail::type_class_of<A>(), Op::sum, c, "mpiml::mpi_avg");
    }
    const A n = static_cast<A>(num_procs(c));
    for (auto& v : out) v /= n;
    return out;
}

/// Blocks until every rank of comm has called it.
void barrier(Comm comm = {}, std::source_location loc = std::source_location::current());

/// Every rank's value, in rank order.
template <MpiType T>
std::vector<T> allgather(const T& x, Comm comm = {},
               std::source_location loc = std::source_location::current()) {
    detail::SiteMark site(loc);
    const MPI_Comm c = comm.get("mpiml::allgather");
    std::vector<T> out(static_cast<std::size_t>(num_procs(c)));
    detail::allgather(&x, out.data(), 1, mpi_datatype<T>(), c, "mpiml::allgather");
    return out;
}

}  // namespace mpiml
