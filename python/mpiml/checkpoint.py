"""Collective, atomic checkpoints (the C++ mpiml::Checkpointer underneath).

    from mpiml.checkpoint import save_checkpoint, load_checkpoint, capture_rng, restore_rng

    ck = load_checkpoint("ckpt")              # newest checkpoint that verifies, or None
    if ck is not None:
        step, shared, per_rank = ck
        model.load_state_dict(shared["model"])
        optimizer.load_state_dict(shared["optimizer"])
        restore_rng(per_rank["rng"])
    ...
    save_checkpoint("ckpt", step,
                    shared={"model": model.state_dict(), "optimizer": optimizer.state_dict()},
                    per_rank={"rng": capture_rng()}, keep=3)

`shared` holds what every rank has alike (rank 0's is written once); each
rank's `per_rank` goes to a file of its own. Values: bytes, bool, int, float,
str and numpy arrays are stored as such (the C++ API reads them); anything
else (state_dict()s, tensors, RNG states, any picklable object) through
torch.save when torch is imported, else pickle. Both calls are collective;
errors (a full disk, an unwritable directory) raise CheckpointError on every
rank and leave the previous checkpoints intact.
"""
import collections
import io
import os
import pickle
import random
import struct
import sys

import numpy as np

from . import _core
from .errors import ArgumentError, CheckpointError

__all__ = ["save_checkpoint", "load_checkpoint", "checkpoint_steps", "wait_for_removals", "capture_rng",
           "restore_rng", "Checkpoint", "CheckpointError", "RawEntry"]


class Checkpoint(collections.namedtuple("Checkpoint", "step shared per_rank")):
    """What load_checkpoint returns: (step, shared, per_rank), plus the
    attributes world_size (ranks that saved it: per_rank is empty on ranks
    at or above it), metadata, path and skipped (why newer checkpoints were
    passed over)."""


# An entry of a kind Python does not decode (e.g. a LibTorch module saved from
# C++): its kind and bytes.
RawEntry = collections.namedtuple("RawEntry", "kind data")

_SCALARS = {"i8": "<b", "i16": "<h", "i32": "<i", "i64": "<q", "u8": "<B", "u16": "<H",
            "u32": "<I", "u64": "<Q", "f32": "<f", "f64": "<d"}


def _torch():
    return sys.modules.get("torch")


