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
from torch import nn

import mpiml
from mpiml import mpi_pytorch as mp
from mpiml import mpi_tools
from ranks import RANK, SIZE, allgather, barrier


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
    # Rank 0's bucket meets another collective on the other ranks (a mismatch
    # the checks catch): the collective fails on rank 0's communication
    # thread and the call raises it; the others' own call fails alike.
    if SIZE == 1:
        pytest.skip("needs 2 or more ranks")
    was = mpiml.check_enabled()
    mpiml.set_check(True)
    p = nn.Parameter(torch.ones(4))
    avg = mp.GradAverager([p], overlap=True, overlap_on_one_node=True)
    (p * 2).sum().backward()
    avg()  # the first step, everywhere: the plan is set
    try:
        if RANK == 0:
            (p * 2).sum().backward()
            with pytest.raises(mpiml.Error, match=r"on rank 0/%d: .*mismatched" % SIZE):
                avg()
        else:
            with pytest.raises(mpiml.Error, match="mismatched"):
                mpi_tools.mpi_sum(torch.ones(3, dtype=torch.int64))
    finally:
        mpiml.set_check(was)
    del avg  # one averager with overlap per communicator at a time
    p2 = nn.Parameter(torch.ones(4))
    avg2 = mp.GradAverager([p2], overlap=True, overlap_on_one_node=True)
    (p2 * RANK).sum().backward()
    avg2()  # a new averager works everywhere
    torch.testing.assert_close(p2.grad, torch.full((4,), (SIZE - 1) / 2))
    del avg2


def test_overlap_stats_show_where_the_averaging_went():
    torch.manual_seed(8)
    net = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64), nn.Linear(64, 64))
    assert mp.GradAverager(net).overlap_stats()["steps"] == 0  # without overlap: zeros
    avg = mp.GradAverager(net, overlap=True, overlap_on_one_node=True,
                          bucket_cap_mb=8 * 1024 / 2**20)  # a bucket a tensor
    assert avg.overlap_stats() == dict(steps=0, buckets=0, averaging_s=0.0, hidden_s=0.0, left_s=0.0)
    barrier()
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
    hosts = set(allgather(socket.gethostname()))
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
    assert allgather(plan) == [plan] * SIZE
    assert set(plan[0]) <= {0, 1}, plan  # rank 0's order, on every rank
    del avg


@pytest.mark.parametrize("a_first", [True, False])
def test_two_averagers_with_overlap_on_a_communicator_average_at_the_call(a_first):
    # An actor and a critic, one backward() over both: two communication
    # threads would start their collectives in an order that differs from
    # rank to rank (mismatched collectives, a hang or a crash). Beside another
    # one an averager averages at the call, in the program's order, with the
    # same bits as without overlap; alone again, it overlaps.
    def pair():
        torch.manual_seed(5)
        return nn.Sequential(nn.Linear(8, 32), nn.Linear(32, 1)), nn.Sequential(nn.Linear(8, 32), nn.Linear(32, 1))
    (a, b), (ra, rb) = pair(), pair()
    kw = dict(overlap=True, overlap_on_one_node=True, bucket_cap_mb=1024 / 2**20)
    avg_a, avg_b = mp.GradAverager(a, **kw), mp.GradAverager(b, **kw)
    ref_a, ref_b = mp.GradAverager(ra), mp.GradAverager(rb)
    torch.manual_seed(20 + RANK)
    for step in range(3):
        x = torch.randn(6, 8)
        for m in (a, b, ra, rb):
            m.zero_grad()
        (a(x).square().sum() + b(x).abs().sum()).backward()
        (ra(x).square().sum() + rb(x).abs().sum()).backward()
        for avg in ((avg_a, avg_b) if a_first else (avg_b, avg_a)):
            avg()
        ref_a(), ref_b()
        for p, q in zip(list(a.parameters()) + list(b.parameters()),
                        list(ra.parameters()) + list(rb.parameters())):
            assert torch.equal(p.grad, q.grad), step
    assert avg_a.overlap_stats()["hidden_s"] == 0 and avg_b.overlap_stats()["hidden_s"] == 0
    del avg, avg_b  # alone again: overlaps
    a.zero_grad()
    a(torch.randn(6, 8)).square().sum().backward()
    time.sleep(0.2)
    avg_a()
    assert avg_a.overlap_stats()["hidden_s"] > 0
    del avg_a, ref_a, ref_b


@pytest.mark.parametrize("as_view", [False, True])
def test_backward_under_no_sync_after_the_step_began_is_an_error(as_view):
    # The gradients were averaging already: accumulating into them now would
    # leave the ranks with different parameters, silently.
    net = nn.Linear(4, 4)
    avg = mp.GradAverager(net, overlap=True, overlap_on_one_node=True, gradient_as_bucket_view=as_view)
    for _ in range(2):
        net(torch.ones(1, 4)).sum().backward()
        avg()
    net.zero_grad()
    net(torch.ones(1, 4)).sum().backward()
    with avg.no_sync():
        net(torch.ones(1, 4)).sum().backward()
    with pytest.raises(mpiml.ArgumentError,
                       match=r"on rank %d/%d: parameter #\d+ '(weight|bias)' got a gradient under "
                       r"no_sync\(\) after a backward\(\) outside it" % (RANK, SIZE)):
        avg()
    net.zero_grad()  # the averager goes on
    with avg.no_sync():
        net(torch.ones(1, 4)).sum().backward()
    (net(torch.ones(1, 4)) * (RANK + 1)).sum().backward()
    avg()
    torch.testing.assert_close(net.bias.grad, torch.full((4,), 1 + (SIZE + 1) / 2))
    del avg


