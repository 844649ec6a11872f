// The one translation unit of mpiml-ppo that includes LibTorch.
#include "ppo.hpp"

#include "envs.hpp"
#include "gae.hpp"
#include "logger.hpp"
#include "losses.hpp"
#include "mlp.hpp"
#include "plot.hpp"

#include <mpiml/checkpoint.hpp>
#include <mpiml/collectives.hpp>
#include <mpiml/launch.hpp>
#include <mpiml/print.hpp>
#include <mpiml/profile.hpp>
#include <mpiml/session.hpp>
#include <mpiml/stats.hpp>
#include <mpiml/stop.hpp>
#include <mpiml/torch.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstring>  // sigabbrev_np
#include <cmath>
#include <filesystem>
#include <fstream>
#include <numbers>
#include <optional>
#include <random>
#include <span>
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

/// The policy's parameters: categorical over logits_net(obs), or Gaussian
/// with mean mu_net(obs) and a state-independent log_std (initialized to
/// -0.5). Parameter names follow Spinning Up's MLPActorCritic; the arithmetic
/// is Nets' (below).
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

    bool discrete;
    nn::Sequential net{nullptr};
    Tensor log_std;
};
TORCH_MODULE(Actor);

struct CriticImpl : nn::Module {
    CriticImpl(int obs_dim, const std::vector<int>& hidden, const std::string& activation)
        : v_net(register_module("v_net", mlp(layer_sizes(obs_dim, hidden, 1), activation))) {}
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

// ------------------------------------------------------------- fast paths

/// Spinning Up's mlp() as BLAS kernels over seq's Linear parameters; gives
/// every parameter a gradient tensor for the kernels to write into.
Mlp mlp_kernels(nn::Sequential& seq, Activation act) {
    std::vector<LinearRef> layers;
    for (const auto& m : seq->children()) {
        auto* lin = m->as<nn::Linear>();
        if (!lin) continue;
        Tensor& w = lin->weight;
        Tensor& b = lin->bias;
        w.mutable_grad() = torch::zeros_like(w);
        b.mutable_grad() = torch::zeros_like(b);
        layers.push_back({static_cast<int>(w.size(1)), static_cast<int>(w.size(0)),
                          w.data_ptr<float>(), b.data_ptr<float>(),
                          w.mutable_grad().data_ptr<float>(), b.mutable_grad().data_ptr<float>()});
    }
    return Mlp(std::move(layers), act);
}

Adam adam_over(nn::Module& module, double lr) {
    std::vector<Adam::Param> ps;
    for (auto& p : module.parameters())
        ps.push_back({p.data_ptr<float>(), p.grad().data_ptr<float>(),
                      static_cast<std::size_t>(p.numel())});
    return Adam(std::move(ps), lr);
}

/// The actor-critic's networks as kernels over the module's own storage: the
/// module keeps the parameters (for sync_params, mpi_avg_grads, policy.pt).
struct Nets {
    Nets(ActorCritic& ac, const std::string& activation)
        : discrete(ac->pi->discrete),
          pi(mlp_kernels(ac->pi->net, activation == "relu" ? Activation::relu : Activation::tanh)),
          v(mlp_kernels(ac->v->v_net, activation == "relu" ? Activation::relu : Activation::tanh)),
          act_dim(discrete ? 1 : pi.out_dim()) {
        if (!discrete) {
            ac->pi->log_std.mutable_grad() = torch::zeros_like(ac->pi->log_std);
            log_std = ac->pi->log_std.data_ptr<float>();
            log_std_grad = ac->pi->log_std.mutable_grad().data_ptr<float>();
        }
    }
    bool discrete;
    Mlp pi, v;
    int act_dim;
    float* log_std = nullptr;       ///< Gaussian policy only
    float* log_std_grad = nullptr;
};

PolicyHead policy_of(const Nets& nets) {
    return {nets.discrete, nets.pi.out_dim(), nets.log_std, nets.log_std_grad};
}

/// One action for one observation, with its log-probability and V(obs).
struct StepOut {
    std::vector<float> action;
    double logp = 0.0;
    double v = 0.0;
};

/// Samples (or, deterministic, takes the most likely / mean) action at obs.
void act(Nets& nets, const float* obs, std::mt19937_64& rng, bool deterministic, StepOut& out) {
    const float* y = nets.pi.forward(obs, 1);
    const int m = nets.pi.out_dim();
    if (nets.discrete) {
        double mx = y[0];
        for (int k = 1; k < m; ++k) mx = std::max(mx, static_cast<double>(y[k]));
        double sum = 0.0;
        for (int k = 0; k < m; ++k) sum += std::exp(y[k] - mx);
        const double lse = mx + std::log(sum);
        int a = 0;
        if (deterministic) {
            for (int k = 1; k < m; ++k) a = y[k] > y[a] ? k : a;
        } else {
            double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
            for (a = 0; a + 1 < m; ++a) {
                u -= std::exp(y[a] - lse);
                if (u < 0.0) break;
            }
        }
        out.action.assign(1, static_cast<float>(a));
        out.logp = y[a] - lse;
    } else {
        out.action.resize(static_cast<std::size_t>(m));
        std::normal_distribution<float> normal;
        double logp = 0.0;
        for (int d = 0; d < m; ++d) {
            const float eps = deterministic ? 0.0f : normal(rng);
            out.action[d] = y[d] + std::exp(nets.log_std[d]) * eps;
            logp += -0.5 * static_cast<double>(eps) * eps - nets.log_std[d] - half_log_2pi;
        }
        out.logp = logp;
    }
    out.v = nets.v.forward(obs, 1)[0];
}

// ------------------------------------------------------------------ buffer

/// Spinning Up's PPOBuffer: trajectories of one epoch on this rank, with
/// GAE-lambda advantages and rewards-to-go computed as each path finishes.
class PPOBuffer {
public:
    PPOBuffer(int obs_dim, int act_dim, int size, double gamma, double lam)
        : obs_dim_(obs_dim), act_dim_(act_dim), size_(size), gamma_(gamma), lam_(lam) {
        obs_.resize(static_cast<std::size_t>(size) * obs_dim);
        act_.resize(static_cast<std::size_t>(size) * act_dim);
        for (auto* v : {&rew_, &val_, &logp_, &adv_, &ret_}) v->resize(size);
    }

