// Calls every public function of mpiml's core (no Session: MPI starts lazily
// and is finalized from atexit). Run alone, under mpirun -np 1 and -np 2, it
// must exit 0 with nothing on stderr (tests/run_public_api.sh).
#include <mpiml/mpiml.hpp>

#include <complex>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

namespace {

int failures = 0;
void expect(bool ok, const char* what) {
    if (!ok) {
        std::printf("FAILED: %s\n", what);
        ++failures;
    }
}

template <class T>
void every_integer_op(int n) {
    // Each (type, op) pair the integer-op table probes; results must be exact.
    const std::vector<T> x{static_cast<T>(200), static_cast<T>(5)};
    const auto mn = mpiml::mpi_op(x, mpiml::Op::min);
    const auto mx = mpiml::mpi_op(x, mpiml::Op::max);
    const auto s = mpiml::mpi_op(x, mpiml::Op::sum);
    const auto p = mpiml::mpi_op(x, mpiml::Op::prod);
    expect(mn == x && mx == x, "integer min/max of equal inputs");
    expect(s[1] == static_cast<T>(5 * n), "integer sum");
    T want = 1;
    for (int i = 0; i < n; ++i) want = static_cast<T>(want * static_cast<T>(5));
    expect(p[1] == want, "integer prod");
}

}  // namespace

