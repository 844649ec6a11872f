"""This job's rank and size, and Python objects passed between ranks, with
mpiml's own calls only: the suites that use it run under any MPI mpiml is
built for (mpi4py may be built for another)."""
import pickle

import numpy as np

import mpiml.mpi_tools as mt

RANK, SIZE = mt.proc_id(), mt.num_procs()


def bcast(obj, root=0):
    """root's obj on every rank."""
    data = np.frombuffer(pickle.dumps(obj), np.uint8) if RANK == root else None
    n = np.array([len(data) if data is not None else 0], np.int64)
    mt.broadcast(n, root)
    buf = data.copy() if data is not None else np.empty(int(n[0]), np.uint8)
    mt.broadcast(buf, root)
    return pickle.loads(buf.tobytes())


def allgather(obj):
    """Every rank's obj, in rank order."""
    return [bcast(obj, root) for root in range(SIZE)]


barrier = mt.barrier
