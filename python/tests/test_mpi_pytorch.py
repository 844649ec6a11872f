"""mpiml.mpi_pytorch against the seed's behaviour (seed_ref on mpi4py), and
the training equivalence: n ranks on 1/n of a batch each == one process on
the whole batch, after 20 Adam steps."""
import copy
import gc
import os
import sys

import pytest
import torch
from mpi4py import MPI
from torch import nn

import mpiml
import seed_ref as seed
from mpiml import mpi_pytorch as mp

RANK, SIZE = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()


def actor_critic(hidden=(64, 64), dtype=torch.float32):
    torch.manual_seed(1234 + RANK)  # different on every rank until synced

    def mlp(sizes):
        layers = []
        for i in range(len(sizes) - 1):
            layers += [nn.Linear(sizes[i], sizes[i + 1]), nn.Tanh()]
        return nn.Sequential(*layers[:-1])

    m = nn.Module()
    m.pi = mlp([17, *hidden, 6])
    m.log_std = nn.Parameter(-0.5 * torch.ones(6))
    m.v = mlp([17, *hidden, 1])
    return m.to(dtype)


def fill_grads(m):
    g = torch.Generator().manual_seed(99 + RANK)
    for p in m.parameters():
        p.grad = torch.randn(p.shape, generator=g, dtype=p.dtype)


def test_mpiml_exposes_both_modules():
    assert mpiml.mpi_pytorch is mp and mpiml.mpi_avg_grads is mp.mpi_avg_grads
    assert mpiml.GradAverager is mp.GradAverager
    assert mp.mpi_avg is mpiml.mpi_tools.mpi_avg  # as the seed's namespace


def test_avg_grads_equals_seed():
    a = actor_critic()
    b = copy.deepcopy(a)
    fill_grads(a)
    fill_grads(b)
    mp.mpi_avg_grads(a)
    seed.mpi_avg_grads(b)
    for pa, pb in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(pa.grad, pb.grad, rtol=1e-6, atol=1e-6)


def test_avg_grads_float64_kept_and_exact():
    a = actor_critic((8,), torch.float64)
    fill_grads(a)
    all_grads = MPI.COMM_WORLD.allgather([p.grad.clone() for p in a.parameters()])
    mp.mpi_avg_grads(a)
    for i, p in enumerate(a.parameters()):
        assert p.grad.dtype == torch.float64
        torch.testing.assert_close(p.grad, sum(g[i] for g in all_grads) / SIZE)


def test_missing_grads_count_as_zeros():
    a = actor_critic((8,))
    fill_grads(a)
    if RANK == 0:
        a.log_std.grad = None  # the seed raises here on rank 0 and hangs the others
    expect = MPI.COMM_WORLD.allreduce(0.0 if RANK == 0 else a.log_std.grad.clone(),
                                      op=MPI.SUM) / SIZE
    mp.mpi_avg_grads(a)
    if SIZE == 1:
        assert a.log_std.grad is None
    else:
        torch.testing.assert_close(a.log_std.grad, torch.as_tensor(expect))


SEVERAL_NODES = MPI.COMM_WORLD.Split_type(MPI.COMM_TYPE_SHARED).Get_size() != SIZE


@pytest.mark.skipif(
    SIZE < 2 or os.environ.get("MPIML_SHM") == "off" or "MPIML_NODE_SPLIT" in os.environ
    or SEVERAL_NODES, reason="the shared-memory path's size agreement (else MPIML_CHECK's)")
def test_avg_grads_of_models_that_differ_across_ranks_raises_everywhere():
    # Without MPIML_CHECK, on one node: sizes that differ are still an error
    # on every rank, naming the call, not a hang or an internal object.
    m = nn.Linear(3, 4 + RANK)
    m(torch.ones(2, 3)).sum().backward()
    with pytest.raises(mpiml.ArgumentError, match=r"mpiml::mpi_avg_grads on rank %d/%d: the models "
                       r"differ across ranks .*different sizes \(\d+ to \d+ bytes\)|mismatched"
                       % (RANK, SIZE)):
        mp.mpi_avg_grads(m)
    same = nn.Linear(3, 4)  # the next call goes on
    same.weight.grad = torch.full_like(same.weight, float(RANK))
    same.bias.grad = torch.zeros_like(same.bias)
    mp.mpi_avg_grads(same)
    assert torch.equal(same.weight.grad, torch.full_like(same.weight, (SIZE - 1) / 2))


