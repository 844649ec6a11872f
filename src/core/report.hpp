// Where every rank is (report.cpp): the per-rank history of collectives, and
// the job-wide report of every rank's collective, history and stacks.
#pragma once

#include "core/call.hpp"

#include <mpiml/report.hpp>

#include <cstdint>
#include <string>

namespace mpiml::detail {

/// Starts this rank's report agent, collectively over MPI_COMM_WORLD (once;
/// without it a report holds this rank's section only). MPIML_REPORT=0: off.
void report_setup();

/// The history of collectives: entering one returns a token for leaving it.
std::uint64_t history_enter(const CallInfo& info, std::uint64_t seq);
void history_leave(std::uint64_t token);

/// "file:line" or "file:line in function"; "" without a site.
std::string site_text(const CallSite& site);

/// A watchdog's deadline passed on this rank (what: its abort line): asks
/// rank 0 for the job-wide report (rank 0's stderr and MPIML_REPORT_DIR);
/// rank 0 prints it once however many ranks ask, with their abort lines, and
/// ends the job. This rank ends it itself if rank 0 cannot be reached or has
/// not answered within about 4.2 s (the job ends within about 5 s).
[[noreturn]] void end_on_hang(const std::string& what);

/// mpiml-report: asks the job holding process pid (a rank, or a launcher
/// with ranks among its descendants) for a report; returns its text, or
/// throws mpiml::Error saying why not.
std::string request_report_of(int pid, const std::string& reason);

}  // namespace mpiml::detail
