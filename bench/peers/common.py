"""Shared by the Python peers: the timing protocol of bench/bench_common.hpp,
the benchmark models and JSON-line output.

The protocol: every variant runs once, then in batches of 1, 2, 4, ... calls,
each call timed alone, until at least 8 calls and one round's time have passed
(or four rounds' time: slow calls); the estimate is the slowest rank's median
call; iterations per round = round target / estimate, clamped to [1, max].
Then rounds (fewer, at least 3, when they would exceed the time budget): each
round runs every variant (order rotated round by round), each as barrier,
`iters` calls, per-call time on each rank, max over ranks. Reported: median
and minimum over rounds, in microseconds.
"""
import json
import os
import sys
import time

import numpy as np
import torch
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "seed"))


class Variant:
    def __init__(self, name, fn, barrier_each=False):
        self.name = name
        self.fn = fn
        self.barrier_each = barrier_each


def _time_calls(comm, v, n):
    comm.barrier()
    if v.barrier_each:
        total = 0.0
        for _ in range(n):
            t0 = time.perf_counter()
            v.fn()
            total += time.perf_counter() - t0
            comm.barrier()
        return total / n
    t0 = time.perf_counter()
    for _ in range(n):
        v.fn()
    return (time.perf_counter() - t0) / n


def _warm_calls(comm, v, n, times):
    """n calls, each timed alone: appends them to times, returns the total."""
    comm.barrier()
    total = 0.0
    for _ in range(n):
        t0 = time.perf_counter()
        v.fn()
        dt = time.perf_counter() - t0
        times.append(dt)
        total += dt
        if v.barrier_each:
            comm.barrier()
    return total


def measure(comm, variants, rounds=7, round_seconds=0.02, min_iters=1, max_iters=20000,
            budget_seconds=20.0):
    """comm: object with barrier() and max(float) -> float over ranks."""
    iters = []
    round_cost = 0.0
    for v in variants:
        _warm_calls(comm, v, 1, [])
        times, spent, calls, n = [], 0.0, 0, 1
        while True:  # spent is the same on every rank: all leave together
            spent += comm.max(_warm_calls(comm, v, n, times))
            calls += n
            if (calls >= 8 and spent >= round_seconds) or spent >= 4 * round_seconds \
                    or calls >= max_iters:
                break
            n *= 2
        est = max(comm.max(float(np.median(times))), 1e-9)
        iters.append(int(min(max(round_seconds / est, min_iters), max_iters)))
        round_cost += iters[-1] * est
    rounds = int(min(max(budget_seconds / round_cost, min(3, rounds)), rounds))
    samples = [[] for _ in variants]
    for r in range(rounds):
        for k in range(len(variants)):
            i = (k + r) % len(variants)
            samples[i].append(comm.max(_time_calls(comm, variants[i], iters[i])))
    out = []
    for v, it, s in zip(variants, iters, samples):
        out.append({"impl": v.name, "iters": it, "rounds": rounds,
                    "median_us": float(np.median(s)) * 1e6, "min_us": float(min(s)) * 1e6})
    return out


def emit(rank, suite, bench, ranks, timing, **extra):
    if rank != 0:
        return
    d = {"suite": suite, "bench": bench, "impl": timing["impl"], "ranks": ranks}
    d.update({k: timing[k] for k in ("iters", "rounds", "median_us", "min_us")})
    d.update(extra)
    print(json.dumps(d), flush=True)


