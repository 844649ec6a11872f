"""mpiml.checkpoint under mpirun at 1, 2 and 3 ranks: every kind of state
round-trips, training resumed from a checkpoint continues as the
uninterrupted run, keep-K, torn and corrupt checkpoints fall back, a full
disk and an unwritable directory raise on every rank."""
import errno
import os
import random
import shutil
import subprocess

import numpy as np
import pytest
import torch

import mpiml
from mpiml import checkpoint as ckpt
from mpiml.checkpoint import capture_rng, load_checkpoint, restore_rng, save_checkpoint
from ranks import RANK, SIZE, barrier, bcast

TAG = "rank %d/%d" % (RANK, SIZE)


@pytest.fixture
def ckdir():
    """A fresh directory, the same on every rank."""
    path = None
    if RANK == 0:
        import tempfile
        path = tempfile.mkdtemp(prefix="mpiml-pyckpt-")
    path = bcast(path)
    yield path
    ckpt.wait_for_removals()
    barrier()
    if RANK == 0:
        shutil.rmtree(path)


def on_rank0(f):
    barrier()
    if RANK == 0:
        f()
    barrier()


def test_every_kind_round_trips(ckdir):
    w = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    shared = {"w": w, "fortran": np.asfortranarray(w.astype(np.float64)), "ids": np.arange(5, dtype=np.int64),
              "zero_d": np.array(3.5), "empty": np.zeros((0, 4), np.uint8), "strided": w[:, ::2, 1:],
              "big_endian": np.arange(4, dtype=">i4"), "record": np.zeros(2, dtype=[("a", "<f8"), ("b", "i1")]),
              "n": 7, "big": -2**62, "lr": 0.125, "flag": True, "name": "résumé", "raw": b"\x00\x01xyz",
              "obj": {"a": [1, 2], "b": (3, None)}, "t": torch.arange(6).reshape(2, 3)}
    per_rank = {"mine": np.full(3, RANK, dtype=np.int16), "rank": RANK}
    save_checkpoint(ckdir, 12, shared=shared, per_rank=per_rank, metadata={"git": "abc"})
    ck = load_checkpoint(ckdir)
    step, s, p = ck
    assert step == 12 and ck.world_size == SIZE and ck.metadata == {"git": "abc"}
    assert ck.path == os.path.join(ckdir, "step-00000012") and ck.skipped == []
    assert sorted(s) == sorted(shared) and sorted(p) == sorted(per_rank)
    for k in ("w", "fortran", "ids", "zero_d", "empty", "strided", "big_endian", "record"):
        assert s[k].dtype == shared[k].dtype and s[k].shape == shared[k].shape
        np.testing.assert_array_equal(s[k], shared[k])
        assert s[k].flags.writeable
    assert s["n"] == 7 and type(s["n"]) is int and s["big"] == -2**62
    assert s["lr"] == 0.125 and s["flag"] is True and s["name"] == "résumé"
    assert s["raw"] == b"\x00\x01xyz" and s["obj"] == {"a": [1, 2], "b": (3, None)}
    assert torch.equal(s["t"], shared["t"])
    np.testing.assert_array_equal(p["mine"], per_rank["mine"])
    assert p["rank"] == RANK
    files = sorted(os.listdir(ck.path))
    assert files == ["MANIFEST"] + ["rank-%05d.bin" % r for r in range(SIZE)] + ["shared.bin"]
    assert mpiml.load_checkpoint is load_checkpoint


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(5, 12)
        self.drop = torch.nn.Dropout(0.3)
        self.b = torch.nn.Linear(12, 2)

    def forward(self, x):
        return self.b(self.drop(torch.relu(self.a(x))))


def step_fn(model, opt, gens):
    """A step that draws from every generator: random, np.random, a numpy
    Generator, torch's global generator (data, dropout) and a torch.Generator."""
    npg, tg = gens
    scale = random.random() + np.random.rand() + npg.random()
    x = torch.randn(8, 5, generator=tg) * scale + torch.randn(8, 5)
    opt.zero_grad()
    loss = (model(x) ** 2).mean()
    loss.backward()
    mpiml.mpi_avg_grads(model)
    opt.step()


