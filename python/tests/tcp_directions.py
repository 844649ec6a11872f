"""Between two hosts, which TCP connections carry mpiml's traffic.

Run as 2 ranks, one per host, over Open MPI's TCP transport with two links
per peer (mpiml's default). Each rank sums 32 MiB with its peer three times,
checks the sums, then reads its host's TCP sockets (ss) and exits 1 unless
they are as the mode expects:

  mpiml    mpiml initializes MPI: two connections, each carrying one
           direction (95 % of its bytes or more one way).
  control  mpi4py initializes MPI and rank 0 sends first, rank 1 answers
           (the first exchange that puts both directions on one connection):
           one connection carrying both ways, so the check can tell.
"""
import subprocess
import sys

mode = sys.argv[1]
if mode == "control":
    from mpi4py import MPI
    import numpy as np
    comm = MPI.COMM_WORLD
    one = np.zeros(1, np.uint8)
    if comm.rank == 0:
        comm.Send(one, 1)
        comm.Recv(one, 1)
    else:
        comm.Recv(one, 0)
        comm.Send(one, 0)
elif mode != "mpiml":
    sys.exit(f"tcp_directions.py: mode must be mpiml or control, not {mode!r}")

import numpy as np
from mpiml import mpi_tools

rank, size = mpi_tools.proc_id(), mpi_tools.num_procs()
if size != 2:
    sys.exit(f"tcp_directions.py: needs 2 ranks, not {size}")
n = 8 << 20
for i in range(3):
    x = np.full(n, rank + 1 + i, np.float32)
    s = mpi_tools.mpi_sum(x)
    if not np.all(s == 3 + 2 * i):
        sys.exit(f"rank {rank}: wrong sum in round {i}")
mpi_tools.barrier()

out = subprocess.run(["ss", "-tinH", "state", "established"], capture_output=True, text=True,
                     check=True).stdout.splitlines()
conns = []  # (MiB sent, MiB received) of the connections that carried > 4 MiB
for head, info in zip(out[::2], out[1::2]):
    f = dict(kv.split(":", 1) for kv in info.split() if kv.startswith(("bytes_acked:", "bytes_received:")))
    sent, recv = int(f.get("bytes_acked", 0)) / 2**20, int(f.get("bytes_received", 0)) / 2**20
    if sent + recv > 4:
        conns.append((round(sent), round(recv)))
if mode == "mpiml":
    ok = len(conns) == 2 and all(min(c) <= 0.05 * max(c) for c in conns)
else:
    ok = len(conns) == 1 and min(conns[0]) >= 0.4 * max(conns[0])
print(f"tcp_directions {mode}: rank {rank}: connections (MiB out, in): {conns}: "
      f"{'as expected' if ok else 'NOT as expected'}", flush=True)
mpi_tools.barrier()
sys.exit(0 if ok else 1)
