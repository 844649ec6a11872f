"""The torch.distributed backend "mpiml" under mpirun (2 and 3 ranks): every
collective and dtype against Gloo's result from a Gloo group in the same
process, error paths, subgroups, p2p, determinism, DDP and ZeRO."""

import os
import socket
import time
import copy

import pytest
import torch
import torch.distributed as dist

import mpiml
import mpiml.torch  # registers "mpiml"
from c10d_fixtures import world, gloo  # noqa: F401 (pytest fixtures)

INT_TYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64]
FLOAT_TYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
COMPLEX_TYPES = [torch.complex64, torch.complex128]
ALL_TYPES = FLOAT_TYPES + COMPLEX_TYPES + INT_TYPES + [torch.bool]
R = dist.ReduceOp


def value(rank, dtype, shape=(3, 5), salt=0):
    """Rank-dependent values every op keeps exact (small integers)."""
    n = 1
    for s in shape:
        n *= s
    base = (torch.arange(n) * 3 + rank * 5 + salt) % 4 + 1  # 1..4
    if dtype == torch.bool:
        return ((torch.arange(n) + rank + salt) % 3 == 0).reshape(shape)
    if dtype.is_complex:
        return torch.complex(base.double(), (base % 3).double()).to(dtype).reshape(shape)
    return base.to(dtype).reshape(shape)


def noncontig(t):
    """A non-contiguous tensor with t's values."""
    big = torch.zeros(t.shape + (2,), dtype=t.dtype)
    big[..., 0] = t
    out = big[..., 0]
    assert not out.is_contiguous()
    return out


def ops_for(dtype):
    if dtype == torch.bool:
        return [R.SUM, R.PRODUCT, R.MIN, R.MAX, R.BAND, R.BOR, R.BXOR]
    if dtype.is_complex:
        return [R.SUM, R.AVG]  # torch.distributed refuses the others for complex
    if dtype.is_floating_point:
        return [R.SUM, R.PRODUCT, R.MIN, R.MAX, R.AVG]
    return [R.SUM, R.PRODUCT, R.MIN, R.MAX, R.BAND, R.BOR, R.BXOR, R.AVG]


def local_reduce(op, ts):
    """op over the ranks' tensors, computed in one process (float16/bfloat16 in float32)."""
    dt = ts[0].dtype
    if dt == torch.bool:
        x = [t.to(torch.uint8) for t in ts]
        f = {R.SUM: torch.maximum, R.MAX: torch.maximum, R.PRODUCT: torch.minimum,
             R.MIN: torch.minimum, R.BAND: torch.bitwise_and, R.BOR: torch.bitwise_or,
             R.BXOR: torch.bitwise_xor}[op]
        out = x[0]
        for t in x[1:]:
            out = f(out, t)
        return out.bool()
    wide = torch.float32 if dt in (torch.float16, torch.bfloat16) else dt
    x = [t.to(wide) for t in ts]
    f = {R.SUM: torch.add, R.AVG: torch.add, R.PRODUCT: torch.mul, R.MIN: torch.minimum,
         R.MAX: torch.maximum, R.BAND: torch.bitwise_and, R.BOR: torch.bitwise_or,
         R.BXOR: torch.bitwise_xor}[op]
    out = x[0]
    for t in x[1:]:
        out = f(out, t)
    if op == R.AVG:
        out = out.div(len(ts), rounding_mode="trunc") if not (wide.is_floating_point or wide.is_complex) \
            else out / len(ts)
    return out.to(dt)


def gloo_supports(fn):
    try:
        return fn(), True
    except RuntimeError:
        return None, False


# ------------------------------------------------------------------ all_reduce

