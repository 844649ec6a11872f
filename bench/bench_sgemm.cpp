// The BLAS's rate for mpiml-ppo's largest product: [rows x 64] by [64 x 64]
// (cblas_sgemm, as the update calls it), best of 7 rounds, in GFLOP/s.
//   bench_sgemm [rows]     (default 4000; run with OPENBLAS_NUM_THREADS=1 for one core)
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

int main(int argc, char** argv) {
    const int n = argc > 1 ? std::atoi(argv[1]) : 4000, k = 64, m = 64;
    if (n < 1) {
        std::fprintf(stderr, "bench_sgemm: rows must be at least 1\n");
        return 2;
    }
    std::vector<float> a(static_cast<std::size_t>(n) * k, 0.5f), w(k * m, 0.25f),
        c(static_cast<std::size_t>(n) * m);
    double best = 1e30;
    for (int round = 0; round < 7; ++round) {
        const int reps = 100;
        const auto t0 = std::chrono::steady_clock::now();
        for (int r = 0; r < reps; ++r)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, m, k, 1.0f, a.data(), k,
                        w.data(), k, 0.0f, c.data(), m);
        const std::chrono::duration<double> dt = std::chrono::steady_clock::now() - t0;
        best = std::min(best, dt.count() / reps);
    }
    std::printf("%.2f\n", 2.0 * n * k * m / best * 1e-9);
    return 0;
}
