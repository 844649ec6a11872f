"""Cost of mpiml's Python profiling against cProfile alone.

    mpirun -np N python3 bench/pyprofile_overhead.py [reps=5] [iterations=100000]

Each rank runs the same Python workload (small numpy operations and small
function calls) under three settings, in rotating order per repetition so
that drifting machine load hits all alike:
  none     no profiler
  cprofile cProfile.Profile enable / disable and dump_stats (one file per rank,
           as done by hand)
  mpiml    mpiml.profile_start(dir) / profile_stop() (cProfile, the C++
           profile, every file and the summary with its Python table)
Times are from the start to the end of each setting, including writing the
files, the maximum over ranks; the table gives the median over repetitions
and, apart, the time to stop (last rank to arrive).
"""
import cProfile
import contextlib
import io
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

import mpiml
import mpiml.mpi_tools as mt


def small(x):
    return x * 2.0 + 1.0


def step(a):
    return np.sqrt(small(a))


def workload(n):
    a = np.ones(16)
    s = 0.0
    for _ in range(n):
        a = step(a)
        s += float(a[0])
    return s


@contextlib.contextmanager
def quiet():
    """Standard output (Python's and C's) to /dev/null."""
    sys.stdout.flush()
    saved = os.dup(1)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        os.dup2(saved, 1)
        os.close(null)
        os.close(saved)


def run(mode, n, d, rank):
    """(total, stop) seconds: total is the maximum over ranks; stop (from the
    end of the workload to the files written) the minimum, that of the last
    rank to arrive, which does not wait for the others."""
    mt.barrier()
    t0 = time.perf_counter()
    if mode == "cprofile":
        p = cProfile.Profile()
        p.enable()
        workload(n)
        t1 = time.perf_counter()
        p.disable()
        p.dump_stats(os.path.join(d, "cprofile_%d.prof" % rank))
    elif mode == "mpiml":
        mpiml.profile_start(d)
        workload(n)
        t1 = time.perf_counter()
        with quiet():  # rank 0's summary
            mpiml.profile_stop()
    else:
        workload(n)
        t1 = time.perf_counter()
    t2 = time.perf_counter()
    total, minus_stop = mt.mpi_op(np.array([t2 - t0, t1 - t2]), "max")
    return total, -minus_stop


def main():
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 100000
    rank, size = mt.proc_id(), mt.num_procs()
    d = tempfile.mkdtemp(prefix="pyprof%d_" % rank)  # per rank; the profile makes its own files
    modes = ["none", "cprofile", "mpiml"]
    times = {m: [] for m in modes}
    run("none", n // 10, d, rank)  # warm-up
    for i in range(reps):
        for m in modes[i % 3:] + modes[:i % 3]:
            times[m].append(run(m, n, d, rank))
    shutil.rmtree(d)
    if rank == 0:
        med = {m: statistics.median(t for t, _ in times[m]) for m in modes}
        low = {m: min(t for t, _ in times[m]) for m in modes}
        stop = {m: statistics.median(s for _, s in times[m]) for m in modes}
        print("%d rank(s), %d iterations, %d repetitions; seconds: median, min, median of the stop"
              % (size, n, reps))
        for m in modes:
            print("%-9s %8.3f %8.3f %8.4f" % (m, med[m], low[m], stop[m]))
        print("mpiml / cprofile: %+.1f%% (median), %+.1f%% (min); stop: %+.4f s" % (
            100 * (med["mpiml"] / med["cprofile"] - 1), 100 * (low["mpiml"] / low["cprofile"] - 1),
            stop["mpiml"] - stop["cprofile"]))


if __name__ == "__main__":
    main()