@pytest.mark.parametrize("dtype", ALL_TYPES, ids=str)
def test_all_reduce_every_dtype_and_op(world, gloo, dtype):
    rank, n = world
    compared = 0
    for op in ops_for(dtype):
        for contiguous in (True, False):
            t = value(rank, dtype)
            if not contiguous:
                t = noncontig(t)
            dist.all_reduce(t, op=op)
            want = local_reduce(op, [value(r, dtype) for r in range(n)])
            assert torch.equal(t, want), (op, dtype, t, want)
            if op != R.AVG and dtype not in (torch.bool, torch.bfloat16) and not dtype.is_complex:
                g = value(rank, dtype)
                _, ok = gloo_supports(lambda: dist.all_reduce(g, op=op, group=gloo))
                if ok:
                    assert torch.equal(t, g), (op, dtype, t, g)
                    compared += 1
    if dtype in (torch.float32, torch.float64, torch.int32, torch.int64):
        assert compared > 0


def test_all_reduce_async_and_future(world):
    rank, n = world
    ts = [torch.full((1000,), float(rank + i)) for i in range(5)]
    works = [dist.all_reduce(t, async_op=True) for t in ts]
    fut = works[-1].get_future()
    for w in works:
        w.wait()
    assert fut.done()
    for i, t in enumerate(ts):
        assert torch.equal(t, torch.full((1000,), float(sum(r + i for r in range(n)))))
    assert torch.equal(fut.value()[0], ts[-1])


def test_all_reduce_coalesced(world, gloo):
    rank, n = world
    ts = [value(rank, torch.float32, (4,)), value(rank, torch.float32, (2, 3))]
    gs = [t.clone() for t in ts]
    dist.all_reduce_coalesced(ts, op=R.SUM)
    dist.all_reduce_coalesced(gs, op=R.SUM, group=gloo)
    for t, g in zip(ts, gs):
        assert torch.equal(t, g)


def test_bit_identical_across_ranks_and_runs(world):
    rank, n = world
    gen = torch.Generator().manual_seed(1234 + rank)
    x = torch.randn(100_003, generator=gen, dtype=torch.float32)
    a, b = x.clone(), x.clone()
    dist.all_reduce(a)
    dist.all_reduce(b)
    assert torch.equal(a, b)  # run to run
    every = [torch.empty_like(a) for _ in range(n)]
    dist.all_gather(every, a)
    for e in every:
        assert torch.equal(e.view(torch.int32), a.view(torch.int32))  # every rank, bitwise


# -------------------------------------------------------------- other collectives

@pytest.mark.parametrize("dtype", ALL_TYPES, ids=str)
def test_broadcast_reduce_gather_family(world, gloo, dtype):
    rank, n = world
    root = n - 1
    # broadcast
    t = noncontig(value(rank, dtype))
    dist.broadcast(t, src=root)
    assert torch.equal(t, value(root, dtype))
    # reduce (SUM; MAX for bool)
    op = R.MAX if dtype == torch.bool else R.SUM
    t = value(rank, dtype)
    dist.reduce(t, dst=root, op=op)
    if rank == root:
        assert torch.equal(t, local_reduce(op, [value(r, dtype) for r in range(n)]))
    # all_gather (non-contiguous outputs) and all_gather_into_tensor
    outs = [noncontig(torch.zeros((3, 5), dtype=dtype)) for _ in range(n)]
    dist.all_gather(outs, value(rank, dtype))
    for r in range(n):
        assert torch.equal(outs[r], value(r, dtype))
    big = torch.zeros((3 * n, 5), dtype=dtype)
    dist.all_gather_into_tensor(big, value(rank, dtype))
    assert torch.equal(big, torch.cat([value(r, dtype) for r in range(n)]))
    # gather / scatter
    gl = [torch.zeros((3, 5), dtype=dtype) for _ in range(n)] if rank == root else None
    dist.gather(value(rank, dtype), gather_list=gl, dst=root)
    if rank == root:
        for r in range(n):
            assert torch.equal(gl[r], value(r, dtype))
    out = noncontig(torch.zeros((3, 5), dtype=dtype))
    sl = [value(r, dtype, salt=7) for r in range(n)] if rank == root else None
    dist.scatter(out, scatter_list=sl, src=root)
    assert torch.equal(out, value(rank, dtype, salt=7))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int32, torch.int64,
                                   torch.uint8, torch.float16], ids=str)