    void store(const std::vector<float>& obs, const std::vector<float>& act, double rew,
               double val, double logp) {
        if (ptr_ >= static_cast<std::size_t>(size_)) throw std::logic_error("PPOBuffer is full");
        std::copy(obs.begin(), obs.end(), obs_.begin() + ptr_ * obs_dim_);
        std::copy(act.begin(), act.end(), act_.begin() + ptr_ * act_dim_);
        rew_[ptr_] = rew;
        val_[ptr_] = val;
        logp_[ptr_] = logp;
        ++ptr_;
    }

    /// Ends the current path; last_val is 0 if the episode terminated, else
    /// V(s_T) to bootstrap the cut-off rewards.
    void finish_path(double last_val) {
        gae_lambda(rew_.data() + path_start_, val_.data() + path_start_, ptr_ - path_start_,
                   last_val, gamma_, lam_, adv_.data() + path_start_, ret_.data() + path_start_);
        path_start_ = ptr_;
    }

    /// V(s_t) of the epoch's steps (VVals).
    std::span<const double> values() const { return {val_.data(), ptr_}; }

    /// Collective: the epoch's data with advantages normalized by the mean
    /// and std pooled over all ranks, written into b; empties the buffer.
    void get(Batch& b) {
        if (ptr_ != static_cast<std::size_t>(size_) || path_start_ != ptr_)
            throw std::logic_error("PPOBuffer::get before the epoch's paths are finished");
        const auto st = mpiml::mpi_statistics_scalar(adv_);
        b.n = size_;
        b.obs = obs_;
        b.act = act_;
        b.ret.assign(ret_.begin(), ret_.end());
        b.logp.assign(logp_.begin(), logp_.end());
        b.adv.resize(adv_.size());
        for (std::size_t i = 0; i < adv_.size(); ++i)
            b.adv[i] = static_cast<float>((adv_[i] - st.mean) / (st.std + 1e-8));
        ptr_ = path_start_ = 0;
    }

private:
    int obs_dim_, act_dim_, size_;
    double gamma_, lam_;
    std::vector<float> obs_, act_;
    std::vector<double> rew_, val_, logp_, adv_, ret_;
    std::size_t ptr_ = 0, path_start_ = 0;
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

bool in_table(const Column& c, bool vpg) {
    const std::string key = c.key;
    return !(vpg && (key == "ClipFrac" || key == "StopIter"));
}

std::string table_header(bool vpg) {
    std::string s;
    for (const auto& c : table_columns)
        if (in_table(c, vpg)) s += fmt::format("{:>{}} ", c.label, c.width);
    s.pop_back();
    return s;
}

std::string table_row(const EpochLogger& log, double steps_per_s, bool vpg) {
    std::string s;
    for (const auto& c : table_columns) {
        if (!in_table(c, vpg)) continue;
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

namespace {

using clock = std::chrono::steady_clock;

double seconds_since(clock::time_point t) {
    return std::chrono::duration<double>(clock::now() - t).count();
}

double median(std::vector<double> v) {
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    const std::size_t h = v.size() / 2;
    return v.size() % 2 ? v[h] : 0.5 * (v[h - 1] + v[h]);
}

/// A checkpoint to continue from, loaded on every rank.
struct Resumed {
    mpiml::CheckpointState state;
    mpiml::CheckpointInfo info;
};

/// Data-parallel PPO on this rank: rollout, update and logging of one epoch.
class PPO {
public:
    /// ck: where to save checkpoints (none: no checkpoints); resumed: where to continue from.
    PPO(Config cfg, std::optional<mpiml::Checkpointer> ck, const Resumed* resumed);
    /// Trains for cfg.epochs (or until --stop-at-return); returns 0.
    int run();

private:
    /// Continues from a checkpoint: the shared state, and this rank's own if
    /// the saving run had this rank (returns whether it had).
    bool restore(const Resumed& r);
    /// Collective: checkpoint `epoch` (its row is dumped already).
    void save_checkpoint(int epoch, bool stopped);
    void rollout();
    void update();
    /// Logs the epoch's rollout statistics; returns whether to stop (rank 0's decision).
    bool log_rollout(int epoch);
    void log_update(clock::time_point epoch_start, int64_t steps_done);

    Config cfg_;
    bool vpg_;  ///< Spinning Up's VPG instead of PPO
    int rank_;
    std::optional<mpiml::Checkpointer> ck_;
    mpiml::CheckpointState ck_state_;  ///< kept from save to save (its buffers are reused)
    int start_epoch_ = 0;
    double time_offset_ = 0;  ///< seconds of training before the checkpoint resumed from
    int64_t env_interacts_ = 0;  ///< steps of every rank so far (TotalEnvInteracts), across resumes
    std::unique_ptr<Env> env_;
    EpochLogger logger_;
    ActorCritic ac_{nullptr};
    std::optional<Nets> nets_;
    std::optional<Adam> pi_opt_, vf_opt_;
    // The policy's parameters and a one-element tensor whose gradient carries
    // the KL, averaged over ranks in one call.
    std::vector<Tensor> pi_and_kl_;
    float* kl_slot_ = nullptr;
    int local_steps_;
    PPOBuffer buf_;
    Batch batch_;
    std::vector<float> dy_;
    std::mt19937_64 rng_;  ///< action sampling

    // The running episode.
    std::vector<float> o_;
    StepOut step_;
    double ep_ret_ = 0;
    int ep_len_ = 0;

    clock::time_point start_;
    // Seconds per epoch and phase on this rank.
    struct Times {
        std::vector<double> epoch, rollout, policy, value;
        std::vector<double> update_flops;  ///< matrix products of the update
        std::vector<double> checkpoint;    ///< saves
    } times_;
};

int local_steps_of(const Config& cfg) {
    if (cfg.steps_per_epoch < cfg.num_procs)
        throw std::invalid_argument("--steps-per-epoch must be at least the number of ranks");
    return cfg.steps_per_epoch / cfg.num_procs;
}

std::unique_ptr<Env> seeded_env(const Config& cfg, std::uint64_t seed) {
    auto env = make_env(cfg.env);
    env->seed(seed);
    return env;
}

std::uint64_t rank_seed(const Config& cfg, int rank) {
    return static_cast<std::uint64_t>(cfg.seed) + 10000u * rank;  // each rank explores differently
}

std::string resumed_progress(const Resumed* r) {
    return r ? r->state.shared.get<std::string>("progress") : std::string();
}

std::vector<float> values_of(const Tensor& t) {
    const float* p = t.data_ptr<float>();
    return {p, p + t.numel()};
}

void put_adam(mpiml::StateMap& m, const std::string& name, const Adam::State& a) {
    std::vector<float> flat;
    m.put(name + "/t", static_cast<std::int64_t>(a.t));
    for (const auto* moments : {&a.m, &a.v}) {
        flat.clear();
        for (const auto& x : *moments) flat.insert(flat.end(), x.begin(), x.end());
        m.put(name + (moments == &a.m ? "/m" : "/v"), flat);
    }
}

void get_adam(const mpiml::StateMap& m, const std::string& name, Adam& opt) {
    Adam::State a = opt.state();  // for the shapes
    a.t = static_cast<long>(m.get<std::int64_t>(name + "/t"));
    for (auto* moments : {&a.m, &a.v}) {
        const auto flat = m.get<std::vector<float>>(name + (moments == &a.m ? "/m" : "/v"));
        std::size_t at = 0;
        for (auto& x : *moments) {
            if (at + x.size() > flat.size()) break;
            std::copy_n(flat.begin() + static_cast<std::ptrdiff_t>(at), x.size(), x.begin());
            at += x.size();
        }
        if (at != flat.size() || moments->empty() != flat.empty())
            throw std::runtime_error("the checkpoint's " + name + " has " +
                                     std::to_string(flat.size()) +
                                     " values per moment, which do not fit this network");
    }
    opt.set_state(a);
}

PPO::PPO(Config cfg, std::optional<mpiml::Checkpointer> ck, const Resumed* resumed)
    : cfg_(std::move(cfg)),
      vpg_(cfg_.algo == "vpg"),
      rank_(mpiml::proc_id()),
      ck_(std::move(ck)),
      env_(seeded_env(cfg_, rank_seed(cfg_, rank_))),
      logger_(cfg_.out, "progress.txt", resumed_progress(resumed)),
      local_steps_(local_steps_of(cfg_)),
      buf_(env_->obs_dim(), env_->action_space().discrete ? 1 : env_->action_space().dim,
           local_steps_, cfg_.gamma, cfg_.lam),
      rng_(rank_seed(cfg_, rank_)) {
    logger_.save_text("config.json", to_json(cfg_));
    torch::manual_seed(rank_seed(cfg_, rank_));
    ac_ = ActorCritic(env_->obs_dim(), env_->action_space(), cfg_.hidden, cfg_.activation);
    {
        mpiml::Region r("sync_params");
        mpiml::sync_params(ac_);
    }
    nets_.emplace(ac_, cfg_.activation);
    pi_opt_.emplace(adam_over(*ac_->pi, cfg_.pi_lr));
    pi_and_kl_ = ac_->pi->parameters();
    Tensor kl = torch::zeros({1}).requires_grad_(true);
    kl.mutable_grad() = torch::zeros({1});
    kl_slot_ = kl.mutable_grad().data_ptr<float>();
    pi_and_kl_.push_back(kl);
    vf_opt_.emplace(adam_over(*ac_->v, cfg_.vf_lr));
    const bool had_rank = resumed && restore(*resumed);
    if (!had_rank) o_ = env_->reset();

    int64_t n_params = 0;
    for (const auto& p : ac_->parameters()) n_params += p.numel();
    mpiml::pprint(fmt::format("mpiml-ppo: {} on {} on {} rank{}, {} parameters, output in {}",
                              vpg_ ? "VPG" : "PPO", cfg_.env,
                              cfg_.num_procs, cfg_.num_procs == 1 ? "" : "s", n_params,
                              cfg_.out.empty() ? "(none)" : cfg_.out));
    if (resumed)
        mpiml::pprint(fmt::format(
            "mpiml-ppo: resuming from {} (epoch {}, saved by {} rank{}){}",
            resumed->info.path.string(), resumed->info.step, resumed->info.world_size,
            resumed->info.world_size == 1 ? "" : "s",
            resumed->info.world_size + 1 == cfg_.num_procs
                ? fmt::format("; rank {} starts its environment afresh from the seed",
                              resumed->info.world_size)
            : resumed->info.world_size < cfg_.num_procs
                ? fmt::format("; ranks {} to {} start their environments afresh from the seed",
                              resumed->info.world_size, cfg_.num_procs - 1)
                : ""));
}

bool PPO::restore(const Resumed& r) {
    const auto& sh = r.state.shared;
    // The networks must have the same shapes; other settings may change.
    const Config saved = config_from_json(sh.get<std::string>("config"));
    if (saved.env != cfg_.env || saved.algo != cfg_.algo || saved.hidden != cfg_.hidden ||
        saved.activation != cfg_.activation)
        throw std::runtime_error(fmt::format(
            "mpiml-ppo: cannot resume from {}: it was saved by a run of --algo {} --env {} "
            "--hidden {} --activation {}; this run has --algo {} --env {} --hidden {} "
            "--activation {}",
            r.info.path.string(), saved.algo, saved.env, fmt::join(saved.hidden, ","),
            saved.activation, cfg_.algo, cfg_.env, fmt::join(cfg_.hidden, ","), cfg_.activation));
    // Into the parameters' own storage: the kernels (Nets) and optimizers point at it.
    for (auto& p : ac_->named_parameters()) {
        const auto v = sh.get<std::vector<float>>("param/" + p.key());
        if (static_cast<int64_t>(v.size()) != p.value().numel())
            throw std::runtime_error("the checkpoint's parameter " + p.key() + " has " +
                                     std::to_string(v.size()) + " values, this network " +
                                     std::to_string(p.value().numel()));
        std::copy(v.begin(), v.end(), p.value().data_ptr<float>());
    }
    get_adam(sh, "pi_opt", *pi_opt_);
    get_adam(sh, "vf_opt", *vf_opt_);
    start_epoch_ = sh.get<bool>("stopped") ? cfg_.epochs
                                           : static_cast<int>(sh.get<std::int64_t>("epoch")) + 1;
    // Counted (the rank count and --steps may change on resume); checkpoints
    // without the count: every epoch at the saving run's steps.
    env_interacts_ = sh.contains("env_interacts")
                         ? sh.get<std::int64_t>("env_interacts")
                         : static_cast<int64_t>(saved.steps_per_epoch / std::max(1, saved.num_procs)) *
                               saved.num_procs * (sh.get<std::int64_t>("epoch") + 1);
    time_offset_ = sh.get<double>("time");

    const auto& pr = r.state.per_rank;
    if (!pr.contains("rng")) return false;  // a rank the saving run did not have
    pr.get("rng", rng_);
    Env::Snapshot snap;
    pr.get("env/rng", snap.rng);
    pr.get("env/t", snap.t);
    pr.get("env/vars", snap.vars);
    env_->set_snapshot(snap);
    pr.get("obs", o_);
    pr.get("ep_ret", ep_ret_);
    pr.get("ep_len", ep_len_);
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    pr.get("torch_rng", gen);
    return true;
}

void PPO::save_checkpoint(int epoch, bool stopped) {
    mpiml::Region region("checkpoint");
    const auto t0 = clock::now();
    auto& sh = ck_state_.shared;
    sh.put("epoch", static_cast<std::int64_t>(epoch));
    sh.put("stopped", stopped);
    sh.put("time", time_offset_ + seconds_since(start_));
    sh.put("env_interacts", env_interacts_);
    sh.put("config", to_json(cfg_));
    sh.put("progress", logger_.text());
    for (const auto& p : ac_->named_parameters()) sh.put("param/" + p.key(), values_of(p.value()));
    put_adam(sh, "pi_opt", pi_opt_->state());
    put_adam(sh, "vf_opt", vf_opt_->state());

    auto& pr = ck_state_.per_rank;
    pr.put("rng", rng_);
    const Env::Snapshot snap = env_->snapshot();
    pr.put("env/rng", snap.rng).put("env/t", snap.t).put("env/vars", snap.vars);
    pr.put("obs", o_).put("ep_ret", ep_ret_).put("ep_len", ep_len_);
    pr.put("torch_rng", at::detail::getDefaultCPUGenerator());
    ck_state_.metadata["program"] = "mpiml-ppo";
    ck_->save(epoch, ck_state_);
    times_.checkpoint.push_back(seconds_since(t0));
}

void PPO::rollout() {
    mpiml::Region region("rollout");
    for (int t = 0; t < local_steps_; ++t) {
        act(*nets_, o_.data(), rng_, false, step_);
        const StepResult r = env_->step(step_.action);
        ep_ret_ += r.reward;
        ++ep_len_;
        buf_.store(o_, step_.action, r.reward, step_.v, step_.logp);
        o_ = r.obs;

        const bool timeout = ep_len_ == cfg_.max_ep_len || r.truncated;
        const bool terminal = r.terminated || timeout;
        const bool epoch_ended = t == local_steps_ - 1;
        if (terminal || epoch_ended) {
            // Bootstrap from V(s) unless the episode really ended.
            const double last_val = r.terminated ? 0.0 : nets_->v.forward(o_.data(), 1)[0];
            mpiml::Region gae("advantage");
            buf_.finish_path(last_val);
            if (terminal) {
                logger_.store("EpRet", ep_ret_);
                logger_.store("EpLen", ep_len_);
            }
            o_ = env_->reset();
            ep_ret_ = 0;
            ep_len_ = 0;
        }
    }
    logger_.store("VVals", buf_.values());
}

void PPO::update() {
    mpiml::Region update_region("update");
    {
        mpiml::Region r("advantage");  // normalization, pooled over ranks
        buf_.get(batch_);
    }
    Nets& nets = *nets_;
    const Batch& b = batch_;
    const auto t_pi = clock::now();
    std::optional<mpiml::Region> phase(std::in_place, "policy_update");
    const PolicyHead head = policy_of(nets);
    const float* y = nets.pi.forward(b.obs.data(), b.n);
    const PiInfo old = vpg_ ? loss_pi_vpg(y, b, head, dy_)
                            : loss_pi(y, b, head, cfg_.clip_ratio, dy_);
    PiInfo info;
    int i = 0;
    if (vpg_) {  // one step of gradient descent on -mean(logp adv), from the same forward
        info = old;
        nets.pi.backward(dy_.data());
        mpiml::mpi_avg_grads(ac_->pi);
        pi_opt_->step();
        i = 1;
    }
    for (; !vpg_ && i < cfg_.train_pi_iters; ++i) {
        info = loss_pi(nets.pi.forward(b.obs.data(), b.n), b, head, cfg_.clip_ratio, dy_);
        // The gradient before the decision, so that one allreduce averages it
        // and the KL over ranks (every rank takes the same decision); it is
        // used only if the step is taken.
        nets.pi.backward(dy_.data());
        *kl_slot_ = static_cast<float>(info.kl);
        mpiml::mpi_avg_grads(pi_and_kl_);
        if (*kl_slot_ > 1.5 * cfg_.target_kl) {
            mpiml::pprint(fmt::format("Early stopping at step {} due to reaching max kl.", i));
            break;
        }
        pi_opt_->step();
    }
    // Forward and backward passes: the old loss (forward only) and each iteration's.
    const int pi_passes = vpg_ ? 1 : std::min(i + 1, cfg_.train_pi_iters);
    double flops = (pi_passes + (vpg_ ? 0 : 1)) * nets.pi.forward_flops(b.n) +
                   pi_passes * nets.pi.backward_flops(b.n);
    flops += (cfg_.train_v_iters + 1) * nets.v.forward_flops(b.n) +
             cfg_.train_v_iters * nets.v.backward_flops(b.n);
    times_.update_flops.push_back(flops);
    if (i == cfg_.train_pi_iters) i = std::max(0, cfg_.train_pi_iters - 1);
    times_.policy.push_back(seconds_since(t_pi));

    const auto t_v = clock::now();
    phase.emplace("value_update");
    const double v_l_old = loss_v(nets.v.forward(b.obs.data(), b.n), b, dy_);
    double v_l = v_l_old;
    for (int j = 0; j < cfg_.train_v_iters; ++j) {
        v_l = loss_v(nets.v.forward(b.obs.data(), b.n), b, dy_);
        nets.v.backward(dy_.data());
        mpiml::mpi_avg_grads(ac_->v);
        vf_opt_->step();
    }
    phase.reset();
    times_.value.push_back(seconds_since(t_v));

    if (!vpg_) logger_.store("StopIter", i);
    logger_.store("LossPi", old.loss);
    logger_.store("LossV", v_l_old);
    logger_.store("KL", info.kl);
    logger_.store("Entropy", old.ent);
    if (!vpg_) logger_.store("ClipFrac", info.cf);
    logger_.store("DeltaLossPi", info.loss - old.loss);
    logger_.store("DeltaLossV", cfg_.train_v_iters > 0 ? v_l - v_l_old : 0.0);
}

bool PPO::log_rollout(int epoch) {
    mpiml::Region r("logging");
    logger_.log_tabular("Epoch", static_cast<int64_t>(epoch));
    logger_.log_tabular_stats("EpRet", true);
    logger_.log_tabular_stats("EpLen", false, true);
    logger_.log_tabular_stats("VVals", true);
    env_interacts_ += static_cast<int64_t>(local_steps_) * cfg_.num_procs;
    logger_.log_tabular("TotalEnvInteracts", env_interacts_);

    // The same decision on every rank: rank 0's.
    int stop = cfg_.stop_at_return && logger_.get("AverageEpRet") >= *cfg_.stop_at_return;
    mpiml::broadcast(stop);
    const bool last = stop || epoch == cfg_.epochs - 1;
    // Like Spinning Up, save the policy that collected this epoch's data.
    if (rank_ == 0 && !cfg_.out.empty() && (epoch % cfg_.save_freq == 0 || last)) {
        mpiml::Region save("save_policy");
        save_policy(ac_, cfg_.out);
    }
    return stop;
}

void PPO::log_update(clock::time_point epoch_start, int64_t steps_done) {
    mpiml::Region r("logging");
    for (const char* key : {"LossPi", "LossV", "DeltaLossPi", "DeltaLossV", "Entropy", "KL"})
        logger_.log_tabular_stats(key, false, true);
    if (!vpg_)
        for (const char* key : {"ClipFrac", "StopIter"})
            logger_.log_tabular_stats(key, false, true);
    logger_.log_tabular("Time", time_offset_ + seconds_since(start_));
    mpiml::pprint(table_row(logger_, static_cast<double>(steps_done) / seconds_since(epoch_start),
                            vpg_));
    logger_.dump_tabular();
}

int PPO::run() {
    start_ = clock::now();
    mpiml::pprint(table_header(vpg_));
    int64_t total_steps = 0;
    int exit_code = 0;
    const int64_t steps_done = static_cast<int64_t>(local_steps_) * cfg_.num_procs;
    for (int epoch = start_epoch_; epoch < cfg_.epochs; ++epoch) {
        mpiml::Region epoch_region("epoch");
        const auto epoch_start = clock::now();
        rollout();
        times_.rollout.push_back(seconds_since(epoch_start));
        const bool stop = log_rollout(epoch);
        update();
        total_steps += steps_done;
        log_update(epoch_start, steps_done);
        times_.epoch.push_back(seconds_since(epoch_start));
        // A stop signal on any rank (mpiml::stop_on_signals): every rank stops here.
        const bool stop_now = !stop && epoch < cfg_.epochs - 1 && mpiml::should_stop();
        if (ck_ && ((epoch + 1) % cfg_.checkpoint_every == 0 || stop || stop_now ||
                    epoch == cfg_.epochs - 1))
            save_checkpoint(epoch, stop);
        if (stop_now) {
            const int sig = mpiml::stop_signal();
            mpiml::pprint(fmt::format(
                "mpiml-ppo: stopping after epoch {} on request ({}){}", epoch,
                sig ? fmt::format("SIG{} on rank 0", ::sigabbrev_np(sig)) : std::string("a signal on another rank"),
                ck_ ? fmt::format("; checkpoint saved in {}: continue with --resume auto", ck_->dir().string())
                    : std::string("; no checkpoint (--checkpoint-every 0)")));
            exit_code = mpiml::exit_stopped;
            break;
        }
        if (stop) {
            mpiml::pprint(fmt::format("Reached AverageEpRet >= {} in epoch {}; stopping.",
                                      *cfg_.stop_at_return, epoch));
            break;
        }
    }
    if (total_steps == 0)
        mpiml::pprint("mpiml-ppo: nothing to train: the checkpoint resumed from ends the run");
    const double wall = seconds_since(start_);
    double rollout_s = 0, update_s = 0;
    for (double s : times_.rollout) rollout_s += s;
    for (std::size_t k = 0; k < times_.policy.size(); ++k)
        update_s += times_.policy[k] + times_.value[k];
    if (total_steps > 0)
        mpiml::pprint(fmt::format(
            "{} env steps in {:.1f} s: {:.0f} steps/s; rank 0 spent {:.1f} s collecting "
            "({:.0f} steps/s over all ranks) and {:.1f} s updating",
            total_steps, wall, total_steps / wall, rollout_s, total_steps / rollout_s, update_s));
    if (times_.epoch.size() > 1) {  // medians without the first epoch
        auto tail = [](const std::vector<double>& v) {
            return median(std::vector<double>(v.begin() + 1, v.end()));
        };
        mpiml::pprint(fmt::format(
            "median epoch (first dropped) on rank 0: {:.4f} s: rollout {:.4f} s, policy update "
            "{:.4f} s, value update {:.4f} s; update arithmetic {:.3f} GFLOP",
            tail(times_.epoch), tail(times_.rollout), tail(times_.policy), tail(times_.value),
            tail(times_.update_flops) * 1e-9));
    }
    if (!times_.checkpoint.empty())
        mpiml::pprint(fmt::format("{} checkpoint{} saved in {}: median save {:.4f} s on rank 0",
                                  times_.checkpoint.size(),
                                  times_.checkpoint.size() == 1 ? "" : "s", ck_->dir().string(),
                                  median(times_.checkpoint)));
    mpiml::profile_stop();  // collective; does nothing when not profiling
    if (rank_ == 0 && !cfg_.out.empty()) {
        write_plot(logger_, cfg_);
        mpiml::pprint(fmt::format("Wrote {}/{{progress.txt, config.json, policy.pt, "
                                  "learning_curve.svg}}",
                                  cfg_.out));
    }
    return exit_code;
}

}  // namespace

namespace {

bool is_step_dir(const std::filesystem::path& p) {
    return std::filesystem::exists(p / "MANIFEST") &&
           p.filename().string().rfind("step-", 0) == 0;
}

/// Collective: the checkpoint to continue from, per cfg.resume and the restart
/// attempt, or nullopt to start fresh.
std::optional<Resumed> find_resume(const Config& cfg, const std::filesystem::path& own) {
    const bool restart = mpiml::restart_attempt() > 0;
    const bool explicit_path = !cfg.resume.empty() && cfg.resume != "auto";
    Resumed r;
    // A restarted job continues from its own newest checkpoint first.
    if ((restart || cfg.resume == "auto") && !own.empty()) {
        mpiml::Checkpointer ck(own);
        if (auto info = ck.load_latest(r.state)) {
            r.info = std::move(*info);
            return r;
        }
    }
    if (!explicit_path) return std::nullopt;
    const std::filesystem::path p(cfg.resume);
    std::optional<mpiml::CheckpointInfo> info;
    if (is_step_dir(p)) {
        const auto step = std::stoll(p.filename().string().substr(5));
        info = mpiml::Checkpointer(p.parent_path()).load(step, r.state);
    } else {
        info = mpiml::Checkpointer(p).load_latest(r.state);
    }
    if (!info)
        throw std::runtime_error("mpiml-ppo --resume: no checkpoint in " + cfg.resume +
                                 " (give a checkpoints folder, OUT/checkpoints, or one of its "
                                 "step-* folders)");
    r.info = std::move(*info);
    return r;
}

}  // namespace

int train(Config cfg) {
    mpiml::setup_pytorch_for_mpi();
    if (!cfg.profile.empty()) mpiml::profile_start(cfg.profile);
    cfg.num_procs = mpiml::num_procs();
    const std::filesystem::path own =
        cfg.out.empty() ? std::filesystem::path() : std::filesystem::path(cfg.out) / "checkpoints";
    const auto resumed = find_resume(cfg, own);
    // A fresh run: a restart must not resume an earlier run's checkpoints (an
    // error while another job saves there).
    if (!resumed && !own.empty()) mpiml::Checkpointer(own).clear();
    std::optional<mpiml::Checkpointer> ck;
    if (!own.empty() && cfg.checkpoint_every > 0)
        ck.emplace(own, mpiml::CheckpointOptions{.keep = 3});
    return PPO(std::move(cfg), std::move(ck), resumed ? &*resumed : nullptr).run();
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
    Nets nets(ac, cfg.activation);  // after load: it replaces the parameters' storage
    std::mt19937_64 rng(static_cast<std::uint64_t>(opts.seed));
    StepOut step;

    fmt::print("Testing the policy in {} on {} for {} episodes ({} actions)\n", opts.dir,
               cfg.env, opts.episodes, opts.deterministic ? "deterministic" : "sampled");
    const int max_len = cfg.max_ep_len;
    double sum = 0;
    for (int ep = 0; ep < opts.episodes; ++ep) {
        auto o = env->reset();
        double ret = 0;
        int len = 0;
        for (;;) {
            act(nets, o.data(), rng, opts.deterministic, step);
            const auto r = env->step(step.action);
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
