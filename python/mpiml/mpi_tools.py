"""The seed's mpi_tools on mpiml: drop-in for spinup.utils.mpi_tools.

Same names, signatures and return kinds; differences from the seed (each
tested in python/tests/test_mpi_tools.py):
- dtype is kept (the seed casts everything to float32); integer and bool
  averages are float64; Python ints are int64 and floats float64.
- mpi_statistics_scalar is one collective, accumulated in double; float32
  samples give numpy float32 results (as the seed), others float64. Ranks may
  have no samples; when no rank has any, every rank raises NoSamplesError
  (the seed returns nan on every rank, or fails on one rank only with
  with_min_and_max).
- mpi_fork relaunches with the exact original command line (python -m too),
  the linked MPI's launcher with --oversubscribe / --allow-run-as-root as
  needed, and exits with the job's exit status (the seed exits 0).
- every call takes an optional comm= (None: MPI_COMM_WORLD, or an mpi4py
  communicator); errors are mpiml.Error subclasses naming the call and rank.
"""
import operator
import os
import sys

import numpy as np

from . import _core
from .errors import ArgumentError, DtypeError
from . import runtime as _runtime  # noqa: F401  (installs the excepthooks)

# Reduction operations, one constant per op of mpiml's registry: SUM = "sum",
# PROD, MIN, MAX, LAND, LOR, LXOR, BAND, BOR, BXOR (mpi4py's MPI.SUM etc. are
# accepted too).
_OPS = {_name.upper(): _name for _name in _core.op_names()}
globals().update(_OPS)

__all__ = ["mpi_fork", "restart_attempt", "msg", "pprint", "proc_id", "allreduce", "num_procs", "broadcast",
           "mpi_op", "mpi_sum", "mpi_avg", "mpi_statistics_scalar", "barrier", "IN_PLACE"] + list(_OPS)


def _whole(v, what, call, rank=True):
    """v as an int (numpy integers too); a float, even 2.0, or a bool is an
    error naming the call, never truncated."""
    if not isinstance(v, bool):
        try:
            return operator.index(v)
        except TypeError:
            pass
    raise ArgumentError("%s: %s must be an int, got %r" % (_where(call) if rank else call, what, v))


class _InPlace:
    def __repr__(self):
        return "mpiml.IN_PLACE"


IN_PLACE = _InPlace()


def mpi_fork(n, bind_to_core=False, restarts=0, backoff=1.0):
    """Re-launches this Python program (same interpreter, same command line,
    byte for byte) on n MPI ranks and exits with the job's exit status.
    No-op when n <= 1, when IN_MPI is set, or when already started by an MPI
    launcher. The launcher is chosen by mpiml's C++ mpi_fork (MPIML_MPIRUN
    overrides it; MPIML_MPIRUN_FLAGS adds flags).

    restarts=k starts the job again after a failure, up to k times, after
    backoff seconds (doubling), with one line naming what failed; the ranks
    see restart_attempt() > 0 and resume from their last checkpoint."""
    n = _whole(n, "n", "mpi_fork", rank=False)
    restarts = _whole(restarts, "restarts", "mpi_fork", rank=False)
    if restarts < 0:
        raise ArgumentError("mpi_fork: restarts must be >= 0, got %r" % (restarts,))
    if n <= 1 or _core.started_by_launcher():
        return
    orig = list(getattr(sys, "orig_argv", [sys.executable] + sys.argv))
    # bytes: arguments that are not UTF-8 pass unchanged
    program = [os.fsencode(a) for a in [sys.executable] + orig[1:]]
    sys.stdout.flush()
    sys.stderr.flush()
    # Open MPI settings the program made: os.environ never holds the ones an
    # MPI started in this process set (mpi4py imported first), so these pass.
    user = [k + "=" + v for k, v in os.environ.items() if k.startswith("OMPI_MCA_")]
    # Signals sent to this process alone (SIGTERM, SIGHUP, SIGUSR1, SIGUSR2,
    # SIGINT by kill) are passed on to the launcher while the job runs.
    if int(restarts) > 0:
        sys.exit(_core.run_with_restarts(int(n), bool(bind_to_core), program, int(restarts),
                                         float(backoff), user))
    sys.exit(_core.run_once(int(n), bool(bind_to_core), program, user))


def restart_attempt():
    """0 on a job's first run, k on its k-th restart: by mpi_fork(n, restarts=...)
    or mpiml-run (MPIML_ATTEMPT), plus Slurm's requeues of the batch job
    (SLURM_RESTART_COUNT)."""
    return _core.restart_attempt()


def msg(m, string=""):
    """Every rank prints "Message from <rank>: <string> \\t <m>"."""
    print(("Message from %d: %s \t " % (proc_id(), string)) + str(m), flush=True)


def pprint(input_str="", end="\n", comm=None):
    """Print for MPI parallel programs: only rank 0 of comm prints."""
    if _core.proc_id(comm) == 0:
        print(str(input_str) + end, end="", flush=True)


def proc_id(comm=None):
    """Rank of the calling process."""
    return _core.proc_id(comm)


def num_procs(comm=None):
    """Number of MPI processes."""
    return _core.num_procs(comm)


def barrier(comm=None):
    _core.barrier(comm)


