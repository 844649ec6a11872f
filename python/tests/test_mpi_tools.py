"""mpiml.mpi_tools against the seed's behaviour (seed_ref, on mpi4py), under
mpirun at 1, 2 and 3 ranks. Each documented difference is asserted as one."""
import os
import re

import numpy as np
import pytest
from mpi4py import MPI

import mpiml
import seed_ref as seed
from mpiml import mpi_tools as mt

RANK, SIZE = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
# ranks on more than one host (a cluster, e.g. under srun)
SEVERAL_NODES = MPI.COMM_WORLD.Split_type(MPI.COMM_TYPE_SHARED).Get_size() != SIZE


def test_rank_and_size_as_seed():
    assert mt.proc_id() == seed.proc_id() == RANK
    assert mt.num_procs() == seed.num_procs() == SIZE
    assert mpiml.proc_id is mt.proc_id


def test_one_init_at_thread_multiple_shared_with_mpi4py():
    assert MPI.Is_initialized() and mpiml._core.is_initialized()
    assert mpiml._core.thread_level() == MPI.Query_thread() == MPI.THREAD_MULTIPLE


def test_sum_avg_float32_equal_seed():
    x = np.arange(7, dtype=np.float32) * (RANK + 1)
    np.testing.assert_array_equal(mt.mpi_sum(x), seed.mpi_sum(x))
    np.testing.assert_allclose(mt.mpi_avg(x), seed.mpi_avg(x), rtol=1e-6)
    assert mt.mpi_sum(x).dtype == np.float32 and mt.mpi_sum(x) is not x
    for op, sop in ((mt.MAX, MPI.MAX), (mt.MIN, MPI.MIN), (MPI.MAX, MPI.MAX)):
        np.testing.assert_array_equal(mt.mpi_op(x, op), seed.mpi_op(x, sop))


def test_scalar_in_numpy_scalar_out():
    for v in (1.5 * RANK, np.float32(RANK)):
        ours, theirs = mt.mpi_avg(v), seed.mpi_avg(v)
        assert np.isscalar(ours) and isinstance(ours, np.generic)
        assert ours == pytest.approx(theirs)
    # difference: the dtype is kept (the seed casts to float32)
    assert type(mt.mpi_sum(1.5)) is np.float64 and type(seed.mpi_sum(1.5)) is np.float32
    assert type(mt.mpi_sum(2)) is np.int64 and mt.mpi_sum(2) == 2 * SIZE
    assert type(mt.mpi_sum(np.float32(1))) is np.float32
    # a 0-d array (np.array(x), loss.detach()) averages to a numpy scalar, as the seed's
    import json
    import torch
    for v in (np.array(1.5 * RANK), torch.tensor(1.5 * RANK, dtype=torch.float64)):
        ours, theirs = mt.mpi_avg(v), seed.mpi_avg(v)
        assert isinstance(ours, np.generic) and isinstance(ours, float), type(ours)
        assert ours == pytest.approx(theirs) and json.dumps(ours)
    assert type(mt.mpi_avg(np.array(2))) is np.float64


def test_lists_tuples_tensors():
    import torch
    for x in ([1.0, RANK], (1.0, RANK), torch.tensor([1.0, RANK], requires_grad=True)):
        np.testing.assert_allclose(mt.mpi_avg(x), seed.mpi_avg([1.0, RANK]))
        assert isinstance(mt.mpi_avg(x), np.ndarray)


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16,
                                   np.uint32, np.uint64, np.float16, np.float32, np.float64,
                                   np.complex64, np.complex128])
def test_dtypes_kept_integer_average_is_float64(dtype):
    x = (np.arange(5) + RANK).astype(dtype)
    s = mt.mpi_sum(x)
    assert s.dtype == dtype  # difference: the seed returns float32
    expect = sum((np.arange(5) + r) for r in range(SIZE))
    np.testing.assert_allclose(s.astype(np.float64) if s.dtype.kind != "c" else s, expect)
    a = mt.mpi_avg(x)
    kind = np.dtype(dtype).kind
    assert a.dtype == (np.float64 if kind in "iu" else dtype)
    np.testing.assert_allclose(a, expect / SIZE, rtol=1e-3)
    assert seed.mpi_avg(x).dtype == np.float32


