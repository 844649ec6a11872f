// Where every rank is: one report of every rank's host, pid, collective in
// progress, recent collectives and stacks (docs/DEBUGGING.md).
#pragma once

#include <source_location>
#include <string>
#include <string_view>

namespace mpiml {

/// Asks for the job-wide report now and waits for it (a few seconds at most):
/// rank 0 prints it to its stderr and writes it into MPIML_REPORT_DIR
/// (default ./mpiml-reports). Returns the report's text, or this rank's own
/// section when the other ranks cannot be reached. Any rank, any thread, not
/// collective: the job goes on.
std::string report(std::string_view reason = "requested by the program");

namespace detail {

/// Where a collective is called from.
struct CallSite {
    const char* file = nullptr;      // must outlive the process's use of it
    unsigned line = 0;
    const char* function = nullptr;  // optional
};

/// Sets this thread's call site for the collectives run while it lives,
/// unless an enclosing SiteMark already did (the outermost call wins).
class SiteMark {
public:
    explicit SiteMark(const CallSite& site) noexcept;
    explicit SiteMark(const std::source_location& loc) noexcept
        : SiteMark(CallSite{loc.file_name(), loc.line(), nullptr}) {}
    ~SiteMark();
    SiteMark(const SiteMark&) = delete;
    SiteMark& operator=(const SiteMark&) = delete;

private:
    bool set_ = false;
};

/// This thread's call site (file null when none is set).
CallSite current_site() noexcept;

/// Registers the function that writes this process's Python stacks to a file
/// descriptor (the Python package does, at import).
void set_python_stacks(void (*fn)(int fd));

}  // namespace detail
}  // namespace mpiml