def _is_in_place(x):
    if x is IN_PLACE:
        return True
    mpi = sys.modules.get("mpi4py.MPI")
    return mpi is not None and x is mpi.IN_PLACE


def _is_tensor(x):
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)  # nn.Parameter too


def _where(call):
    return "%s on rank %d/%d" % (call, _core.proc_id(None), _core.num_procs(None))


def _torch_array(x, call, written=False):
    if x.device.type != "cpu":
        raise ArgumentError("%s: tensor is on %s; mpiml's Python collectives take CPU tensors "
                            "(use .cpu())" % (_where(call), x.device))
    if x.layout != sys.modules["torch"].strided:
        raise ArgumentError("%s: a %s tensor; mpiml's Python collectives take dense tensors "
                            "(t.to_dense())" % (_where(call), x.layout))
    x = x.detach()
    if x.is_conj() or x.is_neg():
        if written:  # a lazy view: the result would land in a copy
            raise ArgumentError("%s: the tensor to write is a conjugate or negative "
                                "view (t.conj()); pass a tensor that owns its values (resolve_conj())"
                                % _where(call))
        x = x.resolve_conj().resolve_neg()
    try:
        return x.numpy()
    except TypeError as e:
        raise DtypeError("%s: tensor dtype %s has no numpy equivalent (%s); convert it (t.float()), "
                         "or use broadcast or mpi_pytorch.mpi_avg_tensor, which take it"
                         % (_where(call), x.dtype, e)) from None


def _array(x, call, written=False):
    """x as a numpy array, without a copy when it already is one (or a CPU tensor)."""
    if type(x) is np.ndarray:
        return x
    if isinstance(x, np.ndarray):
        return x
    if _is_tensor(x):
        return _torch_array(x, call, written)
    return np.asarray(x)


def _spec_array(buf, what, written):
    """An mpi4py buffer specification ([data, MPI.DATATYPE] or [data, count,
    MPI.DATATYPE]) or a bare buffer, as the numpy array it names: its first
    count elements; a datatype other than the data's is an error."""
    spec = isinstance(buf, (list, tuple)) and 2 <= len(buf) <= 3 and hasattr(buf[-1], "Get_size")
    data = buf[0] if spec else buf
    if written and not (isinstance(data, np.ndarray) or _is_tensor(data)):
        raise ArgumentError("%s: %s must be a writable numpy array or CPU tensor (the result is "
                            "written into it), got %s" % (_where("allreduce"), what, type(data).__name__))
    a = _array(data, "allreduce", written)
    if not spec:
        return a
    try:
        from mpi4py.util.dtlib import to_numpy_dtype
        dt = np.dtype(to_numpy_dtype(buf[-1]))
    except (ImportError, ValueError, TypeError):
        dt = None
    if dt is not None and dt != a.dtype:
        raise ArgumentError("%s: %s's datatype %s is not its data's dtype %s"
                            % (_where("allreduce"), what, getattr(buf[-1], "name", buf[-1]), a.dtype))
    if len(buf) == 3:
        count = _whole(buf[1], what + "'s count", "allreduce")
        if not 0 <= count <= a.size:
            raise ArgumentError("%s: %s's count %d is outside its data's %d elements"
                                % (_where("allreduce"), what, count, a.size))
        if count < a.size:
            a = a.reshape(-1)[:count]  # a view where a is contiguous (recvbuf must be)
    return a


def allreduce(sendbuf, recvbuf, op="sum", comm=None):
    """recvbuf[i] = op over ranks of sendbuf[i] (mpi4py's Allreduce call
    shape, buffer specifications with a count and datatype too). sendbuf may
    be IN_PLACE (mpiml's or mpi4py's); recvbuf must be a writable contiguous
    numpy array or CPU tensor of sendbuf's dtype and size."""
    recv = _spec_array(recvbuf, "recvbuf", written=True)
    send = None if _is_in_place(sendbuf) else _spec_array(sendbuf, "sendbuf", written=False)
    _core.allreduce(send, recv, op, comm)


def broadcast(x, root=0, comm=None):
    """Broadcasts x from root, in place (numpy array or CPU tensor, of any
    dtype: bfloat16 too)."""
    if type(x) is not np.ndarray and _is_tensor(x):
        try:
            x = _torch_array(x, "broadcast", written=True)
        except DtypeError:
            if not x.is_contiguous():
                raise ArgumentError("%s: a %s tensor must be contiguous (its bytes are broadcast "
                                    "in place)" % (_where("broadcast"), x.dtype)) from None
            import torch  # a dtype numpy lacks: its bytes, in place
            x = _torch_array(x.detach().reshape(-1).view(torch.uint8), "broadcast")
    if isinstance(x, np.ndarray) and x.dtype == np.float16:
        x = x.view(np.uint16)  # no MPI datatype: its bytes (the same itemsize), in place
    _core.broadcast(x, _whole(root, "root", "broadcast"), comm)


# The seed's reductions, bound directly to the C++ functions (numpy arrays,
# scalars, lists and tuples converted in C++; CPU tensors through _array).
mpi_op = _core.mpi_op
mpi_sum = _core.mpi_sum
mpi_avg = _core.mpi_avg
mpi_statistics_scalar = _core.mpi_statistics_scalar