def median(xs):
    """The upper median of xs (the middle element once sorted)."""
    return sorted(xs)[len(xs) // 2]


def arg(name, default):
    key = "--" + name + "="
    for a in sys.argv[1:]:
        if a.startswith(key):
            return a[len(key):]
    return default


# ------------------------------------------------------------------ models
# Spinning Up's MLPActorCritic (Gaussian policy), as in spinup/algos/pytorch/ppo/core.py.

def mlp(sizes, activation, output_activation=nn.Identity):
    layers = []
    for j in range(len(sizes) - 1):
        act = activation if j < len(sizes) - 2 else output_activation
        layers += [nn.Linear(sizes[j], sizes[j + 1]), act()]
    return nn.Sequential(*layers)


class MLPGaussianActor(nn.Module):
    def __init__(self, obs_dim, act_dim, hidden_sizes, activation):
        super().__init__()
        log_std = -0.5 * np.ones(act_dim, dtype=np.float32)
        self.log_std = torch.nn.Parameter(torch.as_tensor(log_std))
        self.mu_net = mlp([obs_dim] + list(hidden_sizes) + [act_dim], activation)


class MLPCritic(nn.Module):
    def __init__(self, obs_dim, hidden_sizes, activation):
        super().__init__()
        self.v_net = mlp([obs_dim] + list(hidden_sizes) + [1], activation)


class MLPActorCritic(nn.Module):
    def __init__(self, obs_dim=17, act_dim=6, hidden_sizes=(64, 64), activation=nn.Tanh):
        super().__init__()
        self.pi = MLPGaussianActor(obs_dim, act_dim, hidden_sizes, activation)
        self.v = MLPCritic(obs_dim, hidden_sizes, activation)


def resnet50_shapes():
    """torchvision's resnet50() parameter shapes, in named_parameters() order:
    161 tensors, 25,557,032 values."""
    shapes = [("conv1.weight", (64, 3, 7, 7)), ("bn1.weight", (64,)), ("bn1.bias", (64,))]
    inplanes = 64
    for li, (planes, blocks) in enumerate([(64, 3), (128, 4), (256, 6), (512, 3)], 1):
        for b in range(blocks):
            pre = "layer%d.%d." % (li, b)
            shapes += [(pre + "conv1.weight", (planes, inplanes, 1, 1)),
                       (pre + "bn1.weight", (planes,)), (pre + "bn1.bias", (planes,)),
                       (pre + "conv2.weight", (planes, planes, 3, 3)),
                       (pre + "bn2.weight", (planes,)), (pre + "bn2.bias", (planes,)),
                       (pre + "conv3.weight", (planes * 4, planes, 1, 1)),
                       (pre + "bn3.weight", (planes * 4,)), (pre + "bn3.bias", (planes * 4,))]
            if b == 0:
                shapes += [(pre + "downsample.0.weight", (planes * 4, inplanes, 1, 1)),
                           (pre + "downsample.1.weight", (planes * 4,)),
                           (pre + "downsample.1.bias", (planes * 4,))]
            inplanes = planes * 4
    shapes += [("fc.weight", (1000, 2048)), ("fc.bias", (1000,))]
    return shapes


class ParameterSet(nn.Module):
    """A module holding only the given parameters (no forward)."""

    def __init__(self, shapes):
        super().__init__()
        self.params = nn.ParameterList([nn.Parameter(torch.zeros(s)) for _, s in shapes])


def make_model(name):
    if name == "ac64":
        return MLPActorCritic(hidden_sizes=(64, 64))
    if name == "ac256":
        return MLPActorCritic(hidden_sizes=(256, 256))
    if name == "resnet50":
        return ParameterSet(resnet50_shapes())
    raise ValueError(name)


MODEL_LABELS = {
    "ac64": "actor-critic obs 17, act 6, hidden (64,64)",
    "ac256": "actor-critic obs 17, act 6, hidden (256,256)",
    "resnet50": "ResNet-50 parameter set",
}


def fill(model, rank):
    """Rank-dependent values and gradients, reproducible."""
    g = torch.Generator().manual_seed(1000 + rank)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
            p.grad = torch.randn(p.shape, generator=g)


def model_info(model):
    params = list(model.parameters())
    return {"tensors": len(params), "values": int(sum(p.numel() for p in params)),
            "bytes": int(sum(p.numel() * p.element_size() for p in params))}


def bench_avg(comm, rank, size, impl, mpi_avg, rounds, round_s):
    """mpi_avg of a float scalar (PPO's approximate KL) and of 1000 float32."""
    scalar = float(rank) + 0.5
    vec = (np.arange(1000) + rank).astype(np.float32)
    for elements, x in ((1, scalar), (1000, vec)):
        v = Variant(impl, lambda: mpi_avg(x))
        for t in measure(comm, [v], rounds, round_s):
            emit(rank, "mpi_avg", "mpi_avg", size, t, elements=elements)
