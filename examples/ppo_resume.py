"""Spinning Up's PPO on mpiml, checkpointed every epoch: a restarted run
resumes and ends bit for bit where an uninterrupted run ends.

    python3 examples/ppo_resume.py --cpu 2 --restarts 2 --epochs 20 --out /tmp/ppo
    MPIML_INJECT=kill:1:2000 python3 examples/ppo_resume.py --cpu 2 --restarts 1 --out /tmp/ppo

The algorithm and its defaults are Spinning Up's (actor-critic MLP 64x64
tanh, GAE-lambda, PPO-clip with KL early stopping, Adam), except that an
epoch has 1000 steps (Spinning Up: 4000) to keep it short. The environment is
CartPole, in numpy. Rank 0 writes DIR/progress.txt (no wall time in it, so
that the rows of a resumed run equal an uninterrupted run's) and, at the end,
DIR/final.pt (the model's state_dict).
"""
import argparse
import os
import shutil
import sys
import time

import numpy as np
import torch
from torch import nn
from torch.distributions.categorical import Categorical

from mpiml.checkpoint import capture_rng, load_checkpoint, restore_rng, save_checkpoint
from mpiml.errors import NoSamplesError
from mpiml.mpi_pytorch import mpi_avg_grads, setup_pytorch_for_mpi, sync_params
from mpiml.mpi_tools import (barrier, mpi_avg, mpi_fork, mpi_statistics_scalar, num_procs, proc_id,
                             restart_attempt)


class CartPole:
    """gym's CartPole-v1 dynamics; its own generator for the initial states."""
    obs_dim, n_acts = 4, 2

    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)
        self.state = None

    def reset(self):
        self.state = self.rng.uniform(-0.05, 0.05, size=4)
        return self.state.astype(np.float32)

    def step(self, a):
        x, x_dot, th, th_dot = self.state
        force = 10.0 if a == 1 else -10.0
        cos, sin = np.cos(th), np.sin(th)
        temp = (force + 0.05 * th_dot**2 * sin) / 1.1
        th_acc = (9.8 * sin - cos * temp) / (0.5 * (4.0 / 3.0 - 0.1 * cos**2 / 1.1))
        x_acc = temp - 0.05 * th_acc * cos / 1.1
        x, x_dot = x + 0.02 * x_dot, x_dot + 0.02 * x_acc
        th, th_dot = th + 0.02 * th_dot, th_dot + 0.02 * th_acc
        self.state = np.array([x, x_dot, th, th_dot])
        done = abs(x) > 2.4 or abs(th) > 12 * 2 * np.pi / 360
        return self.state.astype(np.float32), 1.0, done


def mlp(sizes, activation, output_activation=nn.Identity):
    layers = []
    for j in range(len(sizes) - 1):
        act = activation if j < len(sizes) - 2 else output_activation
        layers += [nn.Linear(sizes[j], sizes[j + 1]), act()]
    return nn.Sequential(*layers)


class MLPActorCritic(nn.Module):
    def __init__(self, obs_dim, n_acts, hidden_sizes=(64, 64), activation=nn.Tanh):
        super().__init__()
        self.logits_net = mlp([obs_dim, *hidden_sizes, n_acts], activation)
        self.v_net = mlp([obs_dim, *hidden_sizes, 1], activation)

    def distribution(self, obs):
        return Categorical(logits=self.logits_net(obs))

    def v(self, obs):
        return torch.squeeze(self.v_net(obs), -1)

    def step(self, obs):
        with torch.no_grad():
            pi = self.distribution(obs)
            a = pi.sample()
            return a.numpy(), self.v(obs).numpy(), pi.log_prob(a).numpy()


def discount_cumsum(x, discount):
    """[x0 + d x1 + d^2 x2 + ..., x1 + d x2 + ..., ...]"""
    out, acc = np.zeros(len(x)), 0.0
    for i in reversed(range(len(x))):
        out[i] = acc = x[i] + discount * acc
    return out


