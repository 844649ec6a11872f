// The one translation unit of mpiml-ppo that includes LibTorch.
#include "ppo.hpp"

#include "envs.hpp"
#include "gae.hpp"
#include "logger.hpp"
#include "plot.hpp"

#include <mpiml/collectives.hpp>
#include <mpiml/print.hpp>
#include <mpiml/profile.hpp>
#include <mpiml/session.hpp>
#include <mpiml/stats.hpp>
#include <mpiml/torch.hpp>

#include <fmt/format.h>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <numbers>
#include <optional>
#include <sstream>
#include <stdexcept>

namespace ppo {

namespace {

namespace nn = torch::nn;
using torch::Tensor;

// ------------------------------------------------------------ actor-critic

/// Spinning Up's mlp(): Linear layers with the activation between them and
/// none after the last.
nn::Sequential mlp(const std::vector<int64_t>& sizes, const std::string& activation) {
    nn::Sequential seq;
    for (std::size_t j = 0; j + 1 < sizes.size(); ++j) {
        seq->push_back(nn::Linear(sizes[j], sizes[j + 1]));
        if (j + 2 < sizes.size()) {
            if (activation == "tanh")
                seq->push_back(nn::Tanh());
            else if (activation == "relu")
                seq->push_back(nn::ReLU());
            else
                throw std::invalid_argument("unknown activation '" + activation +
                                            "' (tanh or relu)");
        }
    }
    return seq;
}

std::vector<int64_t> layer_sizes(int in, const std::vector<int>& hidden, int out) {
    std::vector<int64_t> s{in};
    s.insert(s.end(), hidden.begin(), hidden.end());
    s.push_back(out);
    return s;
}

/// The policy: categorical over logits_net(obs), or Gaussian with mean
/// mu_net(obs) and a state-independent log_std (initialized to -0.5).
/// Parameter names follow Spinning Up's MLPActorCritic.
struct ActorImpl : nn::Module {
    ActorImpl(int obs_dim, const ActionSpace& space, const std::vector<int>& hidden,
              const std::string& activation)
        : discrete(space.discrete) {
        if (discrete) {
            net = register_module("logits_net",
                                  mlp(layer_sizes(obs_dim, hidden, space.n), activation));
        } else {
            net = register_module("mu_net",
                                  mlp(layer_sizes(obs_dim, hidden, space.dim), activation));
            log_std = register_parameter("log_std", torch::full({space.dim}, -0.5));
        }
    }

    /// The policy's distribution at obs ([obs_dim], or [N, obs_dim] for a batch).
    struct Dist {
        Tensor logits_or_mu;  ///< log-softmax (discrete) or mean (Gaussian)
        Tensor log_std;
    };
    Dist distribution(const Tensor& obs) {
        if (discrete) return {torch::log_softmax(net->forward(obs), -1), {}};
        return {net->forward(obs), log_std};
    }
    /// Log-probability of act: [N] (int64, discrete) or [N, act_dim] for a batch.
    Tensor log_prob(const Dist& d, const Tensor& act) const {
        if (discrete) return d.logits_or_mu.gather(-1, act.unsqueeze(-1)).squeeze(-1);
        const Tensor z = (act - d.logits_or_mu) * torch::exp(-d.log_std);
        return (-0.5 * z * z - d.log_std - 0.5 * std::log(2.0 * std::numbers::pi)).sum(-1);
    }
    /// Mean entropy over the batch (and over action dimensions, as Spinning Up).
    Tensor entropy(const Dist& d) const {
        if (discrete) return -(d.logits_or_mu.exp() * d.logits_or_mu).sum(-1).mean();
        return (0.5 + 0.5 * std::log(2.0 * std::numbers::pi) + d.log_std).mean();
    }
    Tensor sample(const Dist& d, bool deterministic) const {
        if (discrete)
            return deterministic ? d.logits_or_mu.argmax(-1)
                                 : torch::multinomial(d.logits_or_mu.exp(), 1).squeeze(-1);
        if (deterministic) return d.logits_or_mu;
        return d.logits_or_mu + torch::exp(d.log_std) * torch::randn_like(d.logits_or_mu);
    }