def test_gather_family_matches_gloo(world, gloo, dtype):
    rank, n = world
    a = [torch.zeros((3, 5), dtype=dtype) for _ in range(n)]
    b = [torch.zeros((3, 5), dtype=dtype) for _ in range(n)]
    dist.all_gather(a, value(rank, dtype))
    dist.all_gather(b, value(rank, dtype), group=gloo)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    x, y = value(rank, dtype), value(rank, dtype)
    dist.broadcast(x, src=1)
    dist.broadcast(y, src=1, group=gloo)
    assert torch.equal(x, y)
    x, y = value(rank, dtype), value(rank, dtype)
    dist.reduce(x, dst=0)
    dist.reduce(y, dst=0, group=gloo)
    if rank == 0:
        assert torch.equal(x, y)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.float16, torch.bool,
                                   torch.complex64], ids=str)
def test_reduce_scatter(world, dtype):
    rank, n = world
    op = R.MAX if dtype == torch.bool else R.SUM
    ins = [value(rank, dtype, salt=j) for j in range(n)]
    out = noncontig(torch.zeros((3, 5), dtype=dtype))
    dist.reduce_scatter(out, ins, op=op)
    assert torch.equal(out, local_reduce(op, [value(r, dtype, salt=rank) for r in range(n)]))
    big = torch.cat(ins)
    out2 = torch.zeros((3, 5), dtype=dtype)
    dist.reduce_scatter_tensor(out2, big, op=op)
    assert torch.equal(out2, out)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int16, torch.bfloat16, torch.bool],
                         ids=str)
def test_all_to_all(world, gloo, dtype):
    rank, n = world
    # equal splits
    inp = torch.cat([value(rank, dtype, (2, 3), salt=j) for j in range(n)])
    out = torch.zeros_like(inp)
    dist.all_to_all_single(out, inp)
    assert torch.equal(out, torch.cat([value(r, dtype, (2, 3), salt=rank) for r in range(n)]))
    # uneven split sizes: rank r sends j+1 rows to rank j
    def rows(src, dst):
        return value(src, dtype, (dst + 1, 3), salt=10 * dst)
    inp = torch.cat([rows(rank, j) for j in range(n)])
    out = torch.zeros((n * (rank + 1), 3), dtype=dtype)
    dist.all_to_all_single(out, inp, output_split_sizes=[rank + 1] * n,
                           input_split_sizes=[j + 1 for j in range(n)])
    assert torch.equal(out, torch.cat([rows(r, rank) for r in range(n)]))
    if dtype == torch.float32:  # what Gloo's all_to_all takes
        g = torch.zeros_like(out)
        dist.all_to_all_single(g, inp, output_split_sizes=[rank + 1] * n,
                               input_split_sizes=[j + 1 for j in range(n)], group=gloo)
        assert torch.equal(out, g)
    # list form, different shapes per peer
    ins = [rows(rank, j) for j in range(n)]
    outs = [torch.zeros((rank + 1, 3), dtype=dtype) for _ in range(n)]
    dist.all_to_all(outs, ins)
    for r in range(n):
        assert torch.equal(outs[r], rows(r, rank))


def test_all_gather_coalesced_and_object_collectives(world, gloo):
    rank, n = world
    objs = [None] * n
    dist.all_gather_object(objs, {"rank": rank, "s": "x" * rank})
    assert objs == [{"rank": r, "s": "x" * r} for r in range(n)]
    lst = [rank * 10] if rank == 0 else [None]
    dist.broadcast_object_list(lst, src=0)
    assert lst == [0]
    ins = [value(rank, torch.float32, (2,)), value(rank, torch.float32, (3, 2))]
    outs = [[torch.zeros(2), torch.zeros(3, 2)] for _ in range(n)]
    gouts = [[torch.zeros(2), torch.zeros(3, 2)] for _ in range(n)]
    dist.all_gather_coalesced(outs, ins)
    dist.all_gather_coalesced(gouts, ins, group=gloo)
    for r in range(n):
        assert torch.equal(outs[r][0], value(r, torch.float32, (2,)))
        assert torch.equal(outs[r][1], value(r, torch.float32, (3, 2)))
        assert torch.equal(outs[r][1], gouts[r][1])