class PPOBuffer:
    """One epoch of experience on this rank; GAE-lambda advantages."""

    def __init__(self, obs_dim, size, gamma, lam):
        self.obs_buf = np.zeros((size, obs_dim), dtype=np.float32)
        self.act_buf = np.zeros(size, dtype=np.float32)
        self.adv_buf = np.zeros(size, dtype=np.float32)
        self.rew_buf = np.zeros(size, dtype=np.float32)
        self.ret_buf = np.zeros(size, dtype=np.float32)
        self.val_buf = np.zeros(size, dtype=np.float32)
        self.logp_buf = np.zeros(size, dtype=np.float32)
        self.gamma, self.lam = gamma, lam
        self.ptr, self.path_start_idx, self.max_size = 0, 0, size

    def store(self, obs, act, rew, val, logp):
        i = self.ptr
        self.obs_buf[i], self.act_buf[i], self.rew_buf[i] = obs, act, rew
        self.val_buf[i], self.logp_buf[i] = val, logp
        self.ptr += 1

    def finish_path(self, last_val=0):
        path = slice(self.path_start_idx, self.ptr)
        rews = np.append(self.rew_buf[path], last_val)
        vals = np.append(self.val_buf[path], last_val)
        deltas = rews[:-1] + self.gamma * vals[1:] - vals[:-1]
        self.adv_buf[path] = discount_cumsum(deltas, self.gamma * self.lam)
        self.ret_buf[path] = discount_cumsum(rews, self.gamma)[:-1]
        self.path_start_idx = self.ptr

    def get(self):
        assert self.ptr == self.max_size
        self.ptr, self.path_start_idx = 0, 0
        adv_mean, adv_std = mpi_statistics_scalar(self.adv_buf)  # across ranks
        self.adv_buf = (self.adv_buf - adv_mean) / adv_std
        data = dict(obs=self.obs_buf, act=self.act_buf, ret=self.ret_buf, adv=self.adv_buf,
                    logp=self.logp_buf)
        return {k: torch.as_tensor(v, dtype=torch.float32) for k, v in data.items()}


def stats(name, xs, with_min_and_max=False):
    """Spinning Up's logger columns for one quantity, over every rank's samples."""
    keys = ["Average" + name, "Std" + name]
    keys += ["Min" + name, "Max" + name] if with_min_and_max else []
    try:
        values = mpi_statistics_scalar(np.array(xs), with_min_and_max)  # mean, std[, min, max]
        row = dict(zip(keys, (float(v) for v in values)))
    except NoSamplesError:  # e.g. no episode ended this epoch, on any rank
        row = dict.fromkeys(keys, float("nan"))
    return {k: row[k] for k in ["Average" + name, "Std" + name, "Max" + name, "Min" + name]
            if k in row}  # Spinning Up's column order


def write_progress(out, rows):
    """progress.txt from all the rows so far (tab-separated, as Spinning Up's)."""
    tmp = os.path.join(out, "progress.txt.tmp")
    with open(tmp, "w") as f:
        f.write("\t".join(rows[0]) + "\n")
        for row in rows:
            f.write("\t".join(repr(v) for v in row.values()) + "\n")
    os.replace(tmp, os.path.join(out, "progress.txt"))


