// Run under mpirun with MPIML_PROFILE=DIR: no Session and no profile calls;
// MPI starts lazily and the profile is written inside MPI_Finalize at exit.
// With "--fork N": initializes MPI, then re-launches itself on N ranks with
// mpi_fork; the ranks' profile must survive this process's exit.
#include <mpiml/mpiml.hpp>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

int main(int argc, char** argv) {
    if (argc > 2 && std::strcmp(argv[1], "--fork") == 0) {
        mpiml::ensure_initialized();
        mpiml::mpi_fork(std::atoi(argv[2]));
    }
    const int rank = mpiml::proc_id();  // initializes MPI and, from the env, the profile
    if (!mpiml::profiling()) return 2;
    for (int epoch = 0; epoch < 3; ++epoch) {
        mpiml::Region e("epoch");
        {
            mpiml::Region r("compute");
            std::this_thread::sleep_for(std::chrono::milliseconds(5 * (rank + 1)));
        }
        (void)mpiml::mpi_avg(static_cast<double>(rank));
    }
    return 0;
}
