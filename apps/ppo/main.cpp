// mpiml-ppo: data-parallel PPO (Spinning Up's ppo.py) in C++ on mpiml.
//
//   mpiml-ppo --env CartPole-v1 --cpu 2          train on 2 ranks
//   mpiml-ppo --test out/ppo-CartPole-v1-s0      run the saved policy
#include "config.hpp"
#include "envs.hpp"
#include "logger.hpp"
#include "plot.hpp"
#include "ppo.hpp"

#include <mpiml/failure.hpp>
#include <mpiml/launch.hpp>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

int main(int argc, char** argv) {
    ppo::Config cfg;
    ppo::TestOptions test;
    std::string plot_dir;
    bool bind_to_core = false;

    CLI::App app{
        "mpiml-ppo: Proximal Policy Optimization (PPO-clip with GAE-lambda), data-parallel\n"
        "over MPI ranks, with Spinning Up's defaults. Each rank collects\n"
        "steps-per-epoch/N steps; advantages are normalized with statistics pooled over\n"
        "all ranks, gradients are averaged over ranks after every backward pass, and\n"
        "policy updates stop early when the rank-averaged KL exceeds 1.5 * target-kl.\n"
        "Rank 0 prints a table per epoch and writes progress.txt (Spinning Up's format),\n"
        "config.json, policy.pt and learning_curve.svg to --out.",
        "mpiml-ppo"};
    app.get_formatter()->column_width(34);

    app.add_option("--env", cfg.env, "Environment")
        ->check(CLI::IsMember(ppo::env_names()))
        ->capture_default_str();
    app.add_option("--seed", cfg.seed, "Random seed (rank r uses seed + 10000 r)")
        ->capture_default_str();
    app.add_option("--cpu", cfg.cpu,
                   "Number of MPI ranks: the program re-launches itself with mpirun "
                   "(mpi_fork); 1 runs in this process")
        ->check(CLI::PositiveNumber)
        ->capture_default_str();
    app.add_flag("--bind-to-core", bind_to_core, "With --cpu N > 1: bind each rank to a core");
    app.add_option("--epochs", cfg.epochs, "Number of epochs (policy updates)")
        ->check(CLI::PositiveNumber)
        ->capture_default_str();
    app.add_option("--steps-per-epoch,--steps", cfg.steps_per_epoch,
                   "Environment steps per epoch, summed over all ranks")
        ->check(CLI::PositiveNumber)
        ->capture_default_str();
    app.add_option("--gamma", cfg.gamma, "Discount factor")->capture_default_str();
    app.add_option("--lam", cfg.lam, "GAE lambda")->capture_default_str();
    app.add_option("--clip-ratio", cfg.clip_ratio, "PPO clip range epsilon")
        ->capture_default_str();
    app.add_option("--pi-lr", cfg.pi_lr, "Policy learning rate (Adam)")->capture_default_str();
    app.add_option("--vf-lr", cfg.vf_lr, "Value function learning rate (Adam)")
        ->capture_default_str();
    app.add_option("--train-pi-iters", cfg.train_pi_iters,
                   "Max policy gradient steps per epoch")
        ->check(CLI::PositiveNumber)
        ->capture_default_str();
    app.add_option("--train-v-iters", cfg.train_v_iters, "Value function steps per epoch")
        ->check(CLI::NonNegativeNumber)
        ->capture_default_str();
    app.add_option("--target-kl", cfg.target_kl,
                   "Stop policy steps once the mean KL exceeds 1.5 * target-kl")
        ->capture_default_str();
    app.add_option("--max-ep-len", cfg.max_ep_len,
                   "Cut episodes after this many steps (the environments' own limits "
                   "apply too: 500 for CartPole-v1, 200 for Pendulum-v1)")
        ->check(CLI::PositiveNumber)
        ->capture_default_str();
    app.add_option("--hidden", cfg.hidden, "Hidden layer sizes of the policy and value MLPs")
        ->delimiter(',')
        ->expected(1, 16)
        ->check(CLI::PositiveNumber)
        ->default_str("64,64");
    app.add_option("--activation", cfg.activation, "Hidden-layer activation")
        ->check(CLI::IsMember({"tanh", "relu"}))
        ->capture_default_str();
    app.add_option("--out", cfg.out,
                   "Output folder (default: out/ppo-<env>-s<seed>, relative to the "
                   "working directory)");
    app.add_option("--profile", cfg.profile,
                   "Profile every rank into this folder: profile_<rank>.json and timeline.json "
                   "(open in ui.perfetto.dev or chrome://tracing), summary.csv; see "
                   "docs/PROFILING.md");
    app.add_option("--save-freq", cfg.save_freq,
                   "Save the policy every this many epochs (and at the end)")
        ->check(CLI::PositiveNumber)
        ->capture_default_str();
    app.add_option("--stop-at-return", cfg.stop_at_return,
                   "Stop after the first epoch whose AverageEpRet reaches this value");

    auto* test_opt = app.add_option("--test", test.dir,
                                    "Do not train: load the policy saved in this output folder "
                                    "and run --episodes episodes, printing their returns")
                         ->check(CLI::ExistingDirectory);
    app.add_option("--episodes", test.episodes, "With --test: number of episodes")
        ->check(CLI::NonNegativeNumber)
        ->capture_default_str();
    app.add_flag("--deterministic", test.deterministic,
                 "With --test: take the most likely (or mean) action instead of sampling");
    app.add_option("--plot", plot_dir,
                   "Do not train: redraw learning_curve.svg from the progress.txt in this folder")
        ->check(CLI::ExistingDirectory)
        ->excludes(test_opt);

    CLI11_PARSE(app, argc, argv);

    try {
        if (!test.dir.empty()) {
            test.seed = cfg.seed;
            return ppo::test_policy(test);
        }
        if (!plot_dir.empty()) {
            const auto progress =
                ppo::read_progress((std::filesystem::path(plot_dir) / "progress.txt").string());
            ppo::PlotOptions po;
            po.title = "PPO: " + plot_dir;
            std::ifstream cfg_in(std::filesystem::path(plot_dir) / "config.json");
            if (cfg_in) {
                std::stringstream ss;
                ss << cfg_in.rdbuf();
                po.title = ppo::plot_title(ppo::config_from_json(ss.str()));
            }
            const auto path = std::filesystem::path(plot_dir) / "learning_curve.svg";
            std::ofstream(path) << ppo::learning_curve_svg(progress, po);
            fmt::print("Wrote {}\n", path.string());
            return 0;
        }
    } catch (const std::exception& e) {
        std::cerr << "mpiml-ppo: " << e.what() << "\n";
        return 1;
    }

    if (cfg.out.empty()) cfg.out = fmt::format("out/ppo-{}-s{}", cfg.env, cfg.seed);
    // Re-launch under mpirun with cfg.cpu ranks; in the children this returns.
    mpiml::mpi_fork(cfg.cpu, bind_to_core);
    return mpiml::run(argc, argv, [&](int, char**) { return ppo::train(cfg); });
}
