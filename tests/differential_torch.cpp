// Randomized differential test of the LibTorch layer: random parameter lists
// (shapes incl. 0-d and empty, float32/float64, frozen parameters, gradients
// missing on some ranks), bucket caps, gradient_as_bucket_view, the free
// mpi_avg_grads or a GradAverager, communicators and shared-memory modes;
// sync_params with random roots. References from every rank's data gathered
// with plain MPI. Gradients are integers times the rank count, so any
// reduction order sums exactly; the average is compared within 1 ulp (the
// division). Broadcast parameters are compared bit for bit.
//   mpirun -np 3 test_differential_torch [--seed S] [--ops N] [--first K]
#include <mpiml/mpiml.hpp>
#include <mpiml/torch.hpp>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace {

std::uint64_t seed_opt = 1;
long ops_opt = 50, first_opt = 0, failures = 0;
std::string current;

void fail(const std::string& what) {
    if (failures < 20)
        std::printf("FAIL rank %d: seed %llu op %s: %s\n", mpiml::proc_id(),
                    static_cast<unsigned long long>(seed_opt), current.c_str(), what.c_str());
    ++failures;
}

std::vector<torch::Tensor> gather(const torch::Tensor& t, MPI_Comm comm, int size) {
    auto c = t.contiguous();
    auto all = torch::empty({size, c.numel()}, c.options());
    MPI_Allgather(c.data_ptr(), static_cast<int>(c.numel() * c.element_size()), MPI_BYTE,
                  all.data_ptr(), static_cast<int>(c.numel() * c.element_size()), MPI_BYTE, comm);
    std::vector<torch::Tensor> out;
    for (int r = 0; r < size; ++r) out.push_back(all[r].view(t.sizes()));
    return out;
}

void op(long k, MPI_Comm comm, const char* comm_name, int world_rank) {
    std::mt19937_64 sg(seed_opt * 0x9E3779B97F4A7C15ull + static_cast<std::uint64_t>(k));
    std::mt19937_64 dg(sg() ^ (0xD1B54A32D192ED03ull * static_cast<std::uint64_t>(world_rank + 1)));
    int size = 0, rank = 0;
    MPI_Comm_size(comm, &size);
    MPI_Comm_rank(comm, &rank);
    const mpiml::shm::Mode modes[] = {mpiml::shm::Mode::automatic, mpiml::shm::Mode::on,
                                      mpiml::shm::Mode::off};
    const int mode = static_cast<int>(sg() % 3);
    mpiml::shm::set_mode(modes[mode]);
    const int n = 1 + static_cast<int>(sg() % 12);
    std::vector<torch::Tensor> ps;
    std::string shapes;
    for (int i = 0; i < n; ++i) {
        std::vector<std::int64_t> shape;
        const int dims = static_cast<int>(sg() % 3);
        for (int d = 0; d < dims; ++d) shape.push_back(static_cast<std::int64_t>(sg() % 5 == 0 ? sg() % 3000 : sg() % 40));
        const auto dtype = sg() % 3 == 0 ? torch::kFloat64 : torch::kFloat32;
        const bool frozen = sg() % 8 == 0;
        auto p = torch::zeros(shape, torch::dtype(dtype)).requires_grad_(!frozen);
        ps.push_back(p);
        shapes += (i ? "," : "") + std::to_string(p.numel()) + (dtype == torch::kFloat64 ? "d" : "f") + (frozen ? "z" : "");
    }
    mpiml::AvgGradsOptions o;
    o.bucket_cap_bytes = sg() % 2 ? (std::size_t{25} << 20) : 64 + sg() % 20000;
    o.gradient_as_bucket_view = sg() % 2;
    const bool object = sg() % 2;
    const int steps = 1 + static_cast<int>(sg() % 3);
    current = std::to_string(k) + " (comm=" + comm_name + " size=" + std::to_string(size) +
              " shm=" + std::to_string(mode) + ") avg_grads params=[" + shapes + "] cap=" +
              std::to_string(o.bucket_cap_bytes) + " views=" + std::to_string(o.gradient_as_bucket_view) +
              (object ? " GradAverager" : " mpi_avg_grads") + " steps=" + std::to_string(steps);
    std::optional<mpiml::GradAverager> avg;
    if (object) avg.emplace(ps, o, comm);
    for (int step = 0; step < steps; ++step) {
        std::vector<torch::Tensor> sent;
        std::vector<int> had;
        for (auto& p : ps) {
            if (!p.requires_grad()) {
                sent.push_back({});
                had.push_back(0);
                continue;
            }
            const bool missing = dg() % 6 == 0;  // this rank has no gradient
            auto g = torch::randint(-50, 50, p.sizes(), torch::dtype(p.scalar_type())) * size;
            if (missing) {
                if (p.grad().defined()) p.mutable_grad() = torch::Tensor();
                g = torch::zeros_like(g);
            } else if (p.grad().defined()) {
                p.mutable_grad().copy_(g);  // may be a bucket view: write through
            } else {
                p.mutable_grad() = g.clone();
            }
            sent.push_back(g);
            had.push_back(missing ? 0 : 1);
        }
        std::vector<std::vector<torch::Tensor>> all;
        std::vector<int> any(had.size());
        MPI_Allreduce(had.data(), any.data(), static_cast<int>(had.size()), MPI_INT, MPI_MAX, comm);
        for (std::size_t i = 0; i < ps.size(); ++i)
            all.push_back(ps[i].requires_grad() ? gather(sent[i], comm, size) : std::vector<torch::Tensor>{});
        if (avg) (*avg)();
        else mpiml::mpi_avg_grads(ps, o, comm);
        for (std::size_t i = 0; i < ps.size(); ++i) {
            const auto& g = ps[i].grad();
            if (!ps[i].requires_grad()) {
                if (g.defined()) fail("frozen parameter #" + std::to_string(i) + " got a gradient");
                continue;
            }
            if (!any[i]) {
                if (g.defined() && g.numel() > 0 && g.abs().max().item<double>() != 0.0)
                    fail("gradient #" + std::to_string(i) + " missing everywhere is not zero/undefined");
                continue;
            }
            torch::Tensor sum = torch::zeros_like(all[i][0]);
            for (int r = 0; r < size; ++r) sum += all[i][r];
            const auto want = sum / size;  // exact: every input is a multiple of size
            if (!g.defined() || !g.sizes().equals(want.sizes())) {
                fail("gradient #" + std::to_string(i) + " undefined or of the wrong shape");
                continue;
            }
            const double tol = g.scalar_type() == torch::kFloat32 ? 1e-7 : 1e-15;
            if (!torch::allclose(g, want, tol, 0.0)) fail("gradient #" + std::to_string(i) + " differs from the reference");
        }
    }
    // sync_params from a random root: bit for bit with MPI_Bcast of the root's values.
    const int root = static_cast<int>(sg() % static_cast<std::uint64_t>(size));
    current += " | sync_params root=" + std::to_string(root);
    std::vector<torch::Tensor> want;
    {
        torch::NoGradGuard ng;
        for (auto& p : ps) {
            p.uniform_(-1, 1);
            auto w = p.detach().clone();
            if (w.numel())
                MPI_Bcast(w.data_ptr(), static_cast<int>(w.numel() * w.element_size()), MPI_BYTE, root, comm);
            want.push_back(w);
        }
    }
    mpiml::sync_params(ps, root, comm);
    for (std::size_t i = 0; i < ps.size(); ++i)
        if (!torch::equal(ps[i].detach(), want[i])) fail("parameter #" + std::to_string(i) + " differs from the root's");
}

}  // namespace

