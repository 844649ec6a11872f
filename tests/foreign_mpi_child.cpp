// Another MPI library in the process (MPICH's beside Open MPI, or the
// reverse, as an mpi4py built for the other MPI brings it): mpiml refuses to
// start, naming both libraries, before any call into MPI; the rank then ends
// normally (its exit does not start MPI either). Exit 77: the other MPI is
// not installed.
#include <dlfcn.h>
#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <string>

#include <mpiml/mpiml.hpp>

int main() {
    char version[MPI_MAX_LIBRARY_VERSION_STRING] = "";
    int len = 0;
    MPI_Get_library_version(version, &len);  // allowed before MPI_Init
    const bool open_mpi = std::strstr(version, "Open MPI") != nullptr;
    const char* other = open_mpi ? "libmpich.so.12" : "libmpi.so.40";
    if (!::dlopen(other, RTLD_NOW | RTLD_LOCAL)) {
        std::printf("foreign_mpi_child: %s is not installed\n", other);
        return 77;
    }
    try {
        mpiml::Session session;
        std::fprintf(stderr, "FAIL: mpiml started MPI beside %s\n", other);
        return 1;
    } catch (const mpiml::Error& e) {
        const std::string what = e.what();
        for (const char* part : {"mpiml::Session on rank ?: this process has two MPI libraries, mpiml's ",
                                 open_mpi ? "libmpi.so.40" : "libmpich.so.12", other, "cmake -DMPI_CXX_COMPILER"}) {
            if (what.find(part) == std::string::npos) {
                std::fprintf(stderr, "FAIL: no \"%s\" in: %s\n", part, what.c_str());
                return 1;
            }
        }
        if (mpiml::is_initialized()) {
            std::fprintf(stderr, "FAIL: MPI was started\n");
            return 1;
        }
        std::printf("foreign_mpi_child: ok: %s\n", what.c_str());
    }
    return 0;
}
