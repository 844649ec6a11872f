// Run under mpirun with MPIML_PROFILE=DIR: no Session and no profile calls;
// MPI starts lazily and the profile is written inside MPI_Finalize at exit.
#include <mpiml/mpiml.hpp>

#include <chrono>
#include <thread>

int main() {
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
