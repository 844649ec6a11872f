"""mpi_fork(4) under a launcher or inside a Slurm allocation: every rank prints
"fork_in_allocation: rank R/N on HOST" (N is the world size it ended up in)."""
import socket
import sys

from mpiml.mpi_tools import mpi_fork, num_procs, proc_id

mpi_fork(int(sys.argv[1]) if len(sys.argv) > 1 else 4)
print("fork_in_allocation: rank %d/%d on %s" % (proc_id(), num_procs(), socket.gethostname()), flush=True)
