#include <mpiml/mpiml.hpp>

#include <cstdio>
#include <vector>

int main() {
    const int n = mpiml::num_procs();
    const std::vector<double> x = {1.0 * mpiml::proc_id(), 2.0};
    const auto s = mpiml::mpi_sum(x);
    const auto st = mpiml::mpi_statistics_scalar(x);
    const bool ok = s[0] == n * (n - 1) / 2.0 && s[1] == 2.0 * n && st.count == 2u * n;
    mpiml::pprint(ok ? "consumer: ok" : "consumer: WRONG RESULT");
    return ok ? 0 : 1;
}
