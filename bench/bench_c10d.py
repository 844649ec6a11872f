"""torch.distributed: the "mpiml" backend against Gloo, side by side in one run.

  mpirun -np 2 /usr/bin/python3 bench/bench_c10d.py [--max-bytes=67108864] [--rounds=5]
      [--round-ms=50] [--parts=sweep,ddp] [--sizes=4,33554432] [--gloo=0]

The default group is "mpiml"; a Gloo group over the same ranks is created
with new_group(backend="gloo"). Parts:
  sweep  dist.all_reduce (SUM, float32, in place) from 4 B to max-bytes
         (x4 steps to 16 MiB, then x2), or only the byte counts of --sizes
  ddp    one DistributedDataParallel training step (zero_grad, forward,
         backward with DDP's bucketed all_reduce overlapped, default 25 MiB
         buckets) on Spinning Up's (64,64) MLP actor-critic and on the
         ResNet-50-sized parameter set (161 tensors, 25.6 M float32); the
         same step on the bare module, without DDP, is measured too, and
         "comm" is the DDP step minus the bare step; "nocomm" is DDP with
         a communication hook that returns the bucket untouched (DDP's own
         bucket copies, no all_reduce). Each DDP variant runs twice: with
         DDP's defaults and with gradient_as_bucket_view=True (" views":
         gradients are views into the buckets, so DDP copies nothing).
Rank 0 prints JSON lines; times are the slowest rank's, median of rounds
(bench/peers/common.py's protocol).
"""
import datetime
import json
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "peers"))
import common  # noqa: E402

import mpiml.torch  # noqa: E402


class Comm:
    """Timing protocol's barrier and max, over the mpiml default group."""

    def barrier(self):
        dist.barrier()

    def max(self, x):
        t = torch.tensor([x], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t[0])


class Step(nn.Module):
    """A scalar loss over the model's parameters, so backward fills every gradient."""

    def __init__(self, model, name):
        super().__init__()
        self.model = model
        self.name = name

    def forward(self, x):
        if self.name == "resnet50":
            return sum(p.sum() for p in self.model.parameters()) * x.sum()
        pi, v = self.model.pi, self.model.v
        return pi.mu_net(x).sum() + v.v_net(x).sum() + pi.log_std.sum()


def no_comm_hook(state, bucket):
    """DDP with its bucket copies but no communication: the bucket as is."""
    fut = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def main():
    max_bytes = int(common.arg("max-bytes", 64 << 20))
    rounds = int(common.arg("rounds", 5))
    round_s = float(common.arg("round-ms", 50)) / 1000
    parts = common.arg("parts", "sweep,ddp").split(",")
    with_gloo = common.arg("gloo", "1") != "0"
    torch.set_num_threads(1)
    mpiml.torch.init_process_group(timeout=datetime.timedelta(seconds=300))
    rank, n = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    comm = Comm()
    if rank == 0:
        print(json.dumps({"suite": "c10d", "torch": torch.__version__, "ranks": n}), flush=True)

    if "sweep" in parts:
        sizes, size = [], 4
        while size <= max_bytes:
            sizes.append(size)
            size *= 4 if size < (16 << 20) else 2
        if common.arg("sizes", ""):
            sizes = [int(float(s)) for s in common.arg("sizes", "").split(",")]
        for size in sizes:
            t_m = torch.ones(size // 4)
            t_g = torch.ones(size // 4)
            variants = [common.Variant("mpiml", lambda: dist.all_reduce(t_m))]
            if with_gloo:
                variants.append(common.Variant("gloo", lambda: dist.all_reduce(t_g, group=gloo)))
            res = common.measure(comm, variants, rounds=rounds, round_seconds=round_s,
                                 budget_seconds=6.0)
            for r in res:
                common.emit(rank, "c10d", "all_reduce", n, r, bytes=size)

    if "ddp" in parts:
        for name in ("ac64", "resnet50"):
            x = torch.randn(64, 17) if name == "ac64" else torch.ones(1)
            variants = []
            keep = []
            configs = [("local", None, False)]
            for views in (False, True):
                suffix = " views" if views else ""
                configs += [("nocomm" + suffix, None, views), ("mpiml" + suffix, None, views),
                            ("gloo" + suffix, gloo, views)]
            for impl, group, views in configs:
                torch.manual_seed(0)
                model = Step(common.make_model(name), name)
                if impl != "local":
                    model = DDP(model, process_group=group, gradient_as_bucket_view=views)
                if impl.startswith("nocomm"):
                    model.register_comm_hook(None, no_comm_hook)
                keep.append(model)

                def step(model=model):
                    model.zero_grad(set_to_none=False)
                    model(x).backward()
                variants.append(common.Variant(impl, step))
            res = common.measure(comm, variants, rounds=rounds, round_seconds=round_s,
                                 budget_seconds=20.0)
            info = common.model_info(keep[0].model)
            local = res[0]["median_us"]
            for r in res:
                extra = dict(info, model=name)
                if r["impl"] != "local":
                    extra["comm_us"] = r["median_us"] - local
                common.emit(rank, "c10d", "ddp_step", n, r, **extra)
    dist.barrier()


if __name__ == "__main__":
    main()
