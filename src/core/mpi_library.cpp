// One MPI library a process. Two MPIs in one process (mpiml built against
// MPICH, mpi4py against Open MPI, or the reverse) share no state: the second
// to start crashes, or starts as a job of one rank and gives wrong results.
#include <dlfcn.h>
#include <link.h>

#include <cctype>
#include <climits>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/state.hpp"
#include <mpiml/error.hpp>

namespace mpiml::detail {
namespace {

std::string real_path(const char* p) {
    char buf[PATH_MAX];
    return ::realpath(p, buf) ? std::string(buf) : std::string(p);
}

// The object that defines MPI_Init in the scope of the loaded object `name`
// (itself or a library it needs), or "".
std::string mpi_of(const char* name) {
    void* h = ::dlopen(name, RTLD_LAZY | RTLD_NOLOAD);
    if (!h) return {};
    std::string lib;
    Dl_info where{};
    if (void* sym = ::dlsym(h, "MPI_Init"); sym && ::dladdr(sym, &where) && where.dli_fname)
        lib = real_path(where.dli_fname);
    ::dlclose(h);
    return lib;
}

// Every MPI's library has "mpi" in its name (libmpi, libmpich, libmpi_cray;
// mpi4py's MPI.*.so): only those are looked into, the rest cost time.
bool may_be_mpi(const std::string& path) {
    std::string base = path.substr(path.rfind('/') + 1);
    for (auto& c : base) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return base.find("mpi") != std::string::npos;
}

}  // namespace

std::string other_mpi_library() {
    std::vector<std::string> names;  // dlopen may not run inside dl_iterate_phdr
    ::dl_iterate_phdr(
        [](dl_phdr_info* info, std::size_t, void* out) {
            if (info->dlpi_name && *info->dlpi_name && may_be_mpi(info->dlpi_name))
                static_cast<std::vector<std::string>*>(out)->push_back(info->dlpi_name);
            return 0;
        },
        &names);
    Dl_info self{};
    std::string ours;
    if (::dladdr(reinterpret_cast<void*>(&other_mpi_library), &self) && self.dli_fname)
        ours = mpi_of(self.dli_fname);
    for (const auto& name : names) {
        const std::string lib = mpi_of(name.c_str());
        if (lib.empty()) continue;
        if (ours.empty()) ours = lib;  // mpiml linked into the program: the first MPI found
        if (lib == ours) continue;
        const std::string user = real_path(name.c_str());
        // No call into either MPI here: their symbols may resolve to the other's.
        return "this process has two MPI libraries, mpiml's " + ours + " and " + lib +
               (user != lib ? " (needed by " + user + ")" : "") +
               ", which share no state: the second to start MPI crashes or runs as a job of one rank. Use "
               "one MPI: mpiml built against the other (cmake -DMPI_CXX_COMPILER=...), or that library "
               "against mpiml's (mpi4py: MPICC=<mpiml's mpicc> pip install --no-binary mpi4py mpi4py)";
    }
    return {};
}

void check_one_mpi_library(const char* call) {
    if (std::string other = other_mpi_library(); !other.empty()) fail(call, other);
}

}  // namespace mpiml::detail