class Sparse(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.emb = nn.Embedding(10, 3, sparse=True)
        self.out = nn.Linear(3, 1)

    def forward(self, idx):
        return self.out(self.emb(idx)).sum()


@pytest.mark.parametrize("overlap", [False, True])
def test_sparse_gradients_with_bucket_views_stay_sparse_and_equal(overlap):
    # A sparse gradient has no memory of its own to view: it is averaged as
    # without views (it stays sparse, for SparseAdam), in every step, and the
    # averager's release leaves it alone.
    nets = [Sparse(), Sparse()]
    avgs = [mp.GradAverager(nets[0], gradient_as_bucket_view=True, overlap=overlap,
                            overlap_on_one_node=True),
            mp.GradAverager(nets[1])]
    for step in range(3):
        idx = torch.tensor([RANK, RANK + step, 7])
        for net, avg in zip(nets, avgs):
            net.zero_grad(set_to_none=True)
            net(idx).backward()
            avg()
        g, ref = nets[0].emb.weight.grad, nets[1].emb.weight.grad
        assert g.layout == torch.sparse_coo, g.layout
        assert torch.equal(g.to_dense(), ref.to_dense()), step
        assert torch.equal(nets[0].out.weight.grad, nets[1].out.weight.grad), step
    del avgs
    assert nets[0].emb.weight.grad.layout == torch.sparse_coo


@pytest.mark.parametrize("look", [False, True])
def test_deleted_mid_step_after_python_read_the_gradients(look):
    # Destroyed between backward() and the call it first ends the step, on the
    # caller's thread; a gradient Python has seen needs the GIL to be freed,
    # which the communication thread must not wait for (it hung the job).
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64))
    avg = mp.GradAverager(model, overlap=True, overlap_on_one_node=True, gradient_as_bucket_view=True,
                          bucket_cap_mb=8 * 1024 / 2**20)
    for _ in range(3):
        model.zero_grad()
        model(torch.randn(8, 64)).square().sum().backward()
        avg()
    model.zero_grad(set_to_none=True)
    if RANK == 1:
        time.sleep(0.5)
    model(torch.randn(8, 64)).square().sum().backward()
    if look:
        assert all(p.grad.norm().item() >= 0 for p in model.parameters())
    del avg
    assert all(p.grad is not None for p in model.parameters())


def test_every_path_averages_to_the_same_bits():
    # The division by the rank count: one rule on every path (multiplication
    # by 1/n only where n is a power of two, where it is the same), so views,
    # overlap and the free function agree bit for bit at any rank count.
    torch.manual_seed(11)
    shapes = [(33, 17), (17,), (5, 5), (1000,)]
    grads = [torch.randn(s, dtype=torch.float32) * (RANK + 1.37) for s in shapes]
    grads.append(torch.randn(7, dtype=torch.float64) * (RANK + 0.91))

    def fresh():
        ps = [nn.Parameter(torch.zeros_like(g)) for g in grads]
        for p, g in zip(ps, grads):
            p.grad = g.clone()
        return ps

    results = []
    for opts in [{}, {"gradient_as_bucket_view": True},
                 {"overlap": True, "overlap_on_one_node": True},
                 {"overlap": True, "overlap_on_one_node": True, "gradient_as_bucket_view": True}]:
        ps = fresh()
        avg = mp.GradAverager(ps, **opts)
        for _ in range(2):  # views: in the buckets from the second step on
            for p, g in zip(ps, grads):
                p.grad = None if opts.get("overlap") else g.clone()
            if opts.get("overlap"):  # the hooks fire in backward(): the gradients made there
                sum((p * g).sum() for p, g in zip(ps, grads)).backward()
            avg()
        results.append([p.grad.clone() for p in ps])
        del avg
    ps = fresh()
    mp.mpi_avg_grads(ps)
    results.append([p.grad.clone() for p in ps])
    for k, r in enumerate(results[1:], 1):
        for a, b in zip(results[0], r):
            assert torch.equal(a, b), k


@pytest.mark.parametrize("overlap", [False, True])
def test_a_gradient_kept_past_the_averager_stays_valid(overlap):
    # With gradient_as_bucket_view the gradients view the averager's buckets;
    # one the program kept (rank 0 only here) keeps its bucket alive, on
    # every rank, until mpiml's finalize (the windows are freed collectively).
    torch.manual_seed(0)
    model = nn.Linear(256, 256)
    avg = mp.GradAverager(model, overlap=overlap, overlap_on_one_node=True, gradient_as_bucket_view=True)
    for _ in range(3):
        model.zero_grad()
        model(torch.ones(4, 256)).sum().backward()
        avg()
    kept = model.weight.grad if RANK == 0 else None
    want = torch.full((256, 256), 4.0)
    del avg
    junk = [torch.full((256, 256), -1.0) for _ in range(50)]  # reuse of freed memory would show
    if kept is not None:
        assert torch.equal(kept, want)
    assert torch.equal(model.weight.grad, want)
    del junk
