"""torch.profiler sees the "mpiml" backend's operations: one async event per
op, named "mpiml:<op>" as Gloo's are "gloo:<op>", with the input shapes; a
DDP step's trace shows its bucket all_reduce."""

import json

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import ProfilerActivity, profile

import mpiml.torch
from c10d_fixtures import world  # noqa: F401 (pytest fixture)


def events(prof, name):
    return [e for e in prof.events() if e.name == name]


def check_one(prof, name, shapes):
    evs = events(prof, name)
    assert len(evs) == 1, "%s: %d events (%s)" % (name, len(evs), sorted({e.name for e in prof.events()}))
    assert evs[0].is_async, name
    assert evs[0].input_shapes == shapes, (name, evs[0].input_shapes)
    return evs[0]


@pytest.mark.parametrize("async_op", [False, True])
def test_all_reduce_event_has_its_input_shape(world, async_op):
    rank, n = world
    t = torch.full((3, 5), float(rank + 1))
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        w = dist.all_reduce(t, async_op=async_op)
        if async_op:
            w.wait()
    assert torch.equal(t, torch.full((3, 5), float(n * (n + 1) // 2)))
    check_one(prof, "mpiml:all_reduce", [[3, 5]])


def test_no_event_without_the_profiler(world):
    # Outside a profiler nothing is recorded, and a later profile sees only its own ops.
    t = torch.ones(7)
    dist.all_reduce(t)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        dist.all_reduce(torch.ones(2, 2))
    check_one(prof, "mpiml:all_reduce", [[2, 2]])


def test_other_ops_are_named_as_gloo_names_them(world):
    rank, n = world
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        dist.broadcast(torch.zeros(4), 0)
        dist.reduce(torch.ones(2, 3), 0)
        outs = [torch.zeros(6) for _ in range(n)]
        dist.all_gather(outs, torch.ones(6))
        dist.all_reduce_coalesced([torch.ones(3), torch.ones(2, 2)])
        dist.all_to_all_single(torch.zeros(2 * n), torch.ones(2 * n))
        dist.barrier()
    check_one(prof, "mpiml:broadcast", [[4]])
    check_one(prof, "mpiml:reduce", [[2, 3]])
    check_one(prof, "mpiml:all_gather", [[6]])
    # all_reduce_coalesced is an all_reduce of the list, as in Gloo
    check_one(prof, "mpiml:all_reduce", [[3], [2, 2]])
    check_one(prof, "mpiml:all_to_all", [[2 * n]])
    check_one(prof, "mpiml:barrier", [])


def test_send_recv_events(world):
    rank, n = world
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        if rank == 0:
            for dst in range(1, n):
                dist.send(torch.full((dst, 2), float(dst)), dst)
            t = torch.zeros(1)
            src = dist.recv(t)  # any source
            assert t.item() == src
        else:
            t = torch.zeros(rank, 2)
            dist.recv(t, 0)
            assert torch.equal(t, torch.full((rank, 2), float(rank)))
            if rank == 1:
                dist.send(torch.ones(1), 0)
    if rank == 0:
        sends = events(prof, "mpiml:send")
        assert sorted(e.input_shapes for e in sends) == [[[d, 2]] for d in range(1, n)]
        assert all(e.is_async for e in sends)
        check_one(prof, "mpiml:recvAnySource", [[1]])
    else:
        check_one(prof, "mpiml:recv", [[rank, 2]])
        if rank == 1:
            check_one(prof, "mpiml:send", [[1]])


def test_ddp_step_trace_shows_the_bucket_all_reduce(world, tmp_path):
    rank, n = world
    torch.manual_seed(0)
    model = DDP(nn.Linear(8, 4))  # one bucket: weight 32 + bias 4 elements
    x = torch.randn(5, 8)
    model(x).sum().backward()  # the first step (DDP rebuilds its buckets after it)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        model(x).sum().backward()
    ev = check_one(prof, "mpiml:all_reduce", [[36]])
    assert ev.cpu_time >= 0
    # The table grouped by input shape, and the exported trace (a list of
    # events without kineto, {"traceEvents": [...]} with it).
    rows = [a for a in prof.key_averages(group_by_input_shape=True) if a.key == "mpiml:all_reduce"]
    assert [(a.count, a.input_shapes) for a in rows] == [(1, [[36]])]
    trace = tmp_path / ("trace_%d.json" % rank)
    prof.export_chrome_trace(str(trace))
    data = json.loads(trace.read_text())
    found = [e for e in (data["traceEvents"] if isinstance(data, dict) else data)
             if e.get("name") == "mpiml:all_reduce"]
    assert len(found) == 1 and found[0]["dur"] >= 0, found
    if "Input Dims" in found[0].get("args", {}):
        assert found[0]["args"]["Input Dims"] == [[36]], found[0]