    bool discrete;
    nn::Sequential net{nullptr};
    Tensor log_std;
};
TORCH_MODULE(Actor);

struct CriticImpl : nn::Module {
    CriticImpl(int obs_dim, const std::vector<int>& hidden, const std::string& activation)
        : v_net(register_module("v_net", mlp(layer_sizes(obs_dim, hidden, 1), activation))) {}
    Tensor forward(const Tensor& obs) { return v_net->forward(obs).squeeze(-1); }
    nn::Sequential v_net;
};
TORCH_MODULE(Critic);

struct ActorCriticImpl : nn::Module {
    ActorCriticImpl(int obs_dim, const ActionSpace& space, const std::vector<int>& hidden,
                    const std::string& activation)
        : pi(register_module("pi", Actor(obs_dim, space, hidden, activation))),
          v(register_module("v", Critic(obs_dim, hidden, activation))) {}
    Actor pi;
    Critic v;
};
TORCH_MODULE(ActorCritic);

/// One action for one observation, with its log-probability and V(obs).
struct StepOut {
    std::vector<float> action;
    double logp = 0.0;
    double v = 0.0;
};

StepOut act(ActorCritic& ac, const std::vector<float>& obs, bool deterministic = false) {
    torch::NoGradGuard no_grad;
    const Tensor o = torch::from_blob(const_cast<float*>(obs.data()),
                                      {static_cast<int64_t>(obs.size())}, torch::kFloat);
    const auto d = ac->pi->distribution(o);
    const Tensor a = ac->pi->sample(d, deterministic);
    StepOut out;
    out.logp = ac->pi->log_prob(d, a).item<double>();
    out.v = ac->v->forward(o).item<double>();
    if (ac->pi->discrete) {
        out.action = {static_cast<float>(a.item<int64_t>())};
    } else {
        const Tensor ac_f = a.contiguous();
        out.action.assign(ac_f.data_ptr<float>(), ac_f.data_ptr<float>() + ac_f.numel());
    }
    return out;
}

double value(ActorCritic& ac, const std::vector<float>& obs) {
    torch::NoGradGuard no_grad;
    const Tensor o = torch::from_blob(const_cast<float*>(obs.data()),
                                      {static_cast<int64_t>(obs.size())}, torch::kFloat);
    return ac->v->forward(o).item<double>();
}

// ------------------------------------------------------------------ buffer

/// Spinning Up's PPOBuffer: trajectories of one epoch on this rank, with
/// GAE-lambda advantages and rewards-to-go computed as each path finishes.
class PPOBuffer {
public:
    PPOBuffer(int obs_dim, int act_dim, bool discrete, int size, double gamma, double lam)
        : obs_dim_(obs_dim), act_dim_(act_dim), discrete_(discrete), size_(size), gamma_(gamma),
          lam_(lam) {
        obs_.reserve(static_cast<std::size_t>(size) * obs_dim);
        act_.reserve(static_cast<std::size_t>(size) * act_dim);
    }

    void store(const std::vector<float>& obs, const std::vector<float>& act, double rew,
               double val, double logp) {
        if (static_cast<int>(rew_.size()) >= size_) throw std::logic_error("PPOBuffer is full");
        obs_.insert(obs_.end(), obs.begin(), obs.end());
        act_.insert(act_.end(), act.begin(), act.end());
        rew_.push_back(rew);
        val_.push_back(val);
        logp_.push_back(logp);
    }

