"""GradAverager(overlap=True) from Python: n ranks on 1/n of the batch each
equal one process on the whole batch, and bit for bit GradAverager without
overlap, with a parameter no rank uses, one only rank 0 uses, a parameter used
twice, and gradient accumulation under no_sync(); with gradient_as_bucket_view
too."""
import copy
import os
import socket
import time

import pytest
import torch
from mpi4py import MPI
from torch import nn

import mpiml
from mpiml import mpi_pytorch as mp

RANK, SIZE = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(7)
        self.l1 = nn.Linear(5, 16)
        self.tied = nn.Parameter(torch.randn(16, 16) * 0.3)
        self.l2 = nn.Linear(16, 2)
        self.only0 = nn.Linear(16, 2)  # on rank 0's shard only
        self.never = nn.Linear(16, 3)  # no rank uses it
        self.scale = nn.Parameter(torch.ones((), dtype=torch.float64))

    def forward(self, x, use_only0):
        h = torch.tanh(self.l1(x))
        h = torch.tanh(h @ self.tied)
        h = torch.tanh(h @ self.tied.t())  # used twice
        out = self.l2(h)
        if use_only0:
            out = out + self.only0(h)
        return out * self.scale.to(out.dtype)


def loss(net, x, y, use_only0, micro):
    return nn.functional.mse_loss(net(x, use_only0), y) / micro


@pytest.mark.parametrize("cap_mb,micro,as_view", [
    (25, 1, False), (64 / 2**20, 1, False), (1024 / 2**20, 2, False),
    (25, 1, True), (1024 / 2**20, 2, True)])
def test_equals_one_process_and_bit_for_bit_without_overlap(cap_mb, micro, as_view):
    batch, steps = 12, 5
    per = batch // SIZE
    part = per // micro
    torch.manual_seed(99)
    x, y = torch.randn(batch, 5), torch.randn(batch, 2)
    over, plain, ref = Net(), Net(), Net()
    over_avg = mp.GradAverager(over, bucket_cap_mb=cap_mb, overlap=True, overlap_on_one_node=True,
                               gradient_as_bucket_view=as_view)
    homes = None  # with views: where the gradients live from the second step on
    plain_avg = mp.GradAverager(plain, bucket_cap_mb=cap_mb)
    opts = [torch.optim.Adam(m.parameters(), lr=1e-2) for m in (over, plain, ref)]
    for step in range(steps):
        for o in opts[:2]:
            o.zero_grad()
        for m in range(micro):
            sl = slice(RANK * per + m * part, RANK * per + (m + 1) * part)
            if m + 1 < micro:
                with over_avg.no_sync():
                    loss(over, x[sl], y[sl], RANK == 0, micro).backward()
            else:
                loss(over, x[sl], y[sl], RANK == 0, micro).backward()
            loss(plain, x[sl], y[sl], RANK == 0, micro).backward()
        over_avg()
        plain_avg()
        for (name, p), q in zip(over.named_parameters(), plain.parameters()):
            assert (p.grad is None) == (q.grad is None), name
            if p.grad is not None:
                assert torch.equal(p.grad, q.grad), (name, step)
        assert over.never.weight.grad is None and over.only0.weight.grad is not None
        if as_view and step >= 1:  # averaged in place, never packed or moved again
            now = [p.grad.data_ptr() if p.grad is not None else 0 for p in over.parameters()]
            assert homes is None or now == homes, step
            homes = now
        opts[0].step()
        opts[1].step()
        opts[2].zero_grad()
        for r in range(SIZE):
            for m in range(micro):
                sl = slice(r * per + m * part, r * per + (m + 1) * part)
                (loss(ref, x[sl], y[sl], r == 0, micro) / SIZE).backward()
        opts[2].step()
    for p, q, s in zip(over.parameters(), plain.parameters(), ref.parameters()):
        assert torch.equal(p, q)
        torch.testing.assert_close(p, s, rtol=1e-5, atol=1e-5)
    assert any((p - q).abs().max() > 1e-3 for p, q in zip(over.parameters(), Net().parameters()))
    del over_avg, plain_avg  # collective: at the same point on every rank


def test_failure_on_the_communication_thread_names_the_rank():
    # Parameters that differ across ranks (not compared at construction with
    # the checks off): the bucket's collective fails on every rank, on the
    # communication thread, and the call raises it.
    was = mpiml.check_enabled()
    mpiml.set_check(False)
    p = nn.Parameter(torch.ones(5 if RANK == 1 else 4))
    avg = mp.GradAverager([p], overlap=True, overlap_on_one_node=True)
    mpiml.set_check(was)
    (p * 2).sum().backward()
    with pytest.raises(mpiml.Error, match=r"on rank %d/%d: .*different" % (RANK, SIZE)):
        avg()
    p2 = nn.Parameter(torch.ones(4))
    avg2 = mp.GradAverager([p2], overlap=True, overlap_on_one_node=True)
    (p2 * RANK).sum().backward()
    avg2()  # a new averager works everywhere
    torch.testing.assert_close(p2.grad, torch.full((4,), (SIZE - 1) / 2))
    del avg, avg2