int main(int argc, char** argv) {
    mpiml::Session session(argc, argv);
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--seed" && i + 1 < argc) seed_opt = std::strtoull(argv[++i], nullptr, 10);
        else if (a == "--ops" && i + 1 < argc) ops_opt = std::atol(argv[++i]);
        else if (a == "--first" && i + 1 < argc) first_opt = std::atol(argv[++i]);
        else {
            std::fprintf(stderr, "usage: test_differential_torch [--seed S] [--ops N] [--first K]\n");
            return 2;
        }
    }
    torch::manual_seed(static_cast<std::uint64_t>(session.rank()) + seed_opt);
    const int wr = session.rank(), ws = session.size();
    MPI_Comm split = MPI_COMM_NULL, dup = MPI_COMM_NULL;
    MPI_Comm_split(MPI_COMM_WORLD, wr % 2, ws - wr, &split);
    MPI_Comm_dup(MPI_COMM_WORLD, &dup);
    const auto original = mpiml::shm::config().mode;
    for (long k = first_opt; k < first_opt + ops_opt; ++k) {
        const int which = static_cast<int>(k % 3);
        const MPI_Comm comms[] = {MPI_COMM_WORLD, split, dup};
        const char* names[] = {"world", "split", "dup"};
        op(k, comms[which], names[which], wr);
    }
    mpiml::shm::set_mode(original);
    long any = failures;
    MPI_Allreduce(MPI_IN_PLACE, &any, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    if (wr == 0)
        std::printf("differential (torch): seed %llu, ops %ld..%ld on %d ranks: %s\n",
                    static_cast<unsigned long long>(seed_opt), first_opt, first_opt + ops_opt - 1, ws,
                    any ? "FAILED" : "all equal to the reference");
    MPI_Comm_free(&split);
    MPI_Comm_free(&dup);
    return any ? 1 : 0;
}