def test_barrier_and_monitored_order(world):
    rank, n = world
    t = torch.ones(10)
    w = dist.all_reduce(t, async_op=True)
    dist.barrier()  # runs after the all_reduce: same worker, issue order
    assert w.is_completed()
    assert torch.equal(t, torch.full((10,), float(n)))


# ---------------------------------------------------------------------- p2p

def test_send_recv_ring_and_any_source(world):
    rank, n = world
    nxt, prv = (rank + 1) % n, (rank - 1) % n
    big = torch.arange(300_000, dtype=torch.float32) + rank  # rendezvous-size message
    got = torch.empty_like(big)
    s = dist.isend(big, nxt, tag=3)
    r = dist.irecv(got, prv, tag=3)
    s.wait()
    r.wait()
    assert torch.equal(got, torch.arange(300_000, dtype=torch.float32) + prv)
    # blocking, non-contiguous receive; its own tag, so that it cannot match
    # the batch sends below (tag 0) that a faster rank may already have posted
    if rank == 0:
        dst = noncontig(torch.zeros(4, 6))
        for _ in range(n - 1):
            src = dist.recv(dst, tag=5)  # from any rank
            assert torch.equal(dst, torch.full((4, 6), float(src)))
    else:
        dist.send(torch.full((4, 6), float(rank)), 0, tag=5)
    # batch_isend_irecv
    a, b = torch.full((5,), float(rank)), torch.zeros(5)
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, a, nxt), dist.P2POp(dist.irecv, b, prv)])
    for q in reqs:
        q.wait()
    assert torch.equal(b, torch.full((5,), float(prv)))


# ---------------------------------------------------------------- subgroups

def test_subgroups(world):
    rank, n = world
    members = [0, n - 1]
    g = dist.new_group(ranks=members)           # created on every rank, built by members
    gg = dist.new_group(ranks=members, backend="gloo")
    single = dist.new_group(ranks=[1])
    if rank in members:
        t, u = value(rank, torch.float32), value(rank, torch.float32)
        dist.all_reduce(t, group=g)
        dist.all_reduce(u, group=gg)
        assert torch.equal(t, u)
        x = torch.full((3,), float(rank))
        dist.broadcast(x, src=n - 1, group=g)  # global rank
        assert torch.equal(x, torch.full((3,), float(n - 1)))
        if rank == 0:
            dist.send(torch.ones(2) * 7, n - 1, group=g)
        else:
            y = torch.zeros(2)
            dist.recv(y, 0, group=g)
            assert torch.equal(y, torch.ones(2) * 7)
        assert dist.get_backend(g) == "MPIML" or str(dist.get_backend(g)).lower() == "mpiml"
    if rank == 1:
        t = torch.ones(3)
        dist.all_reduce(t, group=single)
        assert torch.equal(t, torch.ones(3))
    dist.barrier()


# --------------------------------------------------------------- error paths

def test_errors_on_the_calling_rank(world):
    rank, n = world
    with pytest.raises(RuntimeError, match="not defined|bitwise"):
        dist.all_reduce(torch.ones(3), op=R.BAND)
    with pytest.raises(RuntimeError, match="MIN is not defined for complex64"):  # straight to the backend
        dist.distributed_c10d._get_default_group().allreduce(
            [torch.ones(3, dtype=torch.complex64)], R.MIN).wait()
    with pytest.raises(RuntimeError, match="output"):
        dist.all_gather([torch.zeros(4) for _ in range(n)], torch.zeros(3))
    with pytest.raises(RuntimeError, match="root rank|outside"):
        dist.distributed_c10d._get_default_group().broadcast(torch.ones(2), n + 3).wait()
    with pytest.raises(RuntimeError, match="sparse"):
        dist.all_reduce(torch.ones(3).to_sparse())
    with pytest.raises(RuntimeError, match="split sizes"):
        dist.all_to_all_single(torch.zeros(n), torch.zeros(n), input_split_sizes=[n + 1] + [0] * (n - 1))
    with pytest.raises(RuntimeError):
        dist.all_reduce(torch.ones(3, device="meta"))
    # the group still works
    t = torch.ones(3)
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((3,), float(n)))