def test_overlap_stats_show_where_the_averaging_went():
    torch.manual_seed(8)
    net = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64), nn.Linear(64, 64))
    assert mp.GradAverager(net).overlap_stats()["steps"] == 0  # without overlap: zeros
    avg = mp.GradAverager(net, overlap=True, overlap_on_one_node=True,
                          bucket_cap_mb=8 * 1024 / 2**20)  # a bucket a tensor
    assert avg.overlap_stats() == dict(steps=0, buckets=0, averaging_s=0.0, hidden_s=0.0, left_s=0.0)
    MPI.COMM_WORLD.Barrier()
    net(torch.randn(8, 64)).square().sum().backward()
    time.sleep(0.5)  # the buckets are averaged meanwhile
    avg()
    s = avg.overlap_stats()
    assert s["steps"] == 1 and s["buckets"] == 6
    assert 0 < s["hidden_s"] <= s["averaging_s"]
    avg()  # no backward(): the call runs every bucket itself
    s = avg.overlap_stats()
    assert s["steps"] == 2 and s["buckets"] == 6
    assert s["hidden_s"] == 0 and s["left_s"] >= s["averaging_s"] > 0
    del avg


def test_on_one_node_overlap_averages_at_the_call():
    # Every rank on one host: overlap=True averages in avg() (no plan, no
    # bucket on the thread), the same bits as overlap_on_one_node=True, which
    # overlaps there too.
    if SIZE == 1:
        pytest.skip("one rank: nothing to average")
    hosts = set(MPI.COMM_WORLD.allgather(socket.gethostname()))
    if len(hosts) > 1 or int(os.environ.get("MPIML_NODE_SPLIT") or 0):
        pytest.skip("ranks on more than one node")

    def make():
        torch.manual_seed(3)
        return nn.Sequential(nn.Linear(16, 16), nn.Linear(16, 16))
    a, b = make(), make()
    at_call = mp.GradAverager(a, overlap=True, bucket_cap_mb=1024 / 2**20)
    overlapped = mp.GradAverager(b, overlap=True, overlap_on_one_node=True, bucket_cap_mb=1024 / 2**20)
    assert at_call.bucket_plan() == [] and overlapped.bucket_plan() != []
    torch.manual_seed(10 + RANK)
    x = torch.randn(4, 16)
    a(x).square().sum().backward()
    at_call()
    b(x).square().sum().backward()
    overlapped()
    assert at_call.overlap_stats()["steps"] == 0 and overlapped.overlap_stats()["steps"] == 1
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa.grad, pb.grad)
    del at_call, overlapped


def test_no_sync_is_a_context_manager_without_overlap_too():
    p = nn.Parameter(torch.ones(4))
    for overlap in (False, True):
        p.grad = None
        avg = mp.GradAverager([p], overlap=overlap, overlap_on_one_node=True)
        with avg.no_sync():
            (p * RANK).sum().backward()
        (p * 1.0).sum().backward()
        avg()
        torch.testing.assert_close(p.grad, torch.full((4,), (SIZE - 1) / 2 + 1.0))
        del avg


@pytest.mark.parametrize("option,mine,last_has", [
    ("overlap", dict(overlap=RANK != SIZE - 1), "false"),
    ("bucket_cap_bytes", dict(overlap=True, overlap_on_one_node=True, bucket_cap_mb=1 if RANK == SIZE - 1 else 2),
     str(1 << 20)),
])
def test_options_that_disagree_raise_on_every_rank(option, mine, last_has):
    # Options that change which collectives run must be alike on every rank:
    # construction compares them and every rank raises (no hang), naming the
    # option and what each rank has.
    p = nn.Parameter(torch.ones(4))
    with pytest.raises(mpiml.ArgumentError,
                       match=r"mpiml::GradAverager on rank %d/%d: ranks disagree on AvgGradsOptions\.%s: .*"
                             r"rank %d has %s" % (RANK, SIZE, option, SIZE - 1, last_has)) as err:
        mp.GradAverager([p], **mine)
    assert err.value.rank == RANK and err.value.call == "mpiml::GradAverager"
    avg = mp.GradAverager([p], overlap=True, overlap_on_one_node=True)  # then alike: works everywhere
    (p * RANK).sum().backward()
    avg()
    torch.testing.assert_close(p.grad, torch.full((4,), (SIZE - 1) / 2))
    del avg


def test_bucket_plan_is_rebuilt_in_rank_0s_order():
    heads = nn.ModuleList(nn.Linear(8, 8) for _ in range(3))  # parameters 0-1, 2-3, 4-5
    assert mp.GradAverager(heads).bucket_plan() == []  # without overlap
    avg = mp.GradAverager(heads, overlap=True, overlap_on_one_node=True, bucket_cap_mb=8 * 8 * 4 / 2**20)
    before = avg.bucket_plan()
    assert sorted(i for b in before for i in b) == list(range(6)) and set(before[0]) <= {4, 5}
    x = torch.randn(4, 8)
    # backward() finishes the head computed last first: on rank 0 head 0
    order = (2, 1, 0) if RANK == 0 else (0, 1, 2)
    sum(heads[h](x).sum() for h in order).backward()
    avg()
    plan = avg.bucket_plan()
    assert sorted(i for b in plan for i in b) == list(range(6))
    assert MPI.COMM_WORLD.allgather(plan) == [plan] * SIZE
    assert set(plan[0]) <= {0, 1}, plan  # rank 0's order, on every rank
    del avg
