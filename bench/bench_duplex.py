"""Large allreduces between two hosts, where both directions of the link carry
data at once: mpiml.allreduce (MPI's allreduce), dist.all_reduce on the
"mpiml" backend and on Gloo, by turns. Run it once as is (under mpiml,
put off: the send protocol over one connection) and once with
`--mca btl_tcp_flags send,put,inplace,need-ack,need-csum,hetero-rdma`
(Open MPI 4.1's default flags: its emulated put over TCP) to see what put
costs when both directions carry data.

  mpirun -np 2 --host h1:1,h2:1 /usr/bin/python3 bench/bench_duplex.py [--mib=64] [--calls=6] [--rounds=2]

Rank 0 prints, per variant, the median (fastest, slowest) of the slowest
rank's call time over all calls, the rate per direction of the median and
the median CPU time (user + system, all threads) of the busiest rank;
every rank exits 1 if a sum was wrong.
"""
import datetime
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "peers"))
import common  # noqa: E402

import mpiml  # noqa: E402
import mpiml.torch  # noqa: E402


def main():
    mib, calls, rounds = (int(common.arg(k, d)) for k, d in (("mib", 64), ("calls", 6), ("rounds", 2)))
    mpiml.torch.init_process_group(timeout=datetime.timedelta(seconds=300))
    rank, n = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    x = np.ones(mib << 18, dtype=np.float32)
    t, g = torch.ones(mib << 18), torch.ones(mib << 18)
    variants = {
        "mpiml.allreduce (MPI's allreduce)": lambda: mpiml.allreduce(mpiml.IN_PLACE, x),
        'dist.all_reduce on "mpiml"': lambda: dist.all_reduce(t),
        "dist.all_reduce on Gloo": lambda: dist.all_reduce(g, group=gloo),
    }
    times = {k: [] for k in variants}
    cpus = {k: [] for k in variants}
    for f in variants.values():  # warm-up: connections, buffers
        f()
    for _ in range(rounds):
        for k, f in variants.items():
            for _ in range(calls):
                dist.barrier()
                c0, t0 = time.process_time(), time.perf_counter()
                f()
                dt = torch.tensor([time.perf_counter() - t0, time.process_time() - c0], dtype=torch.float64)
                dist.all_reduce(dt, op=dist.ReduceOp.MAX)
                times[k].append(float(dt[0]))
                cpus[k].append(float(dt[1]))
    # Each variant's ones, summed in place 1 + rounds * calls times: powers of n, exact.
    times_summed = 1 + rounds * calls
    ok = bool(np.all(x == float(n) ** times_summed)) and all(bool(torch.all(y == float(n) ** times_summed)) for y in (t, g))
    okt = torch.tensor([0 if ok else 1])
    dist.all_reduce(okt)
    if rank == 0:
        flags = os.environ.get("OMPI_MCA_btl_tcp_flags", "mpiml's default (put off)")
        print(f"# bench_duplex: {n} ranks, {mib} MiB float32 sum, {rounds} rounds x {calls} calls by turns; "
              f"btl_tcp_flags {flags}")
        for k, v in times.items():
            v.sort()
            med = v[len(v) // 2]
            # A 2-rank allreduce sends half the data each way twice (reduce-scatter, allgather)
            # or all of it once each way: either way `mib` MiB per direction.
            rate = (mib << 20) * 8 / med / 1e6
            c = common.median(cpus[k])
            print(f"{k:36s} {med * 1e3:7.1f} ms ({v[0] * 1e3:.1f}, {v[-1] * 1e3:.1f}), "
                  f"{rate:5.0f} Mbit/s per direction, CPU {c * 1e3:5.1f} ms")
        print("sums exact on every rank:", "yes" if okt.item() == 0 else "NO")
    dist.destroy_process_group()
    return 0 if okt.item() == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