def test_avg_grads_of_expanded_and_sparse_gradients():
    # An expanded gradient (elements sharing memory) gets a tensor of its own;
    # a sparse one stays sparse, over the rows any rank had (SparseAdam steps).
    p = nn.Parameter(torch.zeros(4, 3))
    p.grad = torch.tensor([1.0 + RANK, 2.0, 3.0]).expand(4, 3)
    mp.mpi_avg_grads([p])
    want = torch.tensor([1.0 + (SIZE - 1) / 2, 2.0, 3.0]).expand(4, 3)
    assert torch.equal(p.grad, want) and (SIZE == 1 or p.grad.is_contiguous())
    emb = nn.Embedding(5, 2, sparse=True)
    mp.sync_params(emb)
    emb(torch.tensor([RANK % 5, 4])).sum().backward()
    dense = emb.weight.grad.to_dense()
    mp.mpi_avg_grads(emb)
    g = emb.weight.grad
    assert g.is_sparse
    total = torch.zeros(5, 2)
    for r in range(SIZE):
        total[r % 5] += 1.0
        total[4] += 1.0
    assert torch.equal(g.to_dense(), total / SIZE), (g.to_dense(), dense)
    torch.optim.SparseAdam(emb.parameters()).step()


def test_avg_grads_of_parameter_list_and_options():
    a = actor_critic((8,))
    fill_grads(a)
    ref = [torch.as_tensor(seed.mpi_avg(p.grad)) for p in a.parameters()]
    mp.mpi_avg_grads(list(a.parameters()), gradient_as_bucket_view=True)
    for p, r in zip(a.parameters(), ref):
        torch.testing.assert_close(p.grad, r)


@pytest.mark.parametrize("views", [False, True])
def test_grad_averager_two_models_in_turn_equals_seed(views):
    # a policy and a value net trained in turn, each with its plan held
    a, b = actor_critic(), actor_critic()
    sa, sb = copy.deepcopy(a), copy.deepcopy(b)
    avg_a = mp.GradAverager(a, gradient_as_bucket_view=views)
    avg_b = mpiml.GradAverager(b.parameters(), comm=MPI.COMM_WORLD,
                               gradient_as_bucket_view=views, bucket_cap_mb=0.01)
    assert len(avg_a) == len(list(a.parameters())) == len(avg_b)
    for step in range(3):
        for m, s, avg in ((a, sa, avg_a), (b, sb, avg_b)):
            g = torch.Generator().manual_seed(7 * step + RANK)
            for p, q in zip(m.parameters(), s.parameters()):
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                p.grad.copy_(torch.randn(p.shape, generator=g))  # in place: views stay views
                q.grad = p.grad.clone()
            avg()
            seed.mpi_avg_grads(s)
            for p, q in zip(m.parameters(), s.parameters()):
                torch.testing.assert_close(p.grad, q.grad, rtol=1e-6, atol=1e-6)
    del avg_a, avg_b  # collective: at the same point on every rank


def _change_model(m, how):
    if how == "dtype":
        m.double()
    elif how == "added":
        m.extra = nn.Linear(2, 2)
    elif how == "replaced":
        m.pi[-1] = nn.Linear(8, 6)
    elif how == "removed":
        del m.log_std
    elif how == "unfrozen":
        m.pi[0].bias.requires_grad_(True)


