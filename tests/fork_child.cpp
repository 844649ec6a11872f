// Test program for mpi_fork: fork_child <n> <out-prefix> <exit-code> [--init-first] [args...]
// Each rank writes <out-prefix>.<rank>: the world size, the environment the
// fork promises, then every argument after argv[0] in hex, one per line.
#include <mpiml/mpiml.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <string>

static std::string hex(const char* s) {
    static const char* digits = "0123456789abcdef";
    std::string out;
    for (const unsigned char* p = reinterpret_cast<const unsigned char*>(s); *p; ++p) {
        out += digits[*p >> 4];
        out += digits[*p & 15];
    }
    return out;
}

int main(int argc, char** argv) {
    if (argc < 4) {
        std::fprintf(stderr, "usage: fork_child <n> <out-prefix> <exit-code> [--init-first] [args...]\n");
        return 2;
    }
    const int n = std::atoi(argv[1]);
    const int code = std::atoi(argv[3]);
    if (argc > 4 && std::strcmp(argv[4], "--init-first") == 0) mpiml::ensure_initialized();
    try {
        mpiml::mpi_fork(n);
    } catch (const mpiml::Error& e) {
        std::fprintf(stderr, "fork_child: %s\n", e.what());
        return 3;
    }
    const int rank = mpiml::proc_id();
    const int size = mpiml::num_procs();
    std::ofstream out(std::string(argv[2]) + "." + std::to_string(rank));
    auto env = [](const char* k) { const char* v = std::getenv(k); return std::string(v ? v : "-"); };
    out << size << "\n" << env("IN_MPI") << " " << env("OMP_NUM_THREADS") << " "
        << env("MKL_NUM_THREADS") << "\n";
    for (int i = 1; i < argc; ++i) out << "[" << hex(argv[i]) << "]\n";
    out.close();
    mpiml::barrier();
    return rank == size - 1 ? code : 0;
}