def test_mismatch_across_ranks_is_an_error_everywhere(world):
    # The core's agreement check and message: what every rank called.
    rank, n = world
    t = torch.ones(4 + rank)  # different sizes on every rank
    with pytest.raises(RuntimeError, match=r"mpiml c10d all_reduce on rank %d/%d: mismatched "
                       r"collectives \(call #\d+ on this communicator\): rank 0 called "
                       r"ALLREDUCE\(count=4, dtype=Float, op=SUM\); rank 1 called "
                       r"ALLREDUCE\(count=5, dtype=Float, op=SUM\)" % (rank, n)):
        dist.all_reduce(t)
    t = torch.ones(4, dtype=torch.float32 if rank == 0 else torch.float64)
    with pytest.raises(RuntimeError, match=r"rank 0 called BROADCAST\(count=4, dtype=Float, root=0\); "
                       r"ranks? 1.* called BROADCAST\(count=4, dtype=Double, root=0\)"):
        dist.broadcast(t, src=0)
    t = torch.ones(4)
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((4,), float(n)))


def test_all_to_all_size_mismatch_is_an_error_everywhere(world):
    # What a rank sends to another must be what that one expects from it.
    rank, n = world
    rows = 2 if rank == 0 else 3
    out = torch.zeros(n * rows)
    with pytest.raises(RuntimeError, match=r"mpiml c10d all_to_all_single on rank %d/%d: mismatched "
                       r"sizes: rank 0 expects 8 bytes from rank 1, which sends it 12" % (rank, n)):
        dist.all_to_all_single(out, torch.ones(n * rows))
    outs = [torch.zeros(rows) for _ in range(n)]
    with pytest.raises(RuntimeError, match=r"mpiml c10d all_to_all on rank %d/%d: mismatched sizes: "
                       r"rank 0 expects 8 bytes from rank 1, which sends it 12" % (rank, n)):
        dist.all_to_all(outs, [torch.ones(rows) for _ in range(n)])
    out = torch.zeros(2 * n)  # the group goes on
    dist.all_to_all_single(out, torch.full((2 * n,), float(rank)))
    assert torch.equal(out, torch.arange(n).repeat_interleave(2).float())


