"""The seed's Python implementation (bench/seed) on the benchmark workloads:
mpi_avg_grads and sync_params on the benchmark models, mpi_statistics_scalar.

  mpirun -np 2 /usr/bin/python3 bench/peers/seed_peer.py [--parts=grads,stats,avg]
      [--models=ac64,ac256,resnet50] [--stats-sizes=1000,1000000]
      [--rounds=7] [--round-ms=20]

Rank 0 prints JSON lines in the format of the C++ benchmarks.
"""
import numpy as np
import torch
from mpi4py import MPI

import common
import mpi_pytorch
import mpi_tools


class MpiComm:
    def barrier(self):
        MPI.COMM_WORLD.Barrier()

    def max(self, x):
        return MPI.COMM_WORLD.allreduce(x, op=MPI.MAX)


def main():
    rank, size = mpi_tools.proc_id(), mpi_tools.num_procs()
    mpi_pytorch.setup_pytorch_for_mpi()  # as the seed's users do
    comm = MpiComm()
    rounds = int(common.arg("rounds", "7"))
    round_s = float(common.arg("round-ms", "20")) * 1e-3
    parts = common.arg("parts", "grads,stats,avg")

    if "grads" in parts:
        for name in common.arg("models", "ac64,ac256,resnet50").split(","):
            model = common.make_model(name)
            common.fill(model, rank)
            info = common.model_info(model)
            avg = common.Variant("seed_python", lambda: mpi_pytorch.mpi_avg_grads(model))
            sync = common.Variant("seed_python", lambda: mpi_pytorch.sync_params(model),
                                  barrier_each=True)
            for bench, v in (("avg_grads", avg), ("sync_params", sync)):
                for t in common.measure(comm, [v], rounds, round_s):
                    common.emit(rank, "grads", bench, size, t, model=name, **info)
            del model

    if "stats" in parts:
        for n in [int(float(s)) for s in common.arg("stats-sizes", "1000,1000000").split(",")]:
            x = np.random.default_rng(1234 + rank).normal(0.5, 2.0, n).astype(np.float32)
            variants = [
                common.Variant("seed_python", lambda: mpi_tools.mpi_statistics_scalar(x)),
                common.Variant("seed_python_min_max",
                               lambda: mpi_tools.mpi_statistics_scalar(x, with_min_and_max=True)),
            ]
            for t in common.measure(comm, variants, rounds, round_s):
                common.emit(rank, "statistics", "mpi_statistics_scalar", size, t,
                            samples_per_rank=n)

    if "avg" in parts:
        common.bench_avg(comm, rank, size, "seed_python", mpi_tools.mpi_avg, rounds, round_s)


if __name__ == "__main__":
    main()
