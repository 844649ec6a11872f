// The shared-memory backend's answers to the core (core/backend.hpp): it
// takes an allreduce or a broadcast when its path applies, else declines.
#include "algorithms.hpp"

#include "core/backend.hpp"
#include "core/types.hpp"

#include <mpiml/error.hpp>

namespace mpiml::detail {
namespace {

constexpr std::size_t kCrowdedBroadcastMinimum = 1024;

// An empty call is still compared: a peer may have passed more.
bool compare_only(ShmContext& c, const Signature& sig, const char* call) {
    ++c.round;
    checked_barrier(c, sig, call);
    return true;
}

}  // namespace

bool shm_takes(std::size_t bytes, MPI_Comm comm, const char* call) {
    // shm_allreduce's decision for a built-in op on a type with a kernel.
    return shared_context_for(bytes, config_ref().allreduce_threshold, comm, call) != nullptr;
}

bool shm_allreduce(const void* send, void* recv, std::size_t count, MPI_Datatype type,
                   std::size_t bytes, const ReduceOp& op, MPI_Comm comm, const char* call) {
    if (send == MPI_IN_PLACE && bucket_reduce(recv, count, type, op, false, comm, call))
        return true;
    const std::size_t threshold = config_ref().allreduce_threshold;
    if (!op.known() || !may_share(bytes, threshold)) return false;
    const Kernel k = resolve(type, *op.known());
    if (!k.combine) return false;
    ShmContext* c = shared_context_for(bytes, threshold, comm, call);
    if (!c) return false;
    const Signature sig{.count = count,
                        .bytes = bytes,
                        .kind = Signature::allreduce,
                        .op = static_cast<std::uint8_t>(*op.known()),
                        .type = static_cast<std::uint16_t>(k.type_id)};
    if (count == 0) return compare_only(*c, sig, call);
    if (send == MPI_IN_PLACE) send = recv;
    run_allreduce(*c, static_cast<const char*>(send), static_cast<char*>(recv), count, k, sig,
                  call);
    return true;
}

bool shm_broadcast(void* buf, std::size_t count, MPI_Datatype type, int tsize, int root,
                   MPI_Comm comm, const char* call) {
    const std::size_t bytes = count * static_cast<std::size_t>(tsize);
    const std::size_t threshold = config_ref().broadcast_threshold;
    if (!may_share(bytes, threshold)) return false;
    MPI_Aint lb = 0, extent = 0;
    check_mpi(MPI_Type_get_extent(type, &lb, &extent), call);
    if (lb != 0 || extent != tsize) return false;  // not contiguous bytes
    ShmContext* c = shared_context_for(bytes, threshold, comm, call);
    if (!c) return false;
    // Ranks outnumbering cores: MPI's eager sends beat a barrier that waits
    // for every rank to be scheduled, for small broadcasts.
    if (c->crowded && bytes < kCrowdedBroadcastMinimum && config_ref().mode == shm::Mode::automatic)
        return false;
    const TypeInfo* t = find_type(type);
    const Signature sig{.count = count,
                        .bytes = bytes,
                        .kind = Signature::broadcast,
                        .type = t ? static_cast<std::uint16_t>(t->id) : std::uint16_t{0xffff},
                        .root = root};
    if (bytes == 0) return compare_only(*c, sig, call);
    run_broadcast(*c, static_cast<char*>(buf), bytes, sig, call);
    return true;
}

}  // namespace mpiml::detail