def _encode(value):
    """(kind, bytes-like) of one value."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "bytes", value
    if isinstance(value, (bool, np.bool_)):
        return "bool", b"\x01" if value else b"\x00"
    if isinstance(value, int) and -2**63 <= value < 2**63:
        return "i64", struct.pack("<q", value)
    if isinstance(value, float):
        return "f64", struct.pack("<d", value)
    if isinstance(value, str):
        return "text", value.encode("utf-8")
    if isinstance(value, np.ndarray) and not value.dtype.hasobject:
        return "numpy", _npy_pieces(value)
    buf = io.BytesIO()
    torch = _torch()
    if torch is not None:
        torch.save(value, buf)
        return "torch.save", buf.getbuffer()
    pickle.dump(value, buf, protocol=pickle.HIGHEST_PROTOCOL)
    return "pickle", buf.getbuffer()


def _npy_pieces(a):
    """The .npy file of array a as [header, data]: the data not copied when
    the array is contiguous."""
    header = io.BytesIO()
    d = np.lib.format.header_data_from_array_1_0(a)
    try:
        np.lib.format.write_array_header_1_0(header, d)
    except ValueError:  # a header too long for format 1.0
        np.lib.format.write_array_header_2_0(header, d)
    data = a.T if d["fortran_order"] else a
    data = np.ascontiguousarray(data)  # no copy when already contiguous
    return [header.getvalue(), data.reshape(-1).view(np.uint8)]


def _decode(kind, data):
    if kind == "bytes":
        return data
    if kind == "bool":
        return data != b"\x00"
    if kind in _SCALARS:
        return struct.unpack(_SCALARS[kind], data)[0]
    if kind == "text":
        return data.decode("utf-8")
    if kind == "numpy":
        return np.lib.format.read_array(io.BytesIO(data), allow_pickle=False)
    if kind.endswith("[]") and kind[:-2] in _SCALARS:
        return np.frombuffer(data, dtype=np.dtype(_SCALARS[kind[:-2]])).copy()
    if kind == "torch.save":
        import torch
        return torch.load(io.BytesIO(data))
    if kind == "pickle":
        return pickle.loads(data)
    return RawEntry(kind, data)


def _entries(values, which):
    if values is None:
        return [], ""
    if not isinstance(values, dict):
        return [], "%s must be a dict of name -> value, got %s" % (which, type(values).__name__)
    out = []
    for name, value in values.items():
        if not isinstance(name, str) or not name:
            return [], "%s: names must be non-empty strings, got %r" % (which, name)
        try:
            kind, data = _encode(value)
        except Exception as e:  # noqa: BLE001 - reported on every rank
            return [], "%s[%r] cannot be saved: %s: %s" % (which, name, type(e).__name__, e)
        out.append((name, kind, data))
    return out, ""


def save_checkpoint(dir, step, shared=None, per_rank=None, keep=3, metadata=None, comm=None):
    """Saves checkpoint `step` (an int >= 0, the same on every rank) under
    dir/step-<step>/, collectively: rank 0 writes `shared` once (other ranks'
    is not read: they may pass None, e.g. for a ZeroRedundancyOptimizer state
    consolidated on rank 0), every rank its `per_rank`; returns when the
    checkpoint is durable, after removing all but the `keep` saved last (0:
    keep all). step is at most 10**18 - 1. metadata: str -> str, written to
    the MANIFEST (rank 0's). Raises CheckpointError on every rank when any
    rank's write fails (full disk, unwritable directory) or when another job
    saves into dir (its rank 0 holds dir/.lock until it exits); the previous
    checkpoints stay."""
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)):
        raise ArgumentError("save_checkpoint: step must be an int, got %s" % type(step).__name__)
    if isinstance(keep, bool) or not isinstance(keep, (int, np.integer)) or keep < 0:
        raise ArgumentError("save_checkpoint: keep must be an int >= 0, got %r" % (keep,))
    meta = {} if metadata is None else metadata
    error = ""
    if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                             for k, v in meta.items()):
        error = "metadata must be a dict of str -> str"
    # Only rank 0's shared state is written: other ranks skip encoding theirs.
    s, err_s = _entries(shared, "shared") if _core.proc_id(comm) == 0 else ([], "")
    p, err_p = _entries(per_rank, "per_rank")
    error = error or err_s or err_p
    _core.checkpoint_save(_path(dir, "save_checkpoint"), int(step), s, p, meta if not error else {}, int(keep), comm, error)


def load_checkpoint(dir, step=None, comm=None):
    """The newest checkpoint under dir (the one saved last: after a resume
    from an older step, not the abandoned higher steps) whose MANIFEST and
    checksums verify on every rank, as a Checkpoint (step, shared, per_rank); None when there is
    none. Torn or corrupt checkpoints are passed over with a warning (rank 0,
    on stderr). With step: that checkpoint (None when absent; CheckpointError
    when it does not verify). Collective: every rank gets the same step."""
    r = _core.checkpoint_load(_path(dir, "load_checkpoint"), None if step is None else int(step), comm)
    if r is None:
        return None
    step, world_size, path, shared, per_rank, metadata, skipped = r
    ck = Checkpoint(step, {n: _decode(k, d) for n, k, d in shared},
                    {n: _decode(k, d) for n, k, d in per_rank})
    ck.world_size = world_size
    ck.path = path
    ck.metadata = metadata
    ck.skipped = list(skipped)
    return ck


def checkpoint_steps(dir):
    """Steps of the checkpoints present under dir, ascending (not verified)."""
    return _core.checkpoint_steps(_path(dir, "checkpoint_steps"))


def wait_for_removals():
    """Waits until the old checkpoints that saves discarded are deleted (they
    are deleted in the background); call it before removing a checkpoint
    directory by other means."""
    _core.checkpoint_wait_for_removals()


def _path(d, call):
    """d as a str path; anything else (None) is an error, not a folder named "None"."""
    if isinstance(d, (str, bytes, os.PathLike)):
        return os.fsdecode(os.fspath(d))
    raise ArgumentError("%s on rank %d/%d: dir must be a path (str or os.PathLike), got %s"
                        % (call, _core.proc_id(None), _core.num_procs(None), type(d).__name__))


def _generator_state(g):
    if hasattr(g, "bit_generator"):  # numpy.random.Generator
        return ("numpy", g.bit_generator.state)
    if isinstance(g, np.random.RandomState):
        return ("numpy.RandomState", g.get_state())
    if hasattr(g, "get_state") and hasattr(g, "set_state"):  # torch.Generator
        return ("torch", g.get_state())
    raise ArgumentError("capture_rng: %r is not a numpy or torch generator" % (g,))


def capture_rng(*generators):
    """This process's random generator states, to save per rank: Python's
    random, numpy's global generator (np.random.*), torch's CPU generator
    (and CUDA's when initialized) when torch is imported, plus each generator
    given (numpy Generators such as np.random.default_rng(), RandomStates,
    torch.Generators)."""
    state = {"python": random.getstate(), "numpy": np.random.get_state()}
    torch = _torch()
    if torch is not None:
        state["torch"] = torch.get_rng_state()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            state["torch_cuda"] = torch.cuda.get_rng_state_all()
    state["generators"] = [_generator_state(g) for g in generators]
    return state


def restore_rng(state, *generators):
    """Restores what capture_rng captured: the next random numbers are those
    the captured process would have drawn. Pass the same generators, in order.
    On an error nothing is restored."""
    saved = state.get("generators", [])
    if len(saved) != len(generators):
        raise ArgumentError("restore_rng: %d generators captured, %d given" % (len(saved), len(generators)))
    for g, (kind, s) in zip(generators, saved):
        if _generator_state(g)[0] != kind:
            raise ArgumentError("restore_rng: a %s generator's state given to %r" % (kind, g))
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "torch" in state:
        import torch
        torch.set_rng_state(state["torch"])
        if "torch_cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["torch_cuda"])
    for g, (kind, s) in zip(generators, saved):
        if kind == "numpy":
            g.bit_generator.state = s
        elif kind == "numpy.RandomState":
            g.set_state(s)
        else:
            g.set_state(s)