    /// Ends the current path; last_val is 0 if the episode terminated, else
    /// V(s_T) to bootstrap the cut-off rewards.
    void finish_path(double last_val) {
        const std::size_t start = path_start_, end = rew_.size();
        adv_.resize(end);
        ret_.resize(end);
        gae_lambda(rew_.data() + start, val_.data() + start, end - start, last_val, gamma_, lam_,
                   adv_.data() + start, ret_.data() + start);
        path_start_ = end;
    }

    struct Batch {
        Tensor obs, act, ret, adv, logp;
    };

    /// Collective: the epoch's data with advantages normalized by the mean
    /// and std pooled over all ranks; empties the buffer.
    Batch get() {
        if (static_cast<int>(rew_.size()) != size_ || path_start_ != rew_.size())
            throw std::logic_error("PPOBuffer::get before the epoch's paths are finished");
        const auto st = mpiml::mpi_statistics_scalar(adv_);
        const int64_t n = size_;
        Batch b;
        b.obs = torch::from_blob(obs_.data(), {n, obs_dim_}, torch::kFloat).clone();
        if (discrete_)
            b.act = torch::from_blob(act_.data(), {n}, torch::kFloat).to(torch::kLong);
        else
            b.act = torch::from_blob(act_.data(), {n, act_dim_}, torch::kFloat).clone();
        b.ret = torch::tensor(ret_, torch::kDouble).to(torch::kFloat);
        b.adv = ((torch::tensor(adv_, torch::kDouble) - st.mean) / (st.std + 1e-8))
                    .to(torch::kFloat);
        b.logp = torch::tensor(logp_, torch::kDouble).to(torch::kFloat);
        obs_.clear(), act_.clear(), rew_.clear(), val_.clear(), logp_.clear();
        adv_.clear(), ret_.clear();
        path_start_ = 0;
        return b;
    }

private:
    int obs_dim_, act_dim_;
    bool discrete_;
    int size_;
    double gamma_, lam_;
    std::vector<float> obs_, act_;
    std::vector<double> rew_, val_, logp_, adv_, ret_;
    std::size_t path_start_ = 0;
};

// ------------------------------------------------------------------ output

struct Column {
    const char* key;
    const char* label;
    int width;
};

const Column table_columns[] = {
    {"Epoch", "Epoch", 5},           {"AverageEpRet", "AvgEpRet", 9},
    {"StdEpRet", "StdEpRet", 9},     {"MaxEpRet", "MaxEpRet", 9},
    {"MinEpRet", "MinEpRet", 9},     {"EpLen", "EpLen", 7},
    {"AverageVVals", "VVals", 8},    {"TotalEnvInteracts", "TotalEnvInt", 11},
    {"LossPi", "LossPi", 10},        {"LossV", "LossV", 9},
    {"Entropy", "Entropy", 7},       {"KL", "KL", 10},
    {"ClipFrac", "ClipFrac", 8},     {"StopIter", "StopIter", 8},
    {"Time", "Time", 7},             {"steps/s", "steps/s", 8},
};

std::string table_header() {
    std::string s;
    for (const auto& c : table_columns) s += fmt::format("{:>{}} ", c.label, c.width);
    s.pop_back();
    return s;
}

std::string table_row(const EpochLogger& log, double steps_per_s) {
    std::string s;
    for (const auto& c : table_columns) {
        const std::string key = c.key;
        const double v = key == "steps/s" ? steps_per_s : log.get(key);
        if (key == "Epoch" || key == "TotalEnvInteracts" || key == "steps/s")
            s += fmt::format("{:>{}.0f} ", v, c.width);
        else if (key == "Time")
            s += fmt::format("{:>{}.1f} ", v, c.width);
        else
            s += fmt::format("{:>{}.4g} ", v, c.width);
    }
    s.pop_back();
    return s;
}

void save_policy(ActorCritic& ac, const std::string& dir) {
    const auto path = std::filesystem::path(dir) / "policy.pt";
    const auto tmp = std::filesystem::path(dir) / "policy.pt.tmp";
    torch::save(ac, tmp.string());
    std::filesystem::rename(tmp, path);  // never leave a half-written policy
}

void write_plot(const EpochLogger& log, const Config& cfg) {
    PlotOptions po;
    po.title = plot_title(cfg);
    log.save_text("learning_curve.svg", learning_curve_svg(log.progress(), po));
}

}  // namespace

// ------------------------------------------------------------------- train

int train(Config cfg) {
    mpiml::setup_pytorch_for_mpi();
    if (!cfg.profile.empty()) mpiml::profile_start(cfg.profile);
    const int rank = mpiml::proc_id();
    cfg.num_procs = mpiml::num_procs();
    if (cfg.steps_per_epoch < cfg.num_procs)
        throw std::invalid_argument("--steps-per-epoch must be at least the number of ranks");

    EpochLogger logger(cfg.out);
    logger.save_text("config.json", to_json(cfg));

    // Each rank explores differently.
    const std::uint64_t seed = static_cast<std::uint64_t>(cfg.seed) + 10000u * rank;
    torch::manual_seed(seed);
    auto env = make_env(cfg.env);
    env->seed(seed);

    const ActionSpace space = env->action_space();
    const int obs_dim = env->obs_dim();
    const int act_dim = space.discrete ? 1 : space.dim;
    ActorCritic ac(obs_dim, space, cfg.hidden, cfg.activation);
    {
        mpiml::Region r("sync_params");
        mpiml::sync_params(ac);
    }

    int64_t n_params = 0;
    for (const auto& p : ac->parameters()) n_params += p.numel();
    mpiml::pprint(fmt::format("mpiml-ppo: {} on {} rank{}, {} parameters, output in {}", cfg.env,
                              cfg.num_procs, cfg.num_procs == 1 ? "" : "s", n_params,
                              cfg.out.empty() ? "(none)" : cfg.out));

    const int local_steps = cfg.steps_per_epoch / cfg.num_procs;
    PPOBuffer buf(obs_dim, act_dim, space.discrete, local_steps, cfg.gamma, cfg.lam);
    torch::optim::Adam pi_opt(ac->pi->parameters(), torch::optim::AdamOptions(cfg.pi_lr));
    torch::optim::Adam vf_opt(ac->v->parameters(), torch::optim::AdamOptions(cfg.vf_lr));

    auto compute_loss_pi = [&](const PPOBuffer::Batch& b, double& kl, double& ent, double& cf) {
        const auto d = ac->pi->distribution(b.obs);
        const Tensor logp = ac->pi->log_prob(d, b.act);
        const Tensor ratio = torch::exp(logp - b.logp);
        const Tensor clip_adv =
            torch::clamp(ratio, 1 - cfg.clip_ratio, 1 + cfg.clip_ratio) * b.adv;
        const Tensor loss = -torch::min(ratio * b.adv, clip_adv).mean();
        torch::NoGradGuard no_grad;
        kl = (b.logp - logp).mean().item<double>();
        ent = ac->pi->entropy(d).item<double>();
        cf = ((ratio > 1 + cfg.clip_ratio) | (ratio < 1 - cfg.clip_ratio))
                 .to(torch::kFloat)
                 .mean()
                 .item<double>();
        return loss;
    };
    auto compute_loss_v = [&](const PPOBuffer::Batch& b) {
        return (ac->v->forward(b.obs) - b.ret).pow(2).mean();
    };

    auto update = [&] {
        mpiml::Region update_region("update");
        const auto b = [&] {
            mpiml::Region r("advantage");  // normalization, pooled over ranks
            return buf.get();
        }();
        double kl_old, ent_old, cf_old;
        double pi_l_old, v_l_old;
        {
            torch::NoGradGuard no_grad;
            pi_l_old = compute_loss_pi(b, kl_old, ent_old, cf_old).item<double>();
            v_l_old = compute_loss_v(b).item<double>();
        }
        double kl = 0, ent = 0, cf = 0;
        Tensor loss_pi;
        int i = 0;
        std::optional<mpiml::Region> phase(std::in_place, "policy_update");
        for (i = 0; i < cfg.train_pi_iters; ++i) {
            pi_opt.zero_grad();
            loss_pi = compute_loss_pi(b, kl, ent, cf);
            // Averaged over ranks, so every rank takes the same decision.
            const double kl_avg = mpiml::mpi_avg(torch::tensor(kl, torch::kDouble)).item<double>();
            if (kl_avg > 1.5 * cfg.target_kl) break;
            loss_pi.backward();
            mpiml::mpi_avg_grads(ac->pi);
            pi_opt.step();
        }
        if (i == cfg.train_pi_iters) i = std::max(0, cfg.train_pi_iters - 1);
        logger.store("StopIter", i);
        phase.emplace("value_update");
        Tensor loss_v;
        for (int j = 0; j < cfg.train_v_iters; ++j) {
            vf_opt.zero_grad();
            loss_v = compute_loss_v(b);
            loss_v.backward();
            mpiml::mpi_avg_grads(ac->v);
            vf_opt.step();
        }
        phase.reset();
        logger.store("LossPi", pi_l_old);
        logger.store("LossV", v_l_old);
        logger.store("KL", kl);
        logger.store("Entropy", ent_old);
        logger.store("ClipFrac", cf);
        logger.store("DeltaLossPi", loss_pi.defined() ? loss_pi.item<double>() - pi_l_old : 0.0);
        logger.store("DeltaLossV", loss_v.defined() ? loss_v.item<double>() - v_l_old : 0.0);
    };

    using clock = std::chrono::steady_clock;
    const auto start = clock::now();
    auto o = env->reset();
    double ep_ret = 0;
    int ep_len = 0;
    mpiml::pprint(table_header());
    double rollout_s = 0, update_s = 0;
    int64_t total_steps = 0;
    for (int epoch = 0; epoch < cfg.epochs; ++epoch) {
        mpiml::Region epoch_region("epoch");
        const auto epoch_start = clock::now();
        std::optional<mpiml::Region> phase(std::in_place, "rollout");
        for (int t = 0; t < local_steps; ++t) {
            const StepOut s = act(ac, o);
            const StepResult r = env->step(s.action);
            ep_ret += r.reward;
            ++ep_len;
            buf.store(o, s.action, r.reward, s.v, s.logp);
            logger.store("VVals", s.v);
            o = r.obs;

            const bool timeout = ep_len == cfg.max_ep_len || r.truncated;
            const bool terminal = r.terminated || timeout;
            const bool epoch_ended = t == local_steps - 1;
            if (terminal || epoch_ended) {
                // Bootstrap from V(s) unless the episode really ended.
                const double last_val = r.terminated ? 0.0 : value(ac, o);
                mpiml::Region gae("advantage");
                buf.finish_path(last_val);
                if (terminal) {
                    logger.store("EpRet", ep_ret);
                    logger.store("EpLen", ep_len);
                }
                o = env->reset();
                ep_ret = 0;
                ep_len = 0;
            }
        }

        phase.emplace("logging");
        logger.log_tabular("Epoch", static_cast<int64_t>(epoch));
        logger.log_tabular_stats("EpRet", true);
        logger.log_tabular_stats("EpLen", false, true);
        logger.log_tabular_stats("VVals", true);
        const int64_t steps_done = static_cast<int64_t>(local_steps) * cfg.num_procs;
        logger.log_tabular("TotalEnvInteracts", steps_done * (epoch + 1));

        // The same decision on every rank: rank 0's.
        int stop = cfg.stop_at_return && logger.get("AverageEpRet") >= *cfg.stop_at_return;
        mpiml::broadcast(stop);
        const bool last = stop || epoch == cfg.epochs - 1;
        // Like Spinning Up, save the policy that collected this epoch's data.
        if (rank == 0 && !cfg.out.empty() && (epoch % cfg.save_freq == 0 || last)) {
            mpiml::Region r("save_policy");
            save_policy(ac, cfg.out);
        }
        phase.reset();

        const auto update_start = clock::now();
        rollout_s += std::chrono::duration<double>(update_start - epoch_start).count();
        update();
        update_s += std::chrono::duration<double>(clock::now() - update_start).count();
        total_steps += steps_done;

        phase.emplace("logging");
        logger.log_tabular_stats("LossPi", false, true);
        logger.log_tabular_stats("LossV", false, true);
        logger.log_tabular_stats("DeltaLossPi", false, true);
        logger.log_tabular_stats("DeltaLossV", false, true);
        logger.log_tabular_stats("Entropy", false, true);
        logger.log_tabular_stats("KL", false, true);
        logger.log_tabular_stats("ClipFrac", false, true);
        logger.log_tabular_stats("StopIter", false, true);
        const auto now = clock::now();
        logger.log_tabular("Time", std::chrono::duration<double>(now - start).count());
        const double epoch_s = std::chrono::duration<double>(now - epoch_start).count();
        mpiml::pprint(table_row(logger, static_cast<double>(steps_done) / epoch_s));
        logger.dump_tabular();
        if (stop) {
            mpiml::pprint(fmt::format("Reached AverageEpRet >= {} in epoch {}; stopping.",
                                      *cfg.stop_at_return, epoch));
            break;
        }
    }
    const double wall = std::chrono::duration<double>(clock::now() - start).count();
    mpiml::pprint(fmt::format(
        "{} env steps in {:.1f} s: {:.0f} steps/s; rank 0 spent {:.1f} s collecting "
        "({:.0f} steps/s over all ranks) and {:.1f} s updating",
        total_steps, wall, total_steps / wall, rollout_s, total_steps / rollout_s, update_s));
    mpiml::profile_stop();  // collective; does nothing when not profiling
    if (rank == 0 && !cfg.out.empty()) {
        write_plot(logger, cfg);
        mpiml::pprint(fmt::format("Wrote {}/{{progress.txt, config.json, policy.pt, "
                                  "learning_curve.svg}}",
                                  cfg.out));
    }
    return 0;
}

// -------------------------------------------------------------------- test

int test_policy(const TestOptions& opts) {
    const auto dir = std::filesystem::path(opts.dir);
    std::ifstream in(dir / "config.json");
    if (!in) throw std::runtime_error("cannot open " + (dir / "config.json").string());
    std::stringstream ss;
    ss << in.rdbuf();
    const Config cfg = config_from_json(ss.str());

    torch::manual_seed(opts.seed);
    auto env = make_env(cfg.env);
    env->seed(opts.seed);
    ActorCritic ac(env->obs_dim(), env->action_space(), cfg.hidden, cfg.activation);
    torch::load(ac, (dir / "policy.pt").string());
    ac->eval();

    fmt::print("Testing the policy in {} on {} for {} episodes ({} actions)\n", opts.dir,
               cfg.env, opts.episodes, opts.deterministic ? "deterministic" : "sampled");
    const int max_len = cfg.max_ep_len;
    double sum = 0;
    for (int ep = 0; ep < opts.episodes; ++ep) {
        auto o = env->reset();
        double ret = 0;
        int len = 0;
        for (;;) {
            const auto r = env->step(act(ac, o, opts.deterministic).action);
            ret += r.reward;
            ++len;
            o = r.obs;
            if (r.terminated || r.truncated || len == max_len) break;
        }
        sum += ret;
        fmt::print("Episode {}\t EpRet {:.3f}\t EpLen {}\n", ep, ret, len);
    }
    if (opts.episodes > 0) fmt::print("AverageEpRet {:.3f}\n", sum / opts.episodes);
    return 0;
}

}  // namespace ppo
