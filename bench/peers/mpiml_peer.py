"""mpiml's Python package (mpiml.mpi_tools / mpiml.mpi_pytorch) on the
benchmark workloads of seed_peer.py, with the same timing protocol.

  PYTHONPATH=build/python mpirun -np 2 /usr/bin/python3 bench/peers/mpiml_peer.py
      [--parts=grads,stats,avg,averager] [--models=ac64,ac256,resnet50]
      [--stats-sizes=1000,1000000] [--rounds=7] [--round-ms=20] [--side-by-side]

Rank 0 prints JSON lines in the format of the C++ benchmarks (impl "mpiml_python").
--parts=averager (not a default part) times, for one model, mpi_avg_grads
packed and with gradient_as_bucket_view against GradAverager holding each
plan (and the seed's, with --side-by-side), interleaved.

--side-by-side times three implementations in this one process, interleaved
round by round (so a shared machine's load hits them alike): the seed's
module (bench/seed, on mpi4py, impl "sbs_seed_python"), mpiml's Python
package ("sbs_mpiml_python") and the same mpiml C++ functions called from a
C++ loop on the same data ("sbs_mpiml_cpp"). Each timed call runs the
operation K times (K = 16, 4 for gradients); times are per operation.
"""
import numpy as np
import torch  # noqa: F401

import common
from mpiml import _core, _torch, mpi_pytorch, mpi_tools


class Comm:
    def barrier(self):
        mpi_tools.barrier()

    def max(self, x):
        return float(mpi_tools.mpi_op(float(x), mpi_tools.MAX))


def repeat(fn, k):
    def run():
        for _ in range(k):
            fn()
    return run


def per_op(timings, k):
    for t in timings:
        t["median_us"] /= k
        t["min_us"] /= k
        t["ops_per_call"] = k
    return timings


def main():
    rank, size = mpi_tools.proc_id(), mpi_tools.num_procs()
    mpi_pytorch.setup_pytorch_for_mpi()
    comm = Comm()
    rounds = int(common.arg("rounds", "7"))
    round_s = float(common.arg("round-ms", "20")) * 1e-3
    parts = common.arg("parts", "grads,stats,avg")
    sbs = "--side-by-side" in __import__("sys").argv
    if sbs:
        import mpi_pytorch as seed_pytorch  # bench/seed, on sys.path through common
        import mpi_tools as seed_tools

    def run(suite, bench, variants, k, **extra):
        if sbs:
            timings = per_op(common.measure(comm, variants, rounds, round_s), k)
        else:
            timings = common.measure(comm, variants[1:2], rounds, round_s)
        for t in timings:
            common.emit(rank, suite, bench, size, t, **extra)

    def variants(seed_fn, py_fn, cpp_fn, k, suffix=""):
        if not sbs:
            return [None, common.Variant("mpiml_python" + suffix, py_fn)]
        return [common.Variant("sbs_seed_python" + suffix, repeat(seed_fn, k)),
                common.Variant("sbs_mpiml_python" + suffix, repeat(py_fn, k)),
                common.Variant("sbs_mpiml_cpp" + suffix, lambda: cpp_fn(k))]

    if "grads" in parts:
        for name in common.arg("models", "ac64,ac256,resnet50").split(","):
            model = common.make_model(name)
            common.fill(model, rank)
            info = common.model_info(model)
            k = 4
            run("grads", "avg_grads",
                variants(lambda: seed_pytorch.mpi_avg_grads(model),
                         lambda: mpi_pytorch.mpi_avg_grads(model),
                         lambda k: _torch._bench_avg_grads(model, k), k), k, model=name, **info)
            if not sbs:
                sync = common.Variant("mpiml_python", lambda: mpi_pytorch.sync_params(model),
                                      barrier_each=True)
                for t in common.measure(comm, [sync], rounds, round_s):
                    common.emit(rank, "grads", "sync_params", size, t, model=name, **info)
            del model

    if "averager" in parts:  # not in the default parts: one model's ways from Python
        for name in common.arg("models", "ac64,ac256").split(","):
            model = common.make_model(name)
            common.fill(model, rank)
            info = common.model_info(model)
            held = mpi_pytorch.GradAverager(model)
            views_model = common.make_model(name)
            common.fill(views_model, rank)
            held_views = mpi_pytorch.GradAverager(views_model, gradient_as_bucket_view=True)
            vs = [common.Variant("mpi_avg_grads", lambda: mpi_pytorch.mpi_avg_grads(model)),
                  common.Variant("mpi_avg_grads_views", lambda: mpi_pytorch.mpi_avg_grads(
                      views_model, gradient_as_bucket_view=True)),
                  common.Variant("GradAverager", held),
                  common.Variant("GradAverager_views", held_views)]
            if sbs:
                vs.insert(0, common.Variant("seed", lambda: seed_pytorch.mpi_avg_grads(model)))
            for t in common.measure(comm, vs, rounds, round_s):
                common.emit(rank, "grads", "avg_grads_held", size, t, model=name, **info)
            # the free function's cached plan for views_model goes with it (LRU);
            # the held ones are dropped here, on every rank alike
            del held, held_views, model, views_model

    if "stats" in parts:
        for n in [int(float(s)) for s in common.arg("stats-sizes", "1000,1000000").split(",")]:
            x = np.random.default_rng(1234 + rank).normal(0.5, 2.0, n).astype(np.float32)
            k = 16 if n <= 10000 else 1
            for mm, suffix in ((False, ""), (True, "_min_max")):
                run("statistics", "mpi_statistics_scalar",
                    variants(lambda: seed_tools.mpi_statistics_scalar(x, mm),
                             lambda: mpi_tools.mpi_statistics_scalar(x, mm),
                             lambda k: _core._bench_statistics(x, mm, k), k, suffix),
                    k, samples_per_rank=n)

    if "avg" in parts:
        scalar = float(rank) + 0.5
        vec = (np.arange(1000) + rank).astype(np.float32)
        k = 16
        run("mpi_avg", "mpi_avg",
            variants(lambda: seed_tools.mpi_avg(scalar), lambda: mpi_tools.mpi_avg(scalar),
                     lambda k: _core._bench_avg_scalar(scalar, k), k), k, elements=1)
        run("mpi_avg", "mpi_avg",
            variants(lambda: seed_tools.mpi_avg(vec), lambda: mpi_tools.mpi_avg(vec),
                     lambda k: _core._bench_avg_vector(vec, k), k), k, elements=1000)


if __name__ == "__main__":
    main()