def ppo(args, seed=0, gamma=0.99, clip_ratio=0.2, pi_lr=3e-4, vf_lr=1e-3, train_pi_iters=80,
        train_v_iters=80, lam=0.97, max_ep_len=1000, target_kl=0.01):
    setup_pytorch_for_mpi()
    seed += 10000 * proc_id()
    torch.manual_seed(seed)
    np.random.seed(seed)
    env = CartPole(seed)
    ac = MLPActorCritic(CartPole.obs_dim, CartPole.n_acts)
    sync_params(ac)
    local_steps = int(args.steps / num_procs())
    buf = PPOBuffer(CartPole.obs_dim, local_steps, gamma, lam)
    pi_optimizer = torch.optim.Adam(ac.logits_net.parameters(), lr=pi_lr)
    vf_optimizer = torch.optim.Adam(ac.v_net.parameters(), lr=vf_lr)

    ckpt_dir = os.path.join(args.out, "ckpt")
    o, start_epoch, rows = env.reset(), 0, []
    if args.resume or restart_attempt() > 0:
        ck = load_checkpoint(ckpt_dir)  # the newest one every rank can read; None: none yet
        if ck is not None and ck.world_size != num_procs():
            if proc_id() == 0:
                print("%s was saved by %d ranks, not %d: run with --cpu %d"
                      % (ck.path, ck.world_size, num_procs(), ck.world_size), file=sys.stderr)
            sys.exit(2)  # every rank
        if ck is None and proc_id() == 0:
            print("no checkpoint in %s: starting from epoch 0" % ckpt_dir, flush=True)
        if ck is not None:
            start_epoch, shared, mine = ck
            ac.load_state_dict(shared["ac"])
            pi_optimizer.load_state_dict(shared["pi_optimizer"])
            vf_optimizer.load_state_dict(shared["vf_optimizer"])
            rows = shared["rows"]
            env.state, o = mine["env_state"], mine["obs"]
            restore_rng(mine["rng"], env.rng)
            if proc_id() == 0:
                print("resumed from epoch %d" % start_epoch, flush=True)
                write_progress(args.out, rows)  # drops rows written after the checkpoint
    else:  # a fresh run: never resume from an older run's checkpoints
        if proc_id() == 0:
            shutil.rmtree(ckpt_dir, ignore_errors=True)
        barrier()

    def compute_loss_pi(data):
        obs, act, adv, logp_old = data["obs"], data["act"], data["adv"], data["logp"]
        pi = ac.distribution(obs)
        logp = pi.log_prob(act)
        ratio = torch.exp(logp - logp_old)
        clip_adv = torch.clamp(ratio, 1 - clip_ratio, 1 + clip_ratio) * adv
        loss_pi = -(torch.min(ratio * adv, clip_adv)).mean()
        clipped = ratio.gt(1 + clip_ratio) | ratio.lt(1 - clip_ratio)
        info = dict(kl=(logp_old - logp).mean().item(), ent=pi.entropy().mean().item(),
                    cf=torch.as_tensor(clipped, dtype=torch.float32).mean().item())
        return loss_pi, info

    def compute_loss_v(data):
        return ((ac.v(data["obs"]) - data["ret"]) ** 2).mean()

    def update():
        data = buf.get()
        pi_l_old, _ = compute_loss_pi(data)
        pi_l_old, v_l_old = pi_l_old.item(), compute_loss_v(data).item()
        for i in range(train_pi_iters):
            pi_optimizer.zero_grad()
            loss_pi, pi_info = compute_loss_pi(data)
            kl = mpi_avg(pi_info["kl"])
            if kl > 1.5 * target_kl:
                break  # early stopping at the KL limit
            loss_pi.backward()
            mpi_avg_grads(ac.logits_net)
            pi_optimizer.step()
        stop_iter = i
        for _ in range(train_v_iters):
            vf_optimizer.zero_grad()
            loss_v = compute_loss_v(data)
            loss_v.backward()
            mpi_avg_grads(ac.v_net)
            vf_optimizer.step()
        return dict(LossPi=mpi_avg(pi_l_old), LossV=mpi_avg(v_l_old),
                    DeltaLossPi=mpi_avg(loss_pi.item() - pi_l_old),
                    DeltaLossV=mpi_avg(loss_v.item() - v_l_old), Entropy=mpi_avg(pi_info["ent"]),
                    KL=mpi_avg(pi_info["kl"]), ClipFrac=mpi_avg(pi_info["cf"]),
                    StopIter=mpi_avg(stop_iter))

    ep_ret, ep_len = 0, 0
    for epoch in range(start_epoch, args.epochs):
        t0 = time.time()
        ep_rets, ep_lens, vvals = [], [], []
        for t in range(local_steps):
            a, v, logp = ac.step(torch.as_tensor(o, dtype=torch.float32))
            next_o, r, d = env.step(a)
            ep_ret, ep_len = ep_ret + r, ep_len + 1
            buf.store(o, a, r, v, logp)
            vvals.append(v)
            o = next_o
            timeout = ep_len == max_ep_len
            terminal = d or timeout
            epoch_ended = t == local_steps - 1
            if terminal or epoch_ended:
                if timeout or epoch_ended:  # cut off: bootstrap the value target
                    _, v, _ = ac.step(torch.as_tensor(o, dtype=torch.float32))
                else:
                    v = 0
                buf.finish_path(v)
                if terminal:
                    ep_rets.append(ep_ret)
                    ep_lens.append(ep_len)
                o, ep_ret, ep_len = env.reset(), 0, 0

        losses = update()
        row = dict(Epoch=epoch, **stats("EpRet", ep_rets, True),
                   EpLen=stats("EpLen", ep_lens)["AverageEpLen"], **stats("VVals", vvals, True),
                   TotalEnvInteracts=(epoch + 1) * args.steps, **losses)
        rows.append(row)
        if proc_id() == 0:
            write_progress(args.out, rows)
            print("epoch %3d  AverageEpRet %8.2f  LossV %9.4f  %.2f s"
                  % (epoch, row["AverageEpRet"], row["LossV"], time.time() - t0), flush=True)
        # Everything the next epoch depends on: on restart, the run goes on from here.
        save_checkpoint(ckpt_dir, epoch + 1, keep=2,
                        shared={"ac": ac.state_dict(), "pi_optimizer": pi_optimizer.state_dict(),
                                "vf_optimizer": vf_optimizer.state_dict(), "rows": rows},
                        per_rank={"env_state": env.state, "obs": o,
                                  "rng": capture_rng(env.rng)})

    if proc_id() == 0:
        torch.save(ac.state_dict(), os.path.join(args.out, "final.pt"))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu", type=int, default=2, help="MPI ranks (mpi_fork)")
    parser.add_argument("--restarts", type=int, default=0,
                        help="start the job again after a failure, up to K times")
    parser.add_argument("--epochs", type=int, default=50)
    parser.add_argument("--steps", type=int, default=1000,
                        help="environment steps per epoch, all ranks together")
    parser.add_argument("--out", default="ppo_out", help="progress.txt, final.pt and ckpt/ go here")
    parser.add_argument("--resume", action="store_true",
                        help="resume from DIR/ckpt (a restarted job always does)")
    args = parser.parse_args()
    mpi_fork(args.cpu, restarts=args.restarts)
    os.makedirs(args.out, exist_ok=True)
    ppo(args)
