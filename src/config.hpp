// mpiml's configuration from MPIML_* environment variables: read and validated
// in one place (config.cpp) at initialization, one parser per kind.
#pragma once

#include <mpiml/shm.hpp>

#include <cstddef>
#include <optional>
#include <string>

namespace mpiml::detail {

struct EnvConfig {
    std::optional<bool> check;      // MPIML_CHECK
    std::optional<double> timeout;  // MPIML_TIMEOUT, seconds
    shm::Config shm;                // MPIML_SHM, MPIML_SHM_*THRESHOLD, MPIML_SHM_CHUNK, MPIML_NODE_SPLIT
    std::string profile_dir;        // MPIML_PROFILE
    bool profile_clock_measure = false;  // MPIML_PROFILE_CLOCK=measure
};

/// Reads every variable; throws mpiml::Error naming the first malformed one.
EnvConfig read_env_config();
/// The configuration read at initialization (read then, or on first use).
const EnvConfig& env_config();
/// Reads it again (at initialization).
void load_env_config();

/// The words every boolean variable takes: 1/on/true/yes, 0/off/false/no.
bool parse_bool(const char* name, const std::string& v);
/// Byte counts: 65536, 64K/64KiB, 4M/4MiB, 1G/1GiB.
std::size_t parse_bytes(const char* name, const std::string& v);
/// Seconds: a finite number >= 0.
double parse_seconds(const char* name, const std::string& v);

/// MPIML_PROFILE_CLOCK as set now (profiles may start long after
/// initialization, and tests set it then); validated like the rest.
bool profile_clock_measure();

}  // namespace mpiml::detail