@pytest.mark.skipif(SIZE == 1, reason="one rank averages nothing")
@pytest.mark.parametrize("how,match", [
    ("dtype", r"parameter #\d+ '[\w.]+'( \(averaged as a bucket view\))? is float64 of \d+ elements, "
              r"but was float32 of \d+"),
    ("added", r"the model's parameter #9 'extra.weight' is not one .*\(added since\)"),
    ("replaced", r"the model's parameter #3 'pi.2.weight' is not one .*\(added or replaced since\)"),
    ("removed", r"the model no longer has parameter #0 'log_std' .*\(removed since\)"),
    ("unfrozen", r"parameter #{frozen} 'pi.0.bias' did not require grad when this GradAverager was made"),
])
@pytest.mark.parametrize("mode", ["plain", "views", "overlap"])
def test_grad_averager_model_changed_raises_after_the_collectives(how, match, mode):
    # Its buckets are planned for the parameters it was made with: a changed
    # model is an error at the call (on every rank, none left waiting), never
    # a parameter silently left out or a gradient packed at the wrong width.
    m = actor_critic((8,))
    m.pi[0].bias.requires_grad_(False)
    frozen = [id(p) for p in m.parameters()].index(id(m.pi[0].bias))
    opts = {"views": dict(gradient_as_bucket_view=True),
            "overlap": dict(overlap=True, overlap_on_one_node=True)}.get(mode, {})
    avg = mp.GradAverager(m, **opts)
    _change_model(m, how)
    x = torch.randn(5, 17, dtype=next(m.parameters()).dtype)
    (m.pi(x).sum() + m.v(x).sum() + (m.log_std.sum() if hasattr(m, "log_std") else 0)).backward()
    match = match.replace("{frozen}", str(frozen))
    with pytest.raises(mpiml.ArgumentError, match=r"mpiml::GradAverager on rank \d+/\d+: " + match):
        avg()
    del avg  # collective: the same point on every rank
    # A new averager for the changed model averages it.
    fill_grads(m)
    grads = MPI.COMM_WORLD.allgather([None if p.grad is None else p.grad.clone() for p in m.parameters()])
    again = mp.GradAverager(m, **opts)
    again()
    for i, p in enumerate(m.parameters()):
        if p.requires_grad:
            torch.testing.assert_close(p.grad, sum(g[i] for g in grads) / SIZE)
    del again


@pytest.mark.skipif(SIZE == 1, reason="one rank makes no shared buckets")
@pytest.mark.parametrize("as_view", [False, True])
def test_dropped_averagers_are_freed_by_the_next_one(as_view):
    # Dropping an averager frees nothing collectively (each rank drops it at
    # a moment of its own); the next one made on the same ranks frees the
    # buckets of those every rank has dropped. A loop that makes a new
    # averager per round keeps two rounds' buckets, not all of them.
    from mpiml import _core
    m = nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 8))
    gc.collect()
    mp.GradAverager(m).close()  # frees those the tests before dropped
    before = _core._shared_buckets()
    counts = []
    for _ in range(6):
        avg = mp.GradAverager(m, gradient_as_bucket_view=as_view)
        fill_grads(m)
        avg()
        counts.append(_core._shared_buckets() - before)
    if counts[0] == 0:
        pytest.skip("no node-shared buckets on this path")
    one = counts[0]
    assert counts[2:] == [2 * one] * 4, counts
    # The last one dropped on all ranks but rank 1: the next averager frees
    # the one before it (dropped everywhere), not this one.
    hold = avg if RANK == 1 else None
    del avg
    gc.collect()
    n = _core._shared_buckets()
    mp.GradAverager(m, gradient_as_bucket_view=as_view).close()
    assert _core._shared_buckets() == n - one
    del hold
    mp.GradAverager(m, gradient_as_bucket_view=as_view).close()
    assert _core._shared_buckets() == n - 2 * one


@pytest.mark.parametrize("mode", ["plain", "views", "overlap"])
def test_grad_averager_tied_parameters_are_not_a_change(mode):
    # a weight registered in two modules, a module registered twice: the
    # model read again at each call lists them twice, as it was made with
    m = nn.Module()
    m.enc = nn.Linear(6, 6)
    m.dec = nn.Linear(6, 6)
    m.dec.weight = m.enc.weight
    m.again = m.enc
    opts = {"views": dict(gradient_as_bucket_view=True),
            "overlap": dict(overlap=True, overlap_on_one_node=True)}.get(mode, {})
    avg = mp.GradAverager(m, **opts)
    for _ in range(2):
        fill_grads(m)
        grads = MPI.COMM_WORLD.allgather([p.grad.clone() for p in m.parameters()])
        avg()
        for i, p in enumerate(m.parameters()):
            torch.testing.assert_close(p.grad, sum(g[i] for g in grads) / SIZE)
    del avg


def test_grad_averager_bad_arguments():
    for cap in (0, -1):
        with pytest.raises(mpiml.ArgumentError, match="bucket_cap_mb must be positive"):
            mp.GradAverager(nn.Linear(2, 2), bucket_cap_mb=cap)
        with pytest.raises(mpiml.ArgumentError, match="mpi_avg_grads.*bucket_cap_mb must be"):
            mp.mpi_avg_grads(nn.Linear(2, 2), bucket_cap_mb=cap)
    with pytest.raises(TypeError, match="expected tensors"):
        mp.GradAverager([1.0])
    with pytest.raises(ValueError, match="comm must be"):
        mp.GradAverager(nn.Linear(2, 2), comm="world")


