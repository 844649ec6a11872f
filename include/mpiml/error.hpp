// mpiml::Error: every MPI failure and every misuse becomes one of these.
#pragma once

#include <stdexcept>
#include <string>

namespace mpiml {

/// Thrown for MPI errors and invalid calls. The message names the call, the
/// rank (as "rank R/N") and, for MPI errors, MPI's own error string.
class Error : public std::runtime_error {
public:
    Error(std::string call, std::string what, int mpi_code = 0);

    const std::string& call() const noexcept { return call_; }
    int rank() const noexcept { return rank_; }      ///< -1 when MPI is not running
    int mpi_code() const noexcept { return mpi_code_; }  ///< 0 when not an MPI error

private:
    std::string call_;
    int rank_ = -1;
    int mpi_code_ = 0;
};

namespace detail {
/// Throws mpiml::Error when rc is not MPI_SUCCESS.
void check_mpi(int rc, const char* call);
[[noreturn]] void fail(const char* call, const std::string& what);
/// "rank R/N", or "rank ?" before MPI_Init / after MPI_Finalize.
std::string rank_tag();
}  // namespace detail

}  // namespace mpiml
