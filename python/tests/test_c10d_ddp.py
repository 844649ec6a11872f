"""DistributedDataParallel and ZeroRedundancyOptimizer on the "mpiml" backend:
N ranks each on 1/N of a batch train like one process on the whole batch."""

import copy

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

import mpiml.torch
from c10d_fixtures import world  # noqa: F401 (pytest fixtures)


class Net(nn.Module):
    def __init__(self, unused=False):
        super().__init__()
        self.a = nn.Linear(8, 16)
        self.b = nn.Linear(16, 4)
        self.spare = nn.Linear(16, 4) if unused else None
        self.register_buffer("scale", torch.ones(4))

    def forward(self, x):
        return self.b(torch.tanh(self.a(x))) * self.scale


def batch(step, n_ranks):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(6 * n_ranks, 8, generator=g), torch.randn(6 * n_ranks, 4, generator=g)


def train(world, steps=4, hook=None, unused=False, bucket_view=False, accumulate=1,
          zero=False):
    rank, n = world
    torch.manual_seed(0)
    ref = Net(unused)
    torch.manual_seed(rank + 1)  # DDP must broadcast rank 0's parameters and buffers
    local = Net(unused)
    with torch.no_grad():
        local.scale.fill_(float(rank + 1))
    if rank == 0:
        local.load_state_dict(ref.state_dict())
    model = DDP(local, find_unused_parameters=unused, gradient_as_bucket_view=bucket_view,
                bucket_cap_mb=0.001)
    if hook is not None:
        model.register_comm_hook(None, hook)
    if zero:
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.SGD, lr=0.1)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    loss_fn = nn.MSELoss()
    for step in range(steps):
        opt.zero_grad()
        ref_opt.zero_grad()
        for micro in range(accumulate):
            x, y = batch(step * 10 + micro, n)
            mine = slice(rank * 6, (rank + 1) * 6)
            if micro < accumulate - 1:
                with model.no_sync():
                    (loss_fn(model(x[mine]), y[mine]) / accumulate).backward()
            else:
                (loss_fn(model(x[mine]), y[mine]) / accumulate).backward()
            (loss_fn(ref(x), y) / accumulate).backward()
        opt.step()
        ref_opt.step()
    for (name, p), q in zip(model.module.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=name)
    assert torch.equal(model.module.scale, torch.ones(4))  # rank 0's buffer
    # every rank holds bit-identical parameters
    for p in model.parameters():
        every = [torch.empty_like(p) for _ in range(n)]
        dist.all_gather(every, p.detach())
        assert all(torch.equal(e, p) for e in every)
    return model


def test_ddp_equals_one_process(world):
    train(world)


def test_ddp_gradient_as_bucket_view(world):
    train(world, bucket_view=True)


def test_ddp_find_unused_parameters(world):
    model = train(world, unused=True)
    assert model.module.spare.weight.grad is None or model.module.spare.weight.grad.abs().sum() == 0


def test_ddp_no_sync_accumulation(world):
    train(world, accumulate=2)


def test_ddp_comm_hooks(world):
    train(world, hook=default_hooks.allreduce_hook)

    def python_hook(state, bucket):
        t = bucket.buffer().div_(dist.get_world_size())
        return dist.all_reduce(t, async_op=True).get_future().then(lambda f: f.value()[0])
    train(world, hook=python_hook)


def test_ddp_fp16_compress_hook(world):
    rank, n = world
    torch.manual_seed(0)
    model = DDP(Net())
    model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    x, y = batch(0, n)
    nn.MSELoss()(model(x[rank * 6:(rank + 1) * 6]), y[rank * 6:(rank + 1) * 6]).backward()
    for p in model.parameters():
        every = [torch.empty_like(p.grad) for _ in range(n)]
        dist.all_gather(every, p.grad)
        assert all(torch.equal(e, p.grad) for e in every)


def test_zero_redundancy_optimizer(world):
    train(world, zero=True)