def test_sync_params_parameters_and_buffers():
    m = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3))
    torch.manual_seed(RANK)
    m[1].running_mean.normal_()
    m[1].num_batches_tracked += RANK
    ref = copy.deepcopy(m)
    mp.sync_params(m)
    seed.sync_params(ref)
    root = MPI.COMM_WORLD.bcast(copy.deepcopy(m.state_dict()))
    for k, v in m.state_dict().items():
        assert torch.equal(v, root[k]), k
    for p, q in zip(m.parameters(), ref.parameters()):
        assert torch.equal(p, q)
    # difference: the seed leaves buffers unsynced
    if RANK > 0:
        assert not torch.equal(ref[1].running_mean, m[1].running_mean)


def test_sync_params_mismatch_is_an_error_on_every_rank():
    if SIZE == 1:
        pytest.skip("needs 2 or more ranks: one rank has no peer to disagree with")
    m = nn.Linear(3, 2 + (RANK == SIZE - 1))
    with pytest.raises(mpiml.Error, match="sync_params"):
        mp.sync_params(m)


def test_sync_params_of_a_module_on_the_meta_device_is_an_error_on_every_rank():
    m = nn.Linear(3, 2, device="meta")
    with pytest.raises(mpiml.Error, match=r"sync_params on rank %d/%d: .* is on meta; only CPU "
                                          r"tensors can be synced" % (RANK, SIZE)):
        mp.sync_params(m)
    mp.sync_params(nn.Linear(3, 2))  # every rank still in step


def test_sync_params_on_different_devices_is_a_mismatch():
    if SIZE == 1:
        pytest.skip("needs 2 or more ranks: one rank has no peer to disagree with")
    m = nn.Linear(3, 2, device="meta" if RANK == SIZE - 1 else "cpu")
    with pytest.raises(mpiml.Error, match=r"sync_params.* on meta"):
        mp.sync_params(m)


def test_grad_averager_over_other_shapes_is_an_error_with_checks_off():
    # The same total size, other shapes: without the comparison at
    # construction every rank would average element by element, silently.
    if SIZE == 1:
        pytest.skip("needs 2 or more ranks: one rank has no peer to disagree with")
    was = mpiml.check_enabled()
    mpiml.set_check(False)
    try:
        last = RANK == SIZE - 1
        m = nn.Linear(3 if last else 2, 4 if last else 6, bias=False)  # 12 weights each
        with pytest.raises(mpiml.Error, match=r"mpiml::GradAverager on rank %d/%d: .*parameter 'weight' float32\[4, 3\]"
                                              % (RANK, SIZE)) as err:
            mp.GradAverager(m)
        assert err.value.rank == RANK
        q = nn.Linear(2, 6, bias=False)
        avg = mp.GradAverager(q)  # then alike: works everywhere
        fill_grads(q)
        avg()
    finally:
        mpiml.set_check(was)


def test_mismatches_name_a_module_s_tensors():
    # A module's tensors are named as named_parameters() and named_buffers()
    # name them; a list of tensors, by position.
    if SIZE == 1:
        pytest.skip("needs 2 or more ranks: one rank has no peer to disagree with")
    last = RANK == SIZE - 1
    where = r"on rank %d/%d: modules differ across ranks" % (RANK, SIZE)
    first = r"ranks? 0(, \d+)* ha(s|ve)"  # rank 0 and those alike
    m = nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 3 if last else 2))
    with pytest.raises(mpiml.Error, match=r"sync_params %s at entry #2 '1\.weight': .*"
                                          r"%s parameter '1\.weight' float32\[2, 2\]" % (where, first)):
        mp.sync_params(m)
    q = nn.Linear(3, 2)
    q.register_buffer("stat", torch.zeros(3 if last else 2))
    with pytest.raises(mpiml.Error, match=r"sync_params %s .*%s buffer 'stat' float32\[2\]" % (where, first)):
        mp.sync_params(q)
    with pytest.raises(mpiml.Error, match=r"sync_params %s .*%s tensor '2' float32\[2\]" % (where, first)):
        mp.sync_params(list(q.parameters()) + list(q.buffers()))
    was = mpiml.check_enabled()
    mpiml.set_check(True)
    try:
        fill_grads(m)
        with pytest.raises(mpiml.Error, match=r"mpi_avg_grads %s .*%s parameter '1\.weight'" % (where, first)):
            mp.mpi_avg_grads(m)
    finally:
        mpiml.set_check(was)


