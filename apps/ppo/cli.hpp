// mpiml-ppo's command-line checks, with errors as a person would write them
// ("--cpu must be at least 1, got 0"), and --cpu auto.
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

namespace ppo::cli {

/// A whole number of at least lo.
CLI::Validator whole_at_least(long lo);
/// A number in [lo, hi] (open at an end when the flag says so).
CLI::Validator number_in(double lo, double hi, bool lo_open = false, bool hi_open = false);
/// One of names.
CLI::Validator one_of(std::vector<std::string> names);
/// An existing folder.
CLI::Validator existing_folder();
/// --resume: auto, or an existing folder.
CLI::Validator auto_or_folder();
/// --cpu: a whole number of at least 1, or auto.
CLI::Validator ranks();

/// Cores of this node this process may run on (hardware threads of one core
/// count once); at least 1.
int node_cores();

/// "NAME: message" of a CLI11 validation error as "NAME message", prefixed
/// with the program's name, and a pointer to --help.
std::string failure_message(const CLI::App* app, const CLI::Error& e);

}  // namespace ppo::cli