def test_collectives_on_parameters(world, gloo):
    # Leaves that require grad, written in place by the group's worker (where
    # torch.no_grad() of the caller does not reach), as Gloo writes them.
    rank, n = world
    for group in (None, gloo):
        p = torch.nn.Parameter(torch.full((3,), float(rank + 1)))
        dist.all_reduce(p, group=group)
        assert torch.equal(p.detach(), torch.full((3,), float(n * (n + 1) // 2)))
        q = torch.nn.Parameter(torch.ones(2, 3) * (rank + 1)).t()  # not contiguous
        dist.all_reduce(q, group=group)
        assert torch.equal(q.detach(), torch.full((3, 2), float(n * (n + 1) // 2)))
        h = torch.nn.Parameter(torch.ones(3, dtype=torch.half))
        dist.all_reduce(h, group=group)
        assert torch.equal(h.detach(), torch.full((3,), float(n), dtype=torch.half))
        r = torch.nn.Parameter(torch.ones(3))
        dist.reduce(r, 0, group=group)
        if rank == 0:  # elsewhere undefined (as torch.distributed documents)
            assert torch.equal(r.detach(), torch.full((3,), float(n)))
        b = torch.nn.Parameter(torch.zeros(2, 3)).t()
        if rank == 0:
            with torch.no_grad():
                b.fill_(5.0)
        dist.broadcast(b, 0, group=group)
        assert torch.equal(b.detach(), torch.full((3, 2), 5.0))
        assert p.requires_grad and p.grad_fn is None  # still a leaf
    a = torch.nn.Parameter(torch.full((3,), float(rank)))
    dist.all_reduce(a, op=dist.ReduceOp.AVG)
    assert torch.equal(a.detach(), torch.full((3,), (n - 1) / 2))


def one_shared_node():
    """Whether a small all_reduce takes the shared-memory path: every rank on
    one host, as one node, with the path on."""
    hosts = [None] * dist.get_world_size()
    dist.all_gather_object(hosts, socket.gethostname())
    one_host = len(set(hosts)) == 1
    shm = os.environ.get("MPIML_SHM", "auto").lower() not in ("off", "0", "false", "no")
    return one_host and shm and "MPIML_NODE_SPLIT" not in os.environ


@pytest.mark.parametrize("core_check", [False, True], ids=["check", "check+MPIML_CHECK"])
def test_one_agreement_round_per_collective(world, core_check):
    # The group's check and the core's (MPIML_CHECK, mpiml.set_check) share
    # one round: the core's collective inside the backend's runs none.
    rank, n = world
    pg = dist.distributed_c10d._get_default_group()
    before = mpiml.check_enabled()
    mpiml.set_check(core_check)
    try:
        t = torch.ones(8)
        dist.all_reduce(t)  # the comm's state is set up
        dist.barrier()
        r0 = mpiml._c10d.agreement_rounds()
        for _ in range(10):
            dist.all_reduce(t)
        dist.broadcast(t, src=0)
        dist.all_gather_into_tensor(torch.zeros(8 * n), t)
        rounds = mpiml._c10d.agreement_rounds() - r0
        pg.check = False
        r1 = mpiml._c10d.agreement_rounds()
        dist.all_reduce(t)
        unchecked = mpiml._c10d.agreement_rounds() - r1
    finally:
        pg.check = True
        mpiml.set_check(before)
    assert rounds == 12
    # MPIML_CHECK still checks; so does MPI's path (several hosts or nodes,
    # MPIML_SHM=off) without it, where the shared-memory path checks for free
    assert unchecked == (1 if core_check or not one_shared_node() else 0)


def test_check_set_while_operations_run(world):
    # pg.check is written here while the group's worker runs queued operations
    # (the thread sanitizer stage runs this). Each operation keeps the setting
    # it was issued with, on every rank, however far each rank's worker got:
    # otherwise one rank would run an agreement round the other skips.
    rank, n = world
    pg = dist.distributed_c10d._get_default_group()
    ts = [torch.full((256,), float(i)) for i in range(8)]
    works = []
    # Rank 0 issues everything at once, its worker still in the first
    # operation; the last rank sets the flag while its worker keeps up.
    if rank == n - 1:
        time.sleep(0.3)
    try:
        for i, t in enumerate(ts):
            works.append(dist.all_reduce(t, async_op=True))
            pg.check = i % 2 == 0
            if rank == n - 1:
                time.sleep(0.05)
    finally:
        pg.check = True
    for w in works:
        w.wait()
    for i, t in enumerate(ts):
        assert torch.equal(t, torch.full((256,), float(i * n)))


def test_works_with_mpi4py(world):
    MPI = pytest.importorskip("mpi4py.MPI")  # skipped where it is built for another MPI
    rank, n = world
    assert MPI.COMM_WORLD.Get_rank() == rank
    assert MPI.COMM_WORLD.allreduce(rank) == n * (n - 1) // 2
    t = torch.ones(2)
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((2,), float(n)))


def test_complex32(world):
    rank, n = world
    t = value(rank, torch.complex64).to(torch.complex32)
    dist.all_reduce(t)
    want = local_reduce(R.SUM, [value(r, torch.complex64) for r in range(n)])
    assert torch.equal(t.to(torch.complex64), want)
    t = value(rank, torch.complex64).to(torch.complex32)
    dist.broadcast(t, src=n - 1)
    assert torch.equal(t.to(torch.complex64), value(n - 1, torch.complex64))