def test_bool():
    b = np.array([True, RANK == 0])
    np.testing.assert_array_equal(mt.mpi_sum(b), [SIZE, 1])  # counts, as the seed (as float32)
    np.testing.assert_array_equal(mt.mpi_op(b, mt.LAND), [True, SIZE == 1])
    np.testing.assert_array_equal(mt.mpi_op(b, mt.LOR), [True, True])
    assert mt.mpi_op(b, mt.LOR).dtype == np.bool_
    np.testing.assert_array_equal(mt.mpi_op(b, mt.BAND), [True, SIZE == 1])  # on bool, band is land
    assert mt.mpi_avg(b).dtype == np.float64
    # allreduce on bool buffers (MPI_CXX_BOOL), small and through the shared-memory path
    for n in (5, 1 << 20):
        mine = (np.arange(n) + RANK) % 3 == 0
        every = [(np.arange(n) + r) % 3 == 0 for r in range(SIZE)]
        out = np.zeros(n, dtype=bool)
        mt.allreduce(mine, out, op=mt.LOR)
        np.testing.assert_array_equal(out, np.logical_or.reduce(every))
        mt.allreduce(mine, out, op=mt.LAND)
        np.testing.assert_array_equal(out, np.logical_and.reduce(every))


def test_registry_doors():
    # The op constants and numpy's dtypes come from mpiml's one registry.
    from mpiml import _core
    names = _core.op_names()
    assert names[:10] == ["sum", "prod", "min", "max", "land", "lor", "lxor", "band", "bor", "bxor"]
    for n in names:
        assert getattr(mt, n.upper()) == n and n.upper() in mt.__all__
    types = _core.element_types()
    assert types["bool"] == "bool" and types["int64"] == "long" and types["complex64"] == "complex<float>"
    assert types[np.dtype(np.longdouble).name] == "long double"
    x = np.full(3, RANK + 1, dtype=np.longdouble)  # derived: no line of numpy's own
    np.testing.assert_array_equal(mt.mpi_sum(x), np.full(3, SIZE * (SIZE + 1) // 2, dtype=np.longdouble))
    assert mt.mpi_sum(x).dtype == np.longdouble


def test_uneven_lengths_across_ranks_fail_on_check_not_hang():
    # same length on every rank is the contract; a mismatch is caught by MPIML_CHECK
    if SIZE == 1:
        pytest.skip("needs 2 or more ranks: one rank has no peer to disagree with")
    mpiml.set_check(True)
    try:
        with pytest.raises(mpiml.ArgumentError, match="rank"):
            mt.mpi_sum(np.zeros(3 + RANK, np.float32))
    finally:
        mpiml.set_check(False)


@pytest.mark.skipif(
    os.environ.get("MPIML_SHM") == "off" or "MPIML_NODE_SPLIT" in os.environ or SEVERAL_NODES,
    reason="the shared-memory path is off or spans nodes (4 KB stays with MPI)")
def test_uneven_lengths_on_the_shared_memory_path_fail_on_every_rank():
    # default settings, one node: the shared-memory path compares every rank's
    # count after its first barrier, without MPIML_CHECK; every rank raises
    if SIZE == 1:
        return
    counts = [1000 - r for r in range(SIZE)]
    named = ["rank %d " % r for r in range(SIZE)] + ["count=%d" % n for n in counts]
    x = np.ones(counts[RANK], np.float32)
    for call in (lambda: mt.mpi_sum(x),
                 lambda: mt.allreduce(x, np.empty_like(x)),
                 lambda: mt.allreduce(mpiml.IN_PLACE, x)):
        with pytest.raises(mpiml.ArgumentError, match="mismatched calls") as e:
            call()
        for piece in named:
            assert piece in str(e.value)
        assert e.value.rank == RANK
        np.testing.assert_array_equal(mt.mpi_sum(np.ones(1000, np.float32)), SIZE)  # in step


def test_allreduce_call_shapes():
    x = np.full(4, RANK + 1.0)
    y = np.empty_like(x)
    assert mt.allreduce(x, y) is None
    np.testing.assert_array_equal(y, sum(range(1, SIZE + 1)))
    mt.allreduce(x, y, op=MPI.MAX)
    np.testing.assert_array_equal(y, SIZE)
    z = x.copy()
    mt.allreduce(mpiml.IN_PLACE, z, op=mt.MIN)
    np.testing.assert_array_equal(z, 1)
    z = x.copy()
    mt.allreduce(MPI.IN_PLACE, z)
    ref = np.empty_like(x)
    seed.allreduce(x, ref)
    np.testing.assert_array_equal(z, ref)
    mt.allreduce([x, MPI.DOUBLE], [y, MPI.DOUBLE], op=MPI.SUM)
    np.testing.assert_array_equal(y, ref)
    # a count: the first elements only, as mpi4py
    ours, theirs = np.full(4, -1.0), np.full(4, -1.0)
    mt.allreduce([x, 2, MPI.DOUBLE], [ours, 2, MPI.DOUBLE])
    MPI.COMM_WORLD.Allreduce([x, 2, MPI.DOUBLE], [theirs, 2, MPI.DOUBLE])
    np.testing.assert_array_equal(ours, theirs)
    assert ours[2:].tolist() == [-1.0, -1.0]


def test_allreduce_errors():
    x = np.zeros(4)
    with pytest.raises(TypeError, match="allreduce on rank %d/%d" % (RANK, SIZE)):
        mt.allreduce(x, np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="elements"):
        mt.allreduce(x, np.zeros(5))
    with pytest.raises(ValueError, match="not contiguous"):
        mt.allreduce(x, np.zeros(8)[::2])
    ro = np.zeros(4)
    ro.setflags(write=False)
    with pytest.raises(ValueError, match="read-only"):
        mt.allreduce(x, ro)
    with pytest.raises(ValueError, match="unknown op"):
        mt.allreduce(x, np.zeros(4), op="mean")
    where = "allreduce on rank %d/%d" % (RANK, SIZE)
    out = [0.0] * 4  # a list cannot take the result
    with pytest.raises(mpiml.ArgumentError, match=where + ": recvbuf must be a writable numpy array"):
        mt.allreduce(x, out)
    with pytest.raises(mpiml.ArgumentError, match=where + ": sendbuf's datatype .* is not its data's dtype float64"):
        mt.allreduce([x, MPI.INT], np.zeros(4))
    with pytest.raises(mpiml.ArgumentError, match=where + ": recvbuf's count 5 is outside its data's 4"):
        mt.allreduce([x, 5, MPI.DOUBLE], [np.zeros(4), 5, MPI.DOUBLE])


def test_tensors_numpy_cannot_hold_name_the_call_and_rank():
    import torch
    where = "on rank %d/%d" % (RANK, SIZE)
    with pytest.raises(mpiml.DtypeError, match="mpi_sum %s: tensor dtype torch.bfloat16 .*t.float()" % where):
        mt.mpi_sum(torch.ones(3, dtype=torch.bfloat16))
    with pytest.raises(mpiml.ArgumentError, match="mpi_avg %s: a torch.sparse_coo tensor.*to_dense" % where):
        mt.mpi_avg(torch.ones(3).to_sparse())
    with pytest.raises(mpiml.ArgumentError, match="broadcast %s: a torch.bfloat16 tensor must be contiguous" % where):
        mt.broadcast(torch.ones(4, dtype=torch.bfloat16)[::2])


@pytest.mark.parametrize("root", sorted({0, SIZE - 1}))
def test_broadcast_in_place(root):
    x = np.arange(5, dtype=np.float32) + RANK
    ref = x.copy()
    mt.broadcast(x, root)
    seed.broadcast(ref, root)
    np.testing.assert_array_equal(x, ref)
    np.testing.assert_array_equal(x, np.arange(5) + root)
    import torch
    t = torch.arange(3, dtype=torch.float64) + RANK
    mt.broadcast(t, root=root)
    assert t.tolist() == [root, root + 1.0, root + 2.0]
    for x in (np.arange(5, dtype=np.float16) + RANK, torch.arange(5, dtype=torch.float16) + RANK):
        mt.broadcast(x, root)  # float16 has no MPI datatype: its bytes
        assert x.dtype in (np.float16, torch.float16) and list(map(float, x)) == [root + i for i in range(5)]
    for dt in (torch.bfloat16, torch.complex32):  # no numpy equivalent: bytes
        t = (torch.arange(6, dtype=torch.float32).reshape(2, 3) + RANK).to(dt)
        mt.broadcast(t, root=root)
        assert t.dtype == dt and t.shape == (2, 3)
        want = (torch.arange(6, dtype=torch.float32).reshape(2, 3) + root).to(dt)
        assert torch.equal(t.view(torch.uint8), want.view(torch.uint8))


def test_broadcast_errors():
    with pytest.raises(mpiml.ArgumentError, match="broadcast on rank .*root 7"):
        mt.broadcast(np.zeros(2), 7)
    with pytest.raises(ValueError, match="numpy array"):
        mt.broadcast([1.0, 2.0])
    with pytest.raises(ValueError, match="not contiguous"):
        mt.broadcast(np.zeros(4)[::2])
    with pytest.raises(TypeError, match="dtype"):
        mt.broadcast(np.array(["a"]))


def samples(n, seed_=0):
    return np.random.default_rng(seed_ + RANK).normal(1.0, 2.0, n).astype(np.float32)


def test_statistics_same_dtype_and_value_on_every_rank():
    # rank 0 has no sample (an empty list: float64 to numpy), the others float32
    # ones: every rank gets float32, as every rank that had samples; float64
    # samples on any rank make it float64 everywhere
    for wide in (False, True):
        x = [] if RANK == 0 else samples(5).astype(np.float64 if wide and RANK == SIZE - 1 else np.float32)
        if SIZE == 1:
            x = samples(5)
        got = mt.mpi_statistics_scalar(x, with_min_and_max=True)
        want = np.float64 if wide and SIZE > 1 else np.float32
        assert all(type(v) is want for v in got), (got, want)
        everyone = MPI.COMM_WORLD.allgather([float(v) for v in got])
        assert all(e == everyone[0] for e in everyone), everyone


@pytest.mark.parametrize("sizes", [lambda r: 100, lambda r: 10 * r + 1, lambda r: 0 if r == 0 else 5])
def test_statistics_as_seed_uneven_and_empty(sizes):
    x = samples(sizes(RANK))
    if sum(sizes(r) for r in range(SIZE)) == 0:
        return
    ours, theirs = mt.mpi_statistics_scalar(x), seed.mpi_statistics_scalar(x)
    assert isinstance(ours, tuple) and len(ours) == 2
    np.testing.assert_allclose(ours, theirs, rtol=2e-5)
    ours4 = mt.mpi_statistics_scalar(x, with_min_and_max=True)
    theirs4 = seed.mpi_statistics_scalar(x, with_min_and_max=True)
    assert len(ours4) == 4
    np.testing.assert_allclose(ours4, theirs4, rtol=2e-5)
    assert all(type(v) is np.float32 for v in ours4)  # float32 samples: float32, as the seed
    pooled = np.concatenate(MPI.COMM_WORLD.allgather(x)).astype(np.float64)
    np.testing.assert_allclose(ours4, (pooled.mean(), pooled.std(), pooled.min(), pooled.max()),
                               rtol=1e-6)


def test_statistics_dtypes_and_inputs():
    x = samples(50).astype(np.float64)
    m, s = mt.mpi_statistics_scalar(x)
    assert type(m) is np.float64  # difference: the seed computes and returns float32
    pooled = np.concatenate(MPI.COMM_WORLD.allgather(x))
    assert m == pytest.approx(pooled.mean(), rel=1e-12) and s == pytest.approx(pooled.std(), rel=1e-12)
    assert mt.mpi_statistics_scalar([1, 2, 3]) == pytest.approx((2.0, np.sqrt(2 / 3)))
    import torch
    mt2 = mt.mpi_statistics_scalar(torch.ones(4, requires_grad=True), True)
    assert mt2 == (1.0, 0.0, 1.0, 1.0)


def test_statistics_all_empty_same_error_on_every_rank():
    with pytest.raises(mpiml.NoSamplesError, match="no rank has any sample") as e:
        mt.mpi_statistics_scalar([])
    assert isinstance(e.value, ValueError) and e.value.rank == RANK
    with pytest.warns(RuntimeWarning):  # difference: the seed returns nan
        assert np.isnan(seed.mpi_statistics_scalar([])[0])


def test_comm_may_be_an_mpi4py_communicator():
    sub = MPI.COMM_WORLD.Split(RANK % 2, RANK)
    try:
        assert mt.proc_id(comm=sub) == sub.Get_rank()
        assert mt.num_procs(sub) == sub.Get_size()
        np.testing.assert_array_equal(mt.mpi_sum(np.ones(2), comm=sub), sub.Get_size())
        m, _ = mt.mpi_statistics_scalar([float(RANK)], comm=sub)
        assert m == pytest.approx(np.mean([r for r in range(SIZE) if r % 2 == RANK % 2]))
        x = np.array([RANK], np.int64)
        mt.broadcast(x, 0, comm=sub)
        assert x[0] == RANK % 2
    finally:
        sub.Free()
    with pytest.raises(ValueError, match="comm must be"):
        mt.mpi_sum(1.0, comm="world")


def test_two_threads_on_one_communicator_is_an_error():
    # A thread of rank 0 waits in a barrier on comm (the others join it only
    # after the main thread's call on comm failed); threads on communicators
    # of their own run side by side.
    import threading
    import time
    if SIZE < 2:
        pytest.skip("needs 2 ranks")
    comm, signal = MPI.COMM_WORLD.Dup(), MPI.COMM_WORLD.Dup()
    try:
        mt.barrier(comm)
        if RANK == 0:
            inside = threading.Thread(target=mt.barrier, args=(comm,))
            inside.start()
            time.sleep(0.3)
            with pytest.raises(mpiml.Error, match=r"mpi_sum on rank 0/%d: another thread of this "
                               r"rank is inside barrier #2 on this communicator" % SIZE):
                mt.mpi_sum(1.0, comm=comm)
            mt.barrier(signal)
            inside.join()
        else:
            mt.barrier(signal)
            mt.barrier(comm)
        assert mt.mpi_sum(1.0, comm=comm) == SIZE  # in step: the failed call issued nothing
        sums = []
        other = threading.Thread(target=lambda: sums.extend(mt.mpi_sum(float(i), comm=signal)
                                                            for i in range(100)))
        other.start()
        mine = [mt.mpi_sum(2.0 * i, comm=comm) for i in range(100)]
        other.join()
        assert sums == [i * SIZE for i in range(100)]
        assert mine == [2 * i * SIZE for i in range(100)]
    finally:
        comm.Free()
        signal.Free()


def test_sum_avg_arguments_as_a_python_function():
    # mpi_sum/mpi_avg parse their own arguments (no pybind11 dispatch)
    assert mt.mpi_avg(x=2.0) == 2.0 and mt.mpi_sum(2.0, comm=None) == 2.0 * SIZE
    assert mt.mpi_avg(comm=MPI.COMM_WORLD, x=float(RANK)) == pytest.approx((SIZE - 1) / 2)
    np.testing.assert_array_equal(mt.mpi_sum(np.ones(3), MPI.COMM_WORLD), np.full(3, SIZE))
    for f, name in ((mt.mpi_sum, "mpi_sum"), (mt.mpi_avg, "mpi_avg")):
        with pytest.raises(TypeError, match=r"%s\(\) missing required argument 'x'" % name):
            f()
        with pytest.raises(TypeError, match="unexpected keyword argument 'y'"):
            f(1.0, y=2)
        with pytest.raises(TypeError, match="multiple values for argument 'x'"):
            f(1.0, x=2.0)
        with pytest.raises(TypeError, match="at most 2 arguments"):
            f(1.0, None, 3)
        with pytest.raises(mpiml.ArgumentError, match="comm must be") as e:
            f(1.0, comm="world")
        assert e.value.call == name and "rank %d/%d" % (RANK, SIZE) in str(e.value)
        with pytest.raises(mpiml.Error, match=name):
            f(np.array(["a"]))
        assert name + "(x, comm=None)" in f.__doc__


def test_msg_and_pprint(capsys):
    mt.msg("hello", "tag")
    mt.pprint("only rank 0", end="!\n")
    out = capsys.readouterr().out
    assert "Message from %d: tag \t hello\n" % RANK in out
    assert ("only rank 0!\n" in out) == (RANK == 0)


def test_errors_name_call_and_rank():
    with pytest.raises(mpiml.DtypeError) as e:
        mt.mpi_sum(np.array([True]), comm=None) if False else mt.mpi_op(np.array([1j]), mt.MAX)
    assert isinstance(e.value, TypeError) and isinstance(e.value, mpiml.Error)
    assert "rank %d/%d" % (RANK, SIZE) in str(e.value)


def test_options_and_profiling(tmp_path_factory):
    old = mpiml.timeout()
    mpiml.set_timeout(30)
    assert mpiml.timeout() == 30
    mpiml.set_timeout(old)
    with pytest.raises(mpiml.Error):
        mpiml.set_timeout(-1)
    d = MPI.COMM_WORLD.bcast(str(tmp_path_factory.mktemp("prof")) if RANK == 0 else None)

    @mpiml.region("decorated")
    def work():
        return mt.mpi_sum(1.0)

    mpiml.profile_start(d)
    assert mpiml.profiling()
    with mpiml.region("block"):
        work()
    mpiml.profile_stop()
    assert not mpiml.profiling()
    import json
    import os
    MPI.COMM_WORLD.Barrier()
    with open(os.path.join(d, "profile_%d.json" % RANK)) as f:
        text = f.read()
    assert "decorated" in text and "block" in text
    json.loads(text)


def test_scalar_kinds_as_seed():
    assert type(mt.mpi_sum(np.float16(1))) is np.float16 and mt.mpi_sum(np.float16(1)) == SIZE
    assert type(mt.mpi_avg(True)) is np.float64
    assert mt.mpi_sum(True) == SIZE
    zero_d = mt.mpi_sum(np.array(2.0))  # a 0-d array is not a scalar (np.isscalar), as the seed
    assert isinstance(zero_d, np.ndarray) and zero_d.shape == () and zero_d == 2.0 * SIZE
    assert isinstance(seed.mpi_sum(np.array(2.0)), np.ndarray)


def test_parameters_are_tensors_and_lazy_views_are_not_written_to():
    import torch
    p = torch.nn.Parameter(torch.full((3,), float(RANK + 1)))
    np.testing.assert_allclose(mt.mpi_avg(p), np.full(3, (SIZE + 1) / 2))
    b = torch.nn.Parameter(torch.full((2,), float(RANK)))
    mt.broadcast(b, 0)  # in place, as a plain tensor
    assert torch.equal(b.detach(), torch.zeros(2))
    c = torch.tensor([1 + 2j, 3 - 1j]) * (RANK + 1)
    with pytest.raises(mpiml.ArgumentError, match=r"broadcast on rank %d/%d: .*conjugate" % (RANK, SIZE)):
        mt.broadcast(c.conj(), 0)  # the result would land in a copy
    with pytest.raises(mpiml.ArgumentError, match=r"allreduce on rank %d/%d: .*conjugate" % (RANK, SIZE)):
        mt.allreduce(mt.IN_PLACE, c.conj())
    out = torch.empty(2, dtype=c.dtype)
    mt.allreduce(c.conj(), out)  # read: resolved
    want = torch.tensor([1 - 2j, 3 + 1j]) * (SIZE * (SIZE + 1) / 2)
    assert torch.allclose(out, want)


@pytest.mark.parametrize("bad", [True, MPI.MAX, MPI.GROUP_EMPTY])
def test_comm_must_be_a_communicator(bad):
    with pytest.raises(mpiml.ArgumentError, match="comm must be None or an mpi4py communicator"):
        mt.mpi_avg(1.0, comm=bad)


@pytest.mark.parametrize("call", ["mpi_sum", "mpi_statistics_scalar", "broadcast", "barrier", "proc_id"])
def test_a_bad_comm_names_the_call(call):
    pattern = r"^%s on rank %d/%d: comm must be None or an mpi4py communicator, got str" % (call, RANK, SIZE)
    with pytest.raises(mpiml.ArgumentError, match=pattern):
        if call == "broadcast":
            mt.broadcast(np.zeros(2), 0, comm="world")
        elif call in ("barrier", "proc_id"):
            getattr(mt, call)(comm="world")
        else:
            getattr(mt, call)(np.ones(2), comm="world")


@pytest.mark.parametrize("root", [0.0, 1.5, True, "0"])
def test_broadcast_root_must_be_an_int(root):
    x = np.full(2, float(RANK))
    with pytest.raises(mpiml.ArgumentError, match=r"broadcast on rank %d/%d: root must be an int, got %s"
                       % (RANK, SIZE, re.escape(repr(root)))):
        mt.broadcast(x, root)
    mt.broadcast(x, np.int64(0))  # numpy integers are ints
    assert np.array_equal(x, np.zeros(2))


@pytest.mark.parametrize("n,restarts", [(1.5, 0), (2.0, 0), (True, 0), (2, 0.5)])
def test_mpi_fork_counts_must_be_ints(n, restarts):
    # checked before anything else: the job is never launched
    with pytest.raises(mpiml.ArgumentError, match=r"^mpi_fork: (n|restarts) must be an int, got "):
        mt.mpi_fork(n, restarts=restarts)


@pytest.mark.parametrize("call", ["save", "load", "steps", "profile"])
def test_a_directory_of_none_is_an_error(tmp_path, monkeypatch, call):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(mpiml.ArgumentError, match=r"on rank %d/%d: dir must be a path .* got NoneType"
                       % (RANK, SIZE)):
        if call == "save":
            mpiml.save_checkpoint(None, 3, shared={"x": 1})
        elif call == "load":
            mpiml.load_checkpoint(None)
        elif call == "steps":
            mpiml.checkpoint.checkpoint_steps(None)
        else:
            mpiml.profile_start(None)
    assert not os.path.exists("None")
