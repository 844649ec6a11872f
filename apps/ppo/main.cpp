// mpiml-ppo: data-parallel PPO (Spinning Up's ppo.py) in C++ on mpiml.
//
//   mpiml-ppo --env CartPole-v1 --cpu 2          train on 2 ranks
//   mpiml-ppo --test out/ppo-CartPole-v1-s0      run the saved policy
#include "cli.hpp"
#include "config.hpp"
#include "envs.hpp"
#include "logger.hpp"
#include "plot.hpp"
#include "ppo.hpp"

#include <mpiml/failure.hpp>
#include <mpiml/launch.hpp>
#include <mpiml/stop.hpp>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

namespace cli = ppo::cli;

int main(int argc, char** argv) {
    ppo::Config cfg;
    ppo::TestOptions test;
    std::string plot_dir;
    bool bind_to_core = false;
    std::string cpu_arg = "1";
    int restarts = 0;

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

    app.add_option("--algo", cfg.algo,
                   "ppo, or vpg: Spinning Up's VPG (one policy gradient step per epoch; "
                   "--clip-ratio, --train-pi-iters and --target-kl do not apply)")
        ->check(cli::one_of({"ppo", "vpg"}))
        ->capture_default_str();
    app.add_option("--env", cfg.env, "Environment")
        ->check(cli::one_of(ppo::env_names()))
        ->capture_default_str();
    app.add_option("-s,--seed", cfg.seed, "Random seed (rank r uses seed + 10000 r)")
        ->check(cli::whole_at_least(0))
        ->capture_default_str();
    app.add_option("--cpu", cpu_arg,
                   "Number of MPI ranks, or auto for one per core of this node: the program "
                   "re-launches itself with mpirun (mpi_fork); 1 runs in this process")
        ->check(cli::ranks())
        ->capture_default_str();
    app.add_flag("--bind-to-core", bind_to_core, "With --cpu N > 1: bind each rank to a core");
    app.add_option("--epochs", cfg.epochs, "Number of epochs (policy updates)")
        ->check(cli::whole_at_least(1))
        ->capture_default_str();
    app.add_option("--steps-per-epoch,--steps", cfg.steps_per_epoch,
                   "Environment steps per epoch, summed over all ranks")
        ->check(cli::whole_at_least(1))
        ->capture_default_str();
    app.add_option("--gamma", cfg.gamma, "Discount factor")
        ->check(cli::number_in(0, 1))
        ->capture_default_str();
    app.add_option("--lam", cfg.lam, "GAE lambda")
        ->check(cli::number_in(0, 1))
        ->capture_default_str();
    app.add_option("--clip-ratio", cfg.clip_ratio, "PPO clip range epsilon")
        ->check(cli::number_in(0, 1, true, true))
        ->capture_default_str();
    app.add_option("--pi-lr", cfg.pi_lr, "Policy learning rate (Adam)")
        ->check(cli::number_in(0, HUGE_VAL, true))
        ->capture_default_str();
    app.add_option("--vf-lr", cfg.vf_lr, "Value function learning rate (Adam)")
        ->check(cli::number_in(0, HUGE_VAL, true))
        ->capture_default_str();
    app.add_option("--train-pi-iters", cfg.train_pi_iters,
                   "Max policy gradient steps per epoch")
        ->check(cli::whole_at_least(1))
        ->capture_default_str();
    app.add_option("--train-v-iters", cfg.train_v_iters, "Value function steps per epoch")
        ->check(cli::whole_at_least(0))
        ->capture_default_str();
    app.add_option("--target-kl", cfg.target_kl,
                   "Stop policy steps once the mean KL exceeds 1.5 * target-kl")
        ->check(cli::number_in(0, HUGE_VAL, true))
        ->capture_default_str();
    app.add_option("--max-ep-len", cfg.max_ep_len,
                   "Cut episodes after this many steps (the environments' own limits "
                   "apply too: 500 for CartPole-v1 and Acrobot-v1, 200 for Pendulum-v1, 999 for "
                   "MountainCarContinuous-v0)")
        ->check(cli::whole_at_least(1))
        ->capture_default_str();
    auto* hidden_opt =
        app.add_option("--hidden", cfg.hidden, "Hidden layer sizes of the policy and value MLPs")
            ->delimiter(',')
            ->expected(1, 16)
            ->check(cli::whole_at_least(1))
            ->default_str("64,64");
    // Spinning Up's ppo.py: --hid H --l L is --hidden H,...,H (L times).
    int hid = 0, layers = 0;
    auto* hid_opt = app.add_option("--hid", hid, "Spinning Up's form: the size of each hidden layer "
                                                 "(with --l; default 64)")
                        ->check(cli::whole_at_least(1))
                        ->excludes(hidden_opt);
    auto* l_opt = app.add_option("--l", layers, "Spinning Up's form: the number of hidden layers "
                                                "(with --hid; default 2)")
                      ->check(cli::whole_at_least(1))
                      ->excludes(hidden_opt);
    hidden_opt->excludes(hid_opt)->excludes(l_opt);
    std::string exp_name;
    auto* exp_opt = app.add_option("--exp_name,--exp-name", exp_name,
                                   "Spinning Up's form: output into out/<name>/<name>_s<seed>");
    app.add_option("--activation", cfg.activation, "Hidden-layer activation")
        ->check(cli::one_of({"tanh", "relu"}))
        ->capture_default_str();
    app.add_option("--out", cfg.out,
                   "Output folder (default: out/<algo>-<env>-s<seed>, relative to the "
                   "working directory)")
        ->excludes(exp_opt);
    app.add_option("--profile", cfg.profile,
                   "Profile every rank into this folder: profile_<rank>.json and timeline.json "
                   "(open in ui.perfetto.dev or chrome://tracing), summary.csv; see "
                   "docs/PROFILING.md");
    app.add_option("--save-freq", cfg.save_freq,
                   "Save the policy every this many epochs (and at the end)")
        ->check(cli::whole_at_least(1))
        ->capture_default_str();
    app.add_option("--checkpoint-every", cfg.checkpoint_every,
                   "Checkpoint every this many epochs (and at the end) into "
                   "<out>/checkpoints, keeping the newest 3; 0: never. Everything needed to "
                   "continue exactly: networks, optimizers, every rank's environment and "
                   "random state, the rows of progress.txt")
        ->check(cli::whole_at_least(0))
        ->capture_default_str();
    app.add_option("--resume", cfg.resume,
                   "auto: continue from the newest good checkpoint in <out>/checkpoints "
                   "(start fresh if there is none); or a checkpoints folder or one of its "
                   "step-* folders. Without it a run starts fresh and deletes "
                   "<out>/checkpoints, except on a restart (--restarts, mpiml-run, or a Slurm "
                   "requeue), which always resumes")
        ->check(cli::auto_or_folder());
    app.add_option("--restarts", restarts,
                   "With --cpu N > 1: start the job again, up to this many times, when a rank "
                   "fails; it resumes from its last checkpoint")
        ->check(cli::whole_at_least(0))
        ->capture_default_str();
    std::vector<std::string> stop_on{"USR2"};
    app.add_option("--stop-on", stop_on,
                   "Signals that stop the run after the current epoch with a checkpoint and "
                   "exit status 75 (a batch system's warning before a time limit or a "
                   "preemption; --resume auto continues); none: they end it at once. With "
                   "TERM a rank stuck in a collective (a peer failed) ends only at the "
                   "launcher's SIGKILL")
        ->delimiter(',')
        ->check(cli::one_of({"TERM", "USR2", "HUP", "INT", "none"}))
        ->default_str("USR2");
    app.add_option("--stop-at-return", cfg.stop_at_return,
                   "Stop after the first epoch whose AverageEpRet reaches this value")
        ->check(cli::number_in(-HUGE_VAL, HUGE_VAL));

    auto* test_opt = app.add_option("--test", test.dir,
                                    "Do not train: load the policy saved in this output folder "
                                    "and run --episodes episodes, printing their returns")
                         ->check(cli::existing_folder());
    app.add_option("--episodes", test.episodes, "With --test: number of episodes")
        ->check(cli::whole_at_least(0))
        ->capture_default_str();
    app.add_flag("--deterministic", test.deterministic,
                 "With --test: take the most likely (or mean) action instead of sampling");
    app.add_option("--plot", plot_dir,
                   "Do not train: redraw learning_curve.svg from the progress.txt in this folder")
        ->check(cli::existing_folder())
        ->excludes(test_opt);
    app.failure_message(cli::failure_message);

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

    cfg.cpu = cpu_arg == "auto" ? cli::node_cores() : std::stoi(cpu_arg);
    if (hid > 0 || layers > 0) cfg.hidden.assign(layers > 0 ? layers : 2, hid > 0 ? hid : 64);
    if (!exp_name.empty()) cfg.out = fmt::format("out/{0}/{0}_s{1}", exp_name, cfg.seed);
    if (cfg.out.empty()) cfg.out = fmt::format("out/{}-{}-s{}", cfg.algo, cfg.env, cfg.seed);
    if (restarts > 0 && cfg.cpu <= 1) {
        std::cerr << "mpiml-ppo: --restarts needs --cpu 2 or more (for one rank, run it under "
                     "mpiml-run --restarts K -np 1)\nRun with --help for every flag.\n";
        return 2;
    }
    // Re-launch under mpirun with cfg.cpu ranks; in the children this returns.
    mpiml::mpi_fork(cfg.cpu, mpiml::ForkOptions{.bind_to_core = bind_to_core, .restarts = restarts});
    std::vector<int> stop_signals;
    for (const auto& name : stop_on) {
        if (name == "none") continue;
        stop_signals.push_back(name == "TERM"  ? SIGTERM
                               : name == "USR2" ? SIGUSR2
                               : name == "HUP"  ? SIGHUP
                                                : SIGINT);
    }
    return mpiml::run(argc, argv, [&](int, char**) {
        mpiml::stop_on_signals(stop_signals);
        return ppo::train(cfg);
    });
}
