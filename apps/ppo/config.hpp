// mpiml-ppo's settings: Spinning Up's PPO defaults, saved as config.json.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace ppo {

struct Config {
    std::string algo = "ppo";  ///< "ppo" or "vpg" (Spinning Up's VPG: one policy step per epoch)
    std::string env = "CartPole-v1";
    int seed = 0;
    int cpu = 1;
    int epochs = 50;
    int steps_per_epoch = 4000;
    double gamma = 0.99;
    double clip_ratio = 0.2;
    double pi_lr = 3e-4;
    double vf_lr = 1e-3;
    int train_pi_iters = 80;
    int train_v_iters = 80;
    double lam = 0.97;
    int max_ep_len = 1000;
    double target_kl = 0.01;
    std::vector<int> hidden = {64, 64};
    std::string activation = "tanh";
    int save_freq = 10;
    std::optional<double> stop_at_return;  ///< stop once AverageEpRet reaches it
    std::string out;  ///< output folder
    std::string profile;  ///< profile folder (mpiml::profile_start); empty: off
    int checkpoint_every = 1;  ///< epochs between checkpoints in out/checkpoints; 0: none
    /// "" (start fresh unless this is a restart), "auto" (the newest good
    /// checkpoint in out/checkpoints, if any), or a checkpoints folder or one
    /// checkpoint's step folder.
    std::string resume;
    int num_procs = 1;  ///< filled in at run time
};

std::string to_json(const Config& c);
/// Reads a config.json written by to_json; unknown keys are ignored.
Config config_from_json(const std::string& text);

}  // namespace ppo
