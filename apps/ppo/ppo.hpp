// Data-parallel PPO (Spinning Up's ppo.py) on mpiml and LibTorch.
#pragma once

#include "config.hpp"

#include <string>

namespace ppo {

/// Trains with cfg on every rank of the running MPI job (MPI must be usable;
/// call after mpi_fork). Rank 0 prints a table per epoch and writes
/// cfg.out/{progress.txt, config.json, policy.pt, learning_curve.svg}.
/// Returns 0.
int train(Config cfg);

struct TestOptions {
    std::string dir;  ///< a training output folder
    int episodes = 10;
    bool deterministic = false;  ///< argmax / mean action instead of sampling
    int seed = 0;
};

/// Loads dir/config.json and dir/policy.pt, runs episodes in one process and
/// prints each return. Returns 0.
int test_policy(const TestOptions& opts);

}  // namespace ppo
