"""GradAverager(overlap=True) (also with gradient_as_bucket_view=True) against
GradAverager() and PyTorch DDP (on Gloo and on the "mpiml" torch.distributed
backend), on the training step of the same large model as bench_overlap.cpp,
from Python.

  mpirun -np 2 /usr/bin/python3 bench/bench_overlap.py [--resnet50=1 [--image=96]]
      [--layers=8] [--width=2048] [--batch=64] [--steps=10] [--threads=1]

Every variant has its own copy of the model and takes the same data; their
steps (zero_grad, forward, backward, the averager's call, SGD step) alternate
so all see the same machine load. DDP runs with its defaults (25 MiB buckets,
overlapped). Rank 0 prints the median over steps of the slowest rank's time
and of the busiest rank's CPU time (user + system, all of its threads); for
GradAverager(overlap=True) also what its call after backward() waited and its
thread's time in the buckets (overlap_stats(); hidden: the least rank's).
"""
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "peers"))
import common  # noqa: E402

import mpiml.torch  # noqa: E402
from mpiml import mpi_pytorch as mp  # noqa: E402


def mlp(layers, width):
    torch.manual_seed(3)
    mods = []
    for i in range(layers):
        mods.append(nn.Linear(width, width))
        if i + 1 < layers:
            mods.append(nn.ReLU())
    return nn.Sequential(*mods)


class Bottleneck(nn.Module):
    """ResNet-50's block, as bench_overlap.cpp builds it."""

    def __init__(self, cin, width, stride):
        super().__init__()
        cout = width * 4
        self.body = nn.Sequential(
            nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
            nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
            nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout))
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        return torch.relu(self.body(x) + (x if self.down is None else self.down(x)))


def resnet50():
    torch.manual_seed(3)
    mods = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for b in range(blocks):
            mods.append(Bottleneck(cin, width, stride if b == 0 else 1))
            cin = width * 4
    mods += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, 1000)]
    return nn.Sequential(*mods)


def slowest(*ts):
    """Each value's maximum over the ranks (one allreduce for all)."""
    x = torch.tensor(ts, dtype=torch.float64)
    dist.all_reduce(x, op=dist.ReduceOp.MAX)
    return float(x[0]) if len(ts) == 1 else [float(v) for v in x]


def main():
    layers, width = int(common.arg("layers", 8)), int(common.arg("width", 2048))
    resnet, image = int(common.arg("resnet50", 0)) != 0, int(common.arg("image", 96))

    def model():
        return resnet50() if resnet else mlp(layers, width)

    batch, steps = int(common.arg("batch", 64)), int(common.arg("steps", 10))
    torch.set_num_threads(int(common.arg("threads", 1)))
    mpiml.torch.init_process_group(timeout=datetime.timedelta(seconds=600))
    rank, n = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")

    variants = {}  # name: (module to run, call after backward or None)
    m = model()
    variants["compute only"] = (m, None)
    m = model()
    variants["GradAverager"] = (m, mp.GradAverager(m))
    m = model()
    variants["GradAverager overlap"] = (m, mp.GradAverager(m, overlap=True))
    m = model()
    variants["overlap, bucket views"] = (m, mp.GradAverager(m, overlap=True, gradient_as_bucket_view=True))
    variants["DDP gloo"] = (DDP(model(), process_group=gloo), None)
    variants["DDP mpiml"] = (DDP(model()), None)
    opts = {k: torch.optim.SGD(v[0].parameters(), lr=1e-3) for k, v in variants.items()}
    times = {k: [] for k in variants}
    cpus = {k: [] for k in variants}  # CPU time (user + system, all threads) a step
    left, averaging, hidden = [], [], []  # GradAverager overlap: its call, its thread
    torch.manual_seed(100 + rank)
    for step in range(-1, steps):  # -1: warm-up
        if resnet:
            x, y = torch.randn(batch, 3, image, image), torch.randint(0, 1000, (batch,))
            loss = nn.functional.cross_entropy
        else:
            x, y = torch.randn(batch, width), torch.randn(batch, width)
            loss = nn.functional.mse_loss
        for k, (model, avg) in variants.items():
            dist.barrier()
            c0, t0 = time.process_time(), time.perf_counter()
            opts[k].zero_grad()
            loss(model(x), y).backward()
            t1 = time.perf_counter()
            if avg is not None:
                avg()
            t2 = time.perf_counter()
            opts[k].step()
            t, c = slowest(time.perf_counter() - t0, time.process_time() - c0)
            if step >= 0:
                times[k].append(t)
                cpus[k].append(c)
                if k == "GradAverager overlap":
                    st = avg.overlap_stats()
                    lt, at, nh = slowest(t2 - t1, st["averaging_s"], -st["hidden_s"])
                    left.append(lt)
                    averaging.append(at)
                    hidden.append(-nh)  # the least hidden
    params = sum(p.numel() for p in variants["compute only"][0].parameters())
    a = [p for p in variants["GradAverager"][0].parameters()]
    b = [p for p in variants["GradAverager overlap"][0].parameters()]
    c = [p for p in variants["overlap, bucket views"][0].parameters()]
    same = all(torch.equal(p, q) and torch.equal(p, r) for p, q, r in zip(a, b, c))
    same = -slowest(-float(same)) == 1  # on every rank
    if rank == 0:
        what = f"ResNet-50, images {image} x {image}" if resnet else f"MLP {layers} x ({width} x {width})"
        print(f"# bench_overlap.py: {n} ranks, {what}, "
              f"{params / 1e6:.1f} M float32, batch {batch}/rank, {steps} steps, "
              f"{torch.get_num_threads()} intra-op threads, torch {torch.__version__}")
        med = {k: common.median(v) for k, v in times.items()}
        for k, v in med.items():
            print(f"step, {k:<24} {v * 1e3:8.1f} ms (CPU {common.median(cpus[k]) * 1e3:.0f} ms)")
            if k == "GradAverager overlap":
                print(f"  left at the call             {common.median(left) * 1e3:8.1f} ms")
                print(f"  averaging on its thread      {common.median(averaging) * 1e3:8.1f} ms "
                      f"(hidden {common.median(hidden) * 1e3:.1f} ms)")
        print(f"GradAverager overlap vs without: {med['GradAverager'] / med['GradAverager overlap']:.2f}x; "
              f"vs DDP gloo: {med['DDP gloo'] / med['GradAverager overlap']:.2f}x; "
              f"vs DDP mpiml: {med['DDP mpiml'] / med['GradAverager overlap']:.2f}x")
        print(f"with bucket views: {med['GradAverager'] / med['overlap, bucket views']:.2f}x; "
              f"vs DDP gloo: {med['DDP gloo'] / med['overlap, bucket views']:.2f}x")
        print(f"GradAverager with and without overlap bit-identical: {'yes' if same else 'NO'}")
    del variants
    dist.barrier()
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
