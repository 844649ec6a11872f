"""A job that ends on request (EXIT_STOPPED, 75) while its last rank's exit
goes on after the exit guard (run early, in an atexit handler, under
MPIML_PROFILE) and after MPI_Finalize.

usage: slow_exit.py <slow_s> <others_status> <others_delay_s> <self_term>
The last rank's exit lasts slow_s; with self_term it sends itself SIGTERM as
that begins (as srun -K does once another task ended). The others end with
others_status, others_delay_s after MPI_Finalize."""
import atexit
import os
import signal
import sys
import time

slow_s, others_status, others_delay_s, self_term = float(sys.argv[1]), int(sys.argv[2]), \
    float(sys.argv[3]), sys.argv[4] == "1"
rank = size = None


def exit_work():  # registered before mpiml's handlers: runs after them
    from mpiml import _core
    _core.finalize()
    if rank == size - 1:
        if self_term:
            os.kill(os.getpid(), signal.SIGTERM)
        until = time.monotonic() + slow_s
        while time.monotonic() < until:
            time.sleep(0.01)
        print("slow_exit: rank %d finished its exit" % rank, file=sys.stderr, flush=True)
    else:
        time.sleep(others_delay_s)


atexit.register(exit_work)
import numpy as np  # noqa: E402
import mpiml  # noqa: E402
import mpiml.mpi_tools as mt  # noqa: E402

rank, size = mt.proc_id(), mt.num_procs()
mt.mpi_sum(np.ones(3))
sys.exit(mpiml.EXIT_STOPPED if rank == size - 1 else others_status)