def test_grad_averager_close_and_with_block():
    m = nn.Linear(3, 2)
    with mp.GradAverager(m) as avg:
        fill_grads(m)
        avg()
    with pytest.raises(mpiml.Error, match=r"GradAverager.*close\(\)"):
        avg()  # closed when the block ended
    avg.close()  # again: nothing more
    assert len(avg) == 0


def test_mismatch_names_the_python_call_site():
    # the error ends with each rank's call site: this file's line, this function
    if SIZE == 1:
        pytest.skip("needs 2 or more ranks: one rank has no peer to disagree with")
    m = nn.Linear(3, 2 + (RANK == SIZE - 1))
    fill_grads(m)
    was = mpiml.check_enabled()
    mpiml.set_check(True)  # mpi_avg_grads compares the modules only then
    try:
        for call in (mp.sync_params, mp.mpi_avg_grads, mp.GradAverager):
            line = sys._getframe().f_lineno + 2
            with pytest.raises(mpiml.Error) as e:
                call(m)
            site = f"called at {__file__}:{line} in test_mismatch_names_the_python_call_site)"
            assert site in str(e.value), str(e.value)
    finally:
        mpiml.set_check(was)


def test_mpi_avg_tensor():
    t = torch.tensor([1.0, RANK], dtype=torch.float64)
    out = mp.mpi_avg_tensor(t)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float64
    torch.testing.assert_close(out, torch.tensor([1.0, (SIZE - 1) / 2], dtype=torch.float64))


def test_setup_pytorch_for_mpi():
    mp.setup_pytorch_for_mpi()
    assert torch.get_num_threads() >= 1


def test_training_equivalence_20_adam_steps():
    torch.manual_seed(0)
    batch = 24
    X = torch.randn(batch, 17)
    Y = torch.randn(batch, 1)
    torch.manual_seed(1)
    net = nn.Sequential(nn.Linear(17, 32), nn.Tanh(), nn.Linear(32, 1)).double()
    ref = copy.deepcopy(net)
    X, Y = X.double(), Y.double()
    torch.manual_seed(5 + RANK)
    with torch.no_grad():  # ranks start different: sync_params must fix that
        for p in net.parameters():
            p.add_(torch.randn_like(p) * RANK)
    mp.sync_params(net)
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    opt_ref = torch.optim.Adam(ref.parameters(), lr=1e-2)
    part = batch // SIZE if batch % SIZE == 0 else None
    assert part is not None
    xs, ys = X[RANK * part:(RANK + 1) * part], Y[RANK * part:(RANK + 1) * part]
    for _ in range(20):
        opt.zero_grad()
        ((net(xs) - ys) ** 2).mean().backward()
        mp.mpi_avg_grads(net)
        opt.step()
        opt_ref.zero_grad()
        ((ref(X) - Y) ** 2).mean().backward()
        opt_ref.step()
    for p, q in zip(net.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-9, atol=1e-10)


def test_bad_arguments_are_clear_errors_on_every_rank():
    m = nn.Linear(3, 2)
    with pytest.raises(ValueError, match="rank %d/%d" % (RANK, SIZE)):
        mp.sync_params(m, root=SIZE)
    with pytest.raises(TypeError, match="expected tensors"):
        mp.mpi_avg_grads([1.0, 2.0])
    with pytest.raises(ValueError, match="torch.nn.Module or tensors"):
        mp.mpi_avg_grads(42)
    if hasattr(torch, "bfloat16"):  # no numpy equivalent: a clear error from mpi_tools
        with pytest.raises(TypeError, match="bfloat16"):
            mpiml.mpi_tools.mpi_avg(torch.ones(2, dtype=torch.bfloat16))
    t = torch.ones(2, dtype=torch.bfloat16)  # the tensor path keeps bfloat16
    assert mp.mpi_avg_tensor(t).dtype == torch.bfloat16