def test_training_resumes_as_the_uninterrupted_run(ckdir):
    torch.manual_seed(0)
    model = Net()
    mpiml.sync_params(model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    random.seed(10 + RANK)
    np.random.seed(20 + RANK)
    torch.manual_seed(30 + RANK)
    gens = (np.random.default_rng(40 + RANK), torch.Generator().manual_seed(50 + RANK))
    for _ in range(3):
        step_fn(model, opt, gens)
    save_checkpoint(ckdir, 3, shared={"model": model.state_dict(), "optimizer": opt.state_dict()},
                    per_rank={"rng": capture_rng(*gens)})
    for _ in range(4):
        step_fn(model, opt, gens)
    want = [t.detach().clone() for t in model.state_dict().values()]
    want_next = (random.random(), np.random.rand(), gens[0].random(), torch.rand(1).item(),
                 torch.rand(1, generator=gens[1]).item())

    # A "new process": other weights, a fresh optimizer, other generator states.
    torch.manual_seed(999)
    random.seed(999)
    np.random.seed(999)
    model2 = Net()
    opt2 = torch.optim.Adam(model2.parameters(), lr=1e-2)
    gens2 = (np.random.default_rng(999), torch.Generator().manual_seed(999))
    step, shared, per_rank = load_checkpoint(ckdir)
    assert step == 3
    model2.load_state_dict(shared["model"])
    opt2.load_state_dict(shared["optimizer"])
    restore_rng(per_rank["rng"], *gens2)
    for _ in range(4):
        step_fn(model2, opt2, gens2)
    got = list(model2.state_dict().values())
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    got_next = (random.random(), np.random.rand(), gens2[0].random(), torch.rand(1).item(),
                torch.rand(1, generator=gens2[1]).item())
    assert got_next == want_next


def test_restore_rng_checks_the_generators():
    state = capture_rng(np.random.default_rng(1))
    np.random.rand(3)  # the global state moves on; a failed restore leaves it there
    before = np.random.get_state()[1].copy()
    with pytest.raises(mpiml.ArgumentError, match="1 generators captured, 0 given"):
        restore_rng(state)
    with pytest.raises(mpiml.ArgumentError, match="a numpy generator's state given"):
        restore_rng(state, torch.Generator())
    assert np.array_equal(np.random.get_state()[1], before)


def test_resumed_from_an_older_step_the_last_saved_loads(ckdir):
    for s in range(1, 5):
        save_checkpoint(ckdir, s, shared={"run": "A%d" % s})
    assert load_checkpoint(ckdir, step=2).shared == {"run": "A2"}
    save_checkpoint(ckdir, 3, shared={"run": "B3"})  # the resumed run
    ck = load_checkpoint(ckdir)
    assert (ck.step, ck.shared) == (3, {"run": "B3"})
    save_checkpoint(ckdir, 2, shared={"run": "C2"}, keep=2)
    assert load_checkpoint(ckdir).shared == {"run": "C2"}
    assert ckpt.checkpoint_steps(ckdir) == [2, 3]


def test_keeps_the_last_k(ckdir):
    for s in range(1, 6):
        save_checkpoint(ckdir, s, shared={"s": s}, per_rank={"r": RANK}, keep=2)
    assert ckpt.checkpoint_steps(ckdir) == [4, 5]
    assert load_checkpoint(ckdir).shared["s"] == 5
    assert load_checkpoint(ckdir, step=4).shared["s"] == 4
    assert load_checkpoint(ckdir, step=3) is None


@pytest.mark.parametrize("damage", ["truncate", "flip"])
@pytest.mark.parametrize("victim", ["shared.bin", "last rank"])
def test_damaged_newest_falls_back(ckdir, damage, victim, capfd):
    for s in (1, 2):
        save_checkpoint(ckdir, s, shared={"w": np.full(1000, s, np.float32)}, per_rank={"r": (s, RANK)})
    name = "shared.bin" if victim == "shared.bin" else "rank-%05d.bin" % (SIZE - 1)
    path = os.path.join(ckdir, "step-00000002", name)

    def hurt():
        n = os.path.getsize(path)
        if damage == "truncate":
            os.truncate(path, n - 100)
        else:
            with open(path, "r+b") as f:
                f.seek(n - 20)
                b = f.read(1)
                f.seek(n - 20)
                f.write(bytes([b[0] ^ 1]))

    on_rank0(hurt)
    capfd.readouterr()
    ck = load_checkpoint(ckdir)
    err = capfd.readouterr().err
    assert ck.step == 1
    np.testing.assert_array_equal(ck.shared["w"], np.full(1000, 1, np.float32))
    assert ck.per_rank["r"] == (1, RANK)
    why = "truncated or torn" if damage == "truncate" else "checksum mismatch"
    assert len(ck.skipped) == 1 and name in ck.skipped[0] and why in ck.skipped[0]
    if RANK == 0:
        assert "[mpiml] warning: mpiml::Checkpointer::load_latest: checkpoint " in err
        assert why in err and "trying the previous one" in err
    else:
        assert err == ""
    with pytest.raises(mpiml.CheckpointError, match="mpiml::Checkpointer::load on %s.*%s" % (TAG, why)):
        load_checkpoint(ckdir, step=2)


def test_unwritable_directory_raises_on_every_rank(ckdir):
    on_rank0(lambda: open(os.path.join(ckdir, "file"), "w").close())
    bad = os.path.join(ckdir, "file", "ckpt")
    with pytest.raises(mpiml.CheckpointError) as e:
        save_checkpoint(bad, 1, shared={"x": 1})
    msg = str(e.value)
    assert "mpiml::Checkpointer::save on " + TAG in msg
    assert "rank 0: cannot create directory " + bad in msg and "Not a directory" in msg
    assert isinstance(e.value, OSError) and e.value.errno == errno.ENOTDIR and e.value.path == bad
    assert e.value.rank == RANK
    with pytest.raises(mpiml.CheckpointError, match="Not a directory"):
        load_checkpoint(bad)


def test_unsaveable_value_on_one_rank_raises_on_every_rank(ckdir):
    per_rank = {"f": (lambda: 0) if RANK == SIZE - 1 else 1}
    with pytest.raises(mpiml.ArgumentError) as e:
        save_checkpoint(ckdir, 1, per_rank=per_rank)
    assert "save_checkpoint on %s: rank %d: per_rank['f'] cannot be saved" % (TAG, SIZE - 1) in str(e.value)
    assert load_checkpoint(ckdir) is None


def test_full_disk_raises_on_every_rank(ckdir):
    mnt = os.path.join(ckdir, "small")
    why = None
    if RANK == 0:
        os.mkdir(mnt)
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", mnt],
                           capture_output=True, text=True)
        why = None if r.returncode == 0 else (r.stderr.strip() or "mount failed")
    why = bcast(why)
    if why is not None:
        pytest.skip("cannot mount a tmpfs here (%s): the full-disk case needs root" % why)
    try:
        save_checkpoint(mnt, 1, shared={"w": np.ones(1000)}, per_rank={"r": RANK})
        big = np.ones(300_000) if RANK == SIZE - 1 else np.ones(10)  # 2.4 MB on the last rank
        with pytest.raises(mpiml.CheckpointError) as e:
            save_checkpoint(mnt, 2, shared={"w": np.zeros(1000)}, per_rank={"r": big})
        msg = str(e.value)
        assert "mpiml::Checkpointer::save on %s: step 2 not saved in %s" % (TAG, mnt) in msg
        assert "No space left on device" in msg and "the previous checkpoints are intact" in msg
        assert e.value.errno == errno.ENOSPC and isinstance(e.value, OSError)
        barrier()
        assert not [n for n in os.listdir(mnt) if ".tmp-" in n]
        ck = load_checkpoint(mnt)
        assert ck.step == 1 and ck.per_rank["r"] == RANK
        np.testing.assert_array_equal(ck.shared["w"], np.ones(1000))
    finally:
        barrier()
        if RANK == 0:
            subprocess.run(["umount", "-l", mnt], check=False)
