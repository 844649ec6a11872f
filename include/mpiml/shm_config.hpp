// The shared-memory path's settings (MPIML_SHM*, read with every other
// variable at initialization); the functions that read and change them are in
// <mpiml/shm.hpp>.
#pragma once

#include <cstddef>

namespace mpiml::shm {

enum class Mode { automatic, on, off };

struct Config {
    Mode mode = Mode::automatic;
    std::size_t allreduce_threshold = 0;  ///< bytes; auto mode
    std::size_t broadcast_threshold = 0;  ///< bytes; auto mode
    std::size_t chunk = 0;                ///< bytes per pipeline stage
    int node_split = 0;                   ///< 0: real nodes
};

}  // namespace mpiml::shm
