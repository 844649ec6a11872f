"""The torch.distributed backend "mpiml": MPI for stock PyTorch.

    import mpiml.torch                      # registers the backend "mpiml"
    mpiml.torch.init_process_group()        # under mpirun; no MASTER_ADDR/PORT
    # or: dist.init_process_group("mpiml", ...) with a store, rank and size of your own

Collectives run on mpiml's core (shared-memory path on a node, fixed reduction
order: bit-identical results on every rank and from run to run) from a worker
thread per group, in issue order. See docs/TORCH_DISTRIBUTED.md.
"""

import atexit as _atexit
import datetime as _dt
import os as _os
import socket as _socket
import sys as _sys

import torch as _torch
import torch.distributed as _dist

from mpiml import _c10d

__all__ = ["BACKEND", "init_process_group", "ProcessGroupMpiml", "is_registered"]

BACKEND = "mpiml"
ProcessGroupMpiml = _c10d.ProcessGroupMpiml


def _create(dist_backend_opts, pg_options=None):
    """The backend's creator (register_backend's extended API): runs on the
    member ranks of a new group only."""
    if pg_options is not None:
        raise RuntimeError("mpiml backend: pg_options are not supported")
    o = dist_backend_opts
    timeout = o.timeout.total_seconds() if hasattr(o.timeout, "total_seconds") else float(o.timeout)
    return _c10d.ProcessGroupMpiml(o.group_rank, o.group_size, timeout,
                                   [int(r) for r in o.global_ranks_in_group], str(o.group_id))


_atexit.register(_c10d.at_exit)


def is_registered():
    return BACKEND.upper() in _dist.Backend._plugins


if not is_registered():
    _dist.Backend.register_backend(BACKEND, _create, extended_api=True)


def _abort_on_exception(exc_type, exc, tb):
    # An exception escaping on one rank would leave the others waiting in a
    # collective forever: print it and end the whole job.
    import traceback
    traceback.print_exception(exc_type, exc, tb)
    _sys.stderr.flush()
    _c10d.abort("uncaught Python exception: %s: %s" % (exc_type.__name__, exc))


def init_process_group(backend=BACKEND, timeout=None, abort_on_exception=True, **kwargs):
    """dist.init_process_group for a job started by mpirun: rank and world
    size come from MPI, and rank 0 hosts the TCPStore on a free port whose
    address it broadcasts over MPI (no MASTER_ADDR / MASTER_PORT).

    backend: "mpiml" (default) or any other backend, e.g. "gloo".
    timeout: datetime.timedelta or seconds; bounds every operation (the
    shorter of it and MPIML_TIMEOUT). abort_on_exception: an uncaught
    exception on any rank aborts the MPI job instead of hanging it.
    Returns the default process group."""
    if _dist.is_initialized():
        raise RuntimeError("mpiml.torch.init_process_group: torch.distributed is already initialized")
    _c10d.ensure_mpi()
    rank, size = _c10d.world_rank(), _c10d.world_size()
    if timeout is None:
        timeout = _dt.timedelta(minutes=30)
    elif not isinstance(timeout, _dt.timedelta):
        timeout = _dt.timedelta(seconds=float(timeout))
    host = _socket.gethostname()
    if rank == 0:
        # Not waiting for workers here: they learn the port only below.
        store = _dist.TCPStore("0.0.0.0", 0, size, True, timeout, wait_for_workers=False)
        address = "%s:%d" % (host, store.port)
    else:
        address = ""
    address = _c10d.broadcast_string(address, 0)
    if rank != 0:
        master, port = address.rsplit(":", 1)
        connect = "127.0.0.1" if master == host else master
        store = _dist.TCPStore(connect, int(port), size, False, timeout)
    _os.environ.setdefault("RANK", str(rank))
    _os.environ.setdefault("WORLD_SIZE", str(size))
    _dist.init_process_group(backend, store=store, rank=rank, world_size=size, timeout=timeout,
                             **kwargs)
    if abort_on_exception and size > 1 and _sys.excepthook is _sys.__excepthook__:
        _sys.excepthook = _abort_on_exception
    return _dist.distributed_c10d._get_default_group()