int main() {
    expect(!mpiml::is_finalized(), "is_finalized before start");
    mpiml::ensure_initialized();
    expect(mpiml::is_initialized(), "is_initialized");
    const int rank = mpiml::proc_id();
    const int n = mpiml::num_procs();
    mpiml::install_failure_handlers();

    mpiml::set_timeout(120);
    expect(mpiml::timeout() == 120, "timeout");
    mpiml::set_check(true);
    expect(mpiml::check_enabled(), "check_enabled");

    every_integer_op<std::uint8_t>(n);
    every_integer_op<std::int8_t>(n);
    every_integer_op<std::uint16_t>(n);
    every_integer_op<std::int16_t>(n);
    every_integer_op<unsigned>(n);
    every_integer_op<int>(n);
    every_integer_op<unsigned long>(n);
    every_integer_op<long>(n);
    every_integer_op<unsigned long long>(n);
    every_integer_op<long long>(n);

    std::vector<double> a{1.0, 2.0, 3.0}, b(3);
    mpiml::allreduce(a, b, mpiml::Op::sum);
    expect(b[2] == 3.0 * n, "allreduce range");
    double one = 1.0, out = 0.0;
    mpiml::allreduce(one, out, mpiml::Op::max);
    expect(out == 1.0, "allreduce scalar");
    mpiml::allreduce(a, MPI_SUM);
    expect(a[0] == n, "allreduce in place with an MPI_Op");
    int k = rank;
    mpiml::allreduce(k, mpiml::Op::bor);
    bool flag = rank == 0;
    mpiml::allreduce(flag, mpiml::Op::lor);
    expect(flag, "logical or");
    std::vector<std::complex<double>> c{{1, 2}};
    mpiml::allreduce(c, mpiml::Op::sum);
    expect(c[0] == std::complex<double>(n, 2.0 * n), "complex sum");

    int root_value = rank == 0 ? 42 : 0;
    mpiml::broadcast(root_value);
    std::vector<float> bv(5, static_cast<float>(rank));
    mpiml::broadcast(bv, n - 1);
    std::string s = rank == 0 ? "hello" : "";
    mpiml::broadcast(s);
    expect(root_value == 42 && bv[4] == static_cast<float>(n - 1) && s == "hello", "broadcast");

    expect(mpiml::mpi_op(2.0, mpiml::Op::prod) == (n == 1 ? 2.0 : n == 2 ? 4.0 : 8.0), "mpi_op scalar");
    expect(mpiml::mpi_sum(1) == n, "mpi_sum");
    expect(mpiml::mpi_sum(std::vector<int>{1, 2})[1] == 2 * n, "mpi_sum range");
    expect(mpiml::mpi_avg(3) == 3.0, "mpi_avg");
    expect(mpiml::mpi_avg(std::vector<float>{2.f})[0] == 2.f, "mpi_avg range");
    mpiml::barrier();
    expect(mpiml::allgather(rank).size() == static_cast<std::size_t>(n), "allgather");
    const auto st = mpiml::mpi_statistics_scalar(std::vector<double>{1.0, 3.0}, true);
    expect(st.mean == 2.0 && st.count == 2u * n, "statistics");

    expect(std::string(mpiml::op_name(mpiml::Op::min)) == "min", "op_name");
    expect(std::string(mpiml::ReduceOp(MPI_MAX).name()) == "max", "ReduceOp::name");
    expect(std::string(mpiml::datatype_name(MPI_FLOAT)) == "float", "datatype_name");

    const auto cfg = mpiml::shm::config();
    mpiml::shm::set_mode(mpiml::shm::Mode::on);
    expect(mpiml::shm::takes_shared_path(1 << 20) || n == 1, "takes_shared_path");
    {
        mpiml::SharedBucket bucket(64 * sizeof(int));
        auto span = bucket.as_span<int>();
        for (int& v : span) v = 1;
        bucket.allreduce<int>(span.size(), mpiml::Op::sum);
        expect(span[63] == n, "SharedBucket::allreduce");
        auto f = bucket.as_span<float>();
        for (float& v : f) v = 2.f;
        bucket.average<float>(f.size());
        expect(f[0] == 2.f, "SharedBucket::average");
        mpiml::SharedBucket moved(std::move(bucket));
        expect(moved.size_bytes() == 64 * sizeof(int) && moved.comm() != MPI_COMM_NULL, "move");
    }
    mpiml::shm::set_mode(cfg.mode);

    const auto dir = std::filesystem::temp_directory_path() /
                     ("mpiml_public_api_" + std::to_string(::getpid()));
    std::string dir_s = dir.string();
    mpiml::broadcast(dir_s);
    mpiml::profile_start(dir_s);
    expect(mpiml::profiling() && mpiml::profile_dir() == dir_s, "profiling");
    {
        mpiml::Region r("region");
        mpiml::Region r2(std::string("named"));
        (void)mpiml::mpi_sum(1.0);
    }
    mpiml::profile_stop();
    {
        mpiml::Checkpointer ck(std::filesystem::path(dir_s) / "ckpt", {.keep = 1});
        mpiml::CheckpointState st;
        st.shared.put("x", 1.5).put_bytes("b", std::string("bytes"));
        st.per_rank.put("rank", rank);
        ck.save(1, st);
        ck.save(2, st);
        mpiml::CheckpointState in;
        const auto r = ck.load_latest(in);
        expect(r && r->step == 2 && r->world_size == n && in.shared.get<double>("x") == 1.5 &&
                   in.per_rank.get<int>("rank") == rank && ck.steps() == std::vector<std::int64_t>{2},
               "Checkpointer");
        mpiml::Checkpointer::wait_for_removals();
    }
    mpiml::barrier();
    if (rank == 0) std::filesystem::remove_all(dir);

    mpiml::msg("message", "public_api");
    mpiml::pprint("pprint");
    try {
        mpiml::detail::check_mpi(MPI_SUCCESS, "check_mpi");
        mpiml::allreduce(std::vector<int>(2), std::vector<int>(3), mpiml::Op::sum);
        expect(false, "size mismatch must throw");
    } catch (const mpiml::Error& e) {
        expect(e.call() == "mpiml::allreduce" && e.rank() == rank, "Error fields");
    }
    if (failures) return 1;
    if (rank == 0) std::printf("public_api: ok on %d rank(s)\n", n);
    return 0;  // MPI_Finalize runs from atexit
}
