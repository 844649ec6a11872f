"""MPI initialized by mpi4py below MPI_THREAD_MULTIPLE: creating the group
must fail with a clear error on every rank (run by ctest, which expects the
message), and mpi4py keeps working."""
import mpi4py
mpi4py.rc.thread_level = "serialized"
from mpi4py import MPI  # noqa: E402

import torch.distributed as dist  # noqa: E402

import mpiml.torch  # noqa: E402

try:
    mpiml.torch.init_process_group(abort_on_exception=False)
except RuntimeError as e:
    assert "MPI_THREAD_MULTIPLE" in str(e), e
    assert MPI.COMM_WORLD.allreduce(1) == MPI.COMM_WORLD.Get_size()
    if MPI.COMM_WORLD.Get_rank() == 0:
        print("clear error:", e)
else:
    raise SystemExit("no error at MPI_THREAD_SERIALIZED")
