"""Checkpoints of a DistributedDataParallel model and a ZeroRedundancyOptimizer
(Adam) on the "mpiml" backend: a run resumed from a checkpoint continues
exactly as the uninterrupted run."""
import shutil
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

import mpiml.torch
from c10d_fixtures import world  # noqa: F401 (pytest fixtures)
from mpiml.checkpoint import (capture_rng, load_checkpoint, restore_rng, save_checkpoint,
                              wait_for_removals)


@pytest.fixture
def ckdir(world):
    path = [tempfile.mkdtemp(prefix="mpiml-ddpckpt-") if world[0] == 0 else None]
    dist.broadcast_object_list(path, src=0)
    yield path[0]
    wait_for_removals()
    dist.barrier()
    if world[0] == 0:
        shutil.rmtree(path[0])


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 16)
        self.bn = nn.BatchNorm1d(16)
        self.b = nn.Linear(16, 4)

    def forward(self, x):
        return self.b(torch.relu(self.bn(self.a(x))))


def train(ddp, opt, steps):
    for _ in range(steps):
        x = torch.randn(6, 8)  # each rank's own batch, from its own generator
        opt.zero_grad()
        (ddp(x) ** 2).mean().backward()
        opt.step()


def make(seed):
    torch.manual_seed(seed)
    ddp = DDP(Net())
    opt = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.Adam, lr=1e-2)
    return ddp, opt


def test_ddp_and_zero_resume_as_the_uninterrupted_run(world, ckdir):
    rank, _ = world
    ddp, opt = make(0)
    torch.manual_seed(100 + rank)
    train(ddp, opt, 3)
    opt.consolidate_state_dict(to=0)  # collective: the whole optimizer state on rank 0
    shared = {"model": ddp.module.state_dict(), "optimizer": opt.state_dict()} if rank == 0 else None
    save_checkpoint(ckdir, 3, shared=shared, per_rank={"rng": capture_rng()})
    train(ddp, opt, 3)
    want = [t.detach().clone() for t in ddp.module.state_dict().values()]

    ddp2, opt2 = make(7)
    torch.manual_seed(999)
    step, shared, per_rank = load_checkpoint(ckdir)
    assert step == 3
    ddp2.module.load_state_dict(shared["model"])
    opt2.load_state_dict(shared["optimizer"])  # each rank keeps its own shard
    restore_rng(per_rank["rng"])
    train(ddp2, opt2, 3)
    got = list(ddp2.module.state_dict().values())
    assert all(torch.equal(a, b) for a, b in zip(got, want))
