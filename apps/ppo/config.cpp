#include "config.hpp"

#include <nlohmann/json.hpp>

namespace ppo {

std::string to_json(const Config& c) {
    nlohmann::ordered_json j;
    j["algo"] = c.algo;
    j["env"] = c.env;
    j["seed"] = c.seed;
    j["cpu"] = c.cpu;
    j["num_procs"] = c.num_procs;
    j["epochs"] = c.epochs;
    j["steps_per_epoch"] = c.steps_per_epoch;
    j["gamma"] = c.gamma;
    j["clip_ratio"] = c.clip_ratio;
    j["pi_lr"] = c.pi_lr;
    j["vf_lr"] = c.vf_lr;
    j["train_pi_iters"] = c.train_pi_iters;
    j["train_v_iters"] = c.train_v_iters;
    j["lam"] = c.lam;
    j["max_ep_len"] = c.max_ep_len;
    j["target_kl"] = c.target_kl;
    j["ac_kwargs"] = {{"hidden_sizes", c.hidden}, {"activation", c.activation}};
    j["save_freq"] = c.save_freq;
    j["checkpoint_every"] = c.checkpoint_every;
    if (c.stop_at_return)
        j["stop_at_return"] = *c.stop_at_return;
    else
        j["stop_at_return"] = nullptr;
    j["output_dir"] = c.out;
    return j.dump(4) + "\n";
}

Config config_from_json(const std::string& text) {
    const auto j = nlohmann::json::parse(text);
    Config c;
    auto get = [&](const char* key, auto& field) {
        if (j.contains(key) && !j[key].is_null()) j[key].get_to(field);
    };
    get("algo", c.algo);
    get("env", c.env);
    get("seed", c.seed);
    get("cpu", c.cpu);
    get("num_procs", c.num_procs);
    get("epochs", c.epochs);
    get("steps_per_epoch", c.steps_per_epoch);
    get("gamma", c.gamma);
    get("clip_ratio", c.clip_ratio);
    get("pi_lr", c.pi_lr);
    get("vf_lr", c.vf_lr);
    get("train_pi_iters", c.train_pi_iters);
    get("train_v_iters", c.train_v_iters);
    get("lam", c.lam);
    get("max_ep_len", c.max_ep_len);
    get("target_kl", c.target_kl);
    get("save_freq", c.save_freq);
    get("checkpoint_every", c.checkpoint_every);
    get("output_dir", c.out);
    if (j.contains("stop_at_return") && !j["stop_at_return"].is_null()) {
        c.stop_at_return = j["stop_at_return"].get<double>();
    }
    if (j.contains("ac_kwargs")) {
        const auto& ac = j["ac_kwargs"];
        if (ac.contains("hidden_sizes")) ac["hidden_sizes"].get_to(c.hidden);
        if (ac.contains("activation")) ac["activation"].get_to(c.activation);
    }
    return c;
}

}  // namespace ppo
