"""Large allreduces on backend "mpiml" through MPI (run with MPIML_SHM=off):
from 8 MiB on the worker waits quietly and sums by mpiml's own allreduce, as
GradAverager's communication thread. Results against a Gloo group's, the
same bits on every rank, slices that do not divide evenly, DDP."""

import copy

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import mpiml.torch  # noqa: F401 (registers "mpiml")
from c10d_fixtures import world, gloo  # noqa: F401 (pytest fixtures)

R = dist.ReduceOp
N = (1 << 21) + 5  # float32: just over 8 MiB, not a multiple of 2 or 3 ranks


def same_everywhere(t):
    every = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(every, t)
    return all(torch.equal(e, t) for e in every)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int32, torch.int64], ids=str)
@pytest.mark.parametrize("op", [R.SUM, R.AVG, R.MAX], ids=str)
def test_large_all_reduce_matches_gloo(world, gloo, dtype, op):
    rank, n = world
    if op == R.AVG and not dtype.is_floating_point:
        pytest.skip("Gloo has no AVG")
    gen = torch.Generator().manual_seed(7 + rank)
    x = torch.randint(-1000, 1000, (N,), generator=gen).to(dtype)  # exact in every order
    got, want = x.clone(), x.clone()
    dist.all_reduce(got, op=op)
    if op == R.AVG:
        dist.all_reduce(want, op=R.SUM, group=gloo)
        want /= n
    else:
        dist.all_reduce(want, op=op, group=gloo)
    assert torch.equal(got, want)
    assert same_everywhere(got)


def test_large_random_floats_same_bits_on_every_rank(world, gloo):
    rank, n = world
    gen = torch.Generator().manual_seed(11 + rank)
    x = torch.randn(N, generator=gen)
    a, b, g = x.clone(), x.clone(), x.clone()
    dist.all_reduce(a)
    dist.all_reduce(b)
    dist.all_reduce(g, group=gloo)
    assert torch.equal(a, b)  # run to run
    assert same_everywhere(a)
    if n == 2:
        assert torch.equal(a, g)  # a + b: one rounding, any order
    else:
        torch.testing.assert_close(a, g)


def test_large_non_contiguous_and_small_after(world):
    rank, n = world
    big = torch.full((N, 2), float(rank + 1))[:, 0]
    assert not big.is_contiguous()
    dist.all_reduce(big)
    assert torch.equal(big, torch.full((N,), float(n * (n + 1) // 2)))
    small = torch.full((5,), float(rank))  # below the threshold, after a quiet one
    dist.all_reduce(small)
    assert torch.equal(small, torch.full((5,), float(n * (n - 1) // 2)))


def test_ddp_with_large_buckets_matches_gloo(world, gloo):
    rank, n = world
    torch.manual_seed(0)
    # Two buckets of just over 8 MiB (a weight and its bias each).
    base = nn.Sequential(nn.Linear(1024, 2048), nn.ReLU(), nn.Linear(2048, 1024))
    a = DDP(copy.deepcopy(base), bucket_cap_mb=8)
    b = DDP(copy.deepcopy(base), process_group=gloo, bucket_cap_mb=8)
    gen = torch.Generator().manual_seed(100 + rank)
    x = torch.randint(-3, 4, (8, 1024), generator=gen).float()
    for m in (a, b):
        m(x).sum().backward()
    for p, q in zip(a.parameters(), b.parameters()):
        if n == 2:
            assert torch.equal(p.grad, q.grad)
        else:
            torch.testing.assert_close(p.grad, q.grad)
        assert same_everywhere(p.grad)
