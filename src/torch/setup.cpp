// LibTorch utilities: setup_pytorch_for_mpi and mpi_avg(tensor);
// sync_params is in torch_sync.cpp, mpi_avg_grads in torch_grads.cpp.
#include "torch/common.hpp"

#include <mpiml/error.hpp>

#include <ATen/Parallel.h>

#include <dlfcn.h>
#include <sched.h>

#include <algorithm>
#include <thread>
#include <vector>

namespace mpiml {
using namespace torch_detail;

void setup_pytorch_for_mpi() {
    constexpr const char* call = "mpiml::setup_pytorch_for_mpi";
    const MPI_Comm comm = Comm{}.get(call);
    MPI_Comm node = MPI_COMM_NULL;
    detail::check_mpi(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node),
                      call);
    struct Free {
        MPI_Comm* c;
        ~Free() { MPI_Comm_free(c); }
    } free_node{&node};

    // CPUs this rank may run on, and how many ranks on this node share them
    // (a launcher that binds ranks to disjoint cores leaves each its own).
    cpu_set_t mine;
    CPU_ZERO(&mine);
    const bool have_mask = sched_getaffinity(0, sizeof mine, &mine) == 0 && CPU_COUNT(&mine) > 0;
    if (!have_mask) CPU_ZERO(&mine);
    const int local = num_procs(node);
    std::vector<cpu_set_t> masks(static_cast<std::size_t>(local));
    detail::allgather(&mine, masks.data(), sizeof(cpu_set_t), MPI_BYTE, node, call);

    int cpus = 0, sharing = 0;
    if (have_mask) {
        cpus = CPU_COUNT(&mine);
        for (auto& m : masks) {
            cpu_set_t both;
            CPU_AND(&both, &mine, &m);
            sharing += CPU_COUNT(&m) == 0 || CPU_COUNT(&both) > 0;  // unknown mask: shares
        }
    } else {
        cpus = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
        sharing = local;
    }
    const int share = at::get_num_threads() == 1 ? 1 : std::max(1, cpus / std::max(1, sharing));
    // The BLAS behind libblas.so.3 (LibTorch's sgemm) keeps its own pool.
    using SetThreads = void (*)(int);
    for (const char* fn : {"openblas_set_num_threads", "bli_thread_set_num_threads"})
        if (auto set = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, fn))) set(share);
    if (at::get_num_threads() != share) at::set_num_threads(share);
}

torch::Tensor mpi_avg(const torch::Tensor& x, Comm comm) {
    constexpr const char* call = "mpiml::mpi_avg";
    const MPI_Comm c = comm.get(call);
    if (!x.defined()) detail::fail(call, "tensor is undefined");
    const auto wire = sum_wire(x.scalar_type());
    if (!wire) detail::fail(call, "dtype " + dtype_name(x.scalar_type()) + " is not supported");
    torch::NoGradGuard no_grad;
    const at::Tensor src = x.layout() == at::kStrided ? x : x.to_dense();
    at::Tensor buf = at::empty(src.sizes(), at::TensorOptions().dtype(wire->scalar));
    buf.copy_(src);
    const int size = num_procs(c);
    detail::allreduce(MPI_IN_PLACE, buf.data_ptr(), static_cast<std::size_t>(buf.numel()),
                      wire->mpi, wire->cls, Op::sum, c, call);
    buf.div_(size);
    const at::ScalarType out = has_gradients(x.scalar_type()) ? x.scalar_type() : at::kDouble;
    return buf.to(src.options().dtype(out), /*non_blocking=*/false, /*copy=*/false);
}

}  // namespace mpiml
