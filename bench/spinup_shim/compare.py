#!/usr/bin/python3
"""Spinning Up's own PPO (github.com/openai/spinningup at 038665d, unmodified,
with its run_ppo.py runner: --peer, else $SPINUP_PPO_DIR, else
../shared/peers/spinup_ppo beside the repository) with its
MPI modules (mpi4py) and with mpiml's (through mpiml_spinup.py), at 1 and 2
ranks, in one run: per-epoch wall time and returns side by side.

    PYTHONPATH=<dir of the mpiml package> /usr/bin/python3 bench/spinup_shim/compare.py \
        [--peer=DIR] [--epochs=5] [--env=CartPole-v1] [--ranks=1,2] [--out=DIR]

Prints a markdown table (for BENCHMARKS.md) and the raw per-epoch times.
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PY = "/usr/bin/python3"


def epochs_of(progress):
    with open(progress) as f:
        rows = [line.rstrip("\n").split("\t") for line in f if line.strip()]
    head, rows = rows[0], rows[1:]
    it, ir = head.index("Time"), head.index("AverageEpRet")
    times, rets, prev = [], [], 0.0
    for r in rows:
        times.append(float(r[it]) - prev)
        prev = float(r[it])
        rets.append(float(r[ir]))
    return times, rets


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--peer", default=os.environ.get("SPINUP_PPO_DIR") or
                    os.path.join(os.path.dirname(ROOT), "shared", "peers", "spinup_ppo"))
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--env", default="CartPole-v1")
    ap.add_argument("--ranks", default="1,2")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    if not os.path.isfile(os.path.join(a.peer, "run_ppo.py")):
        sys.exit("compare.py: no Spinning Up PPO (run_ppo.py) in %s; set SPINUP_PPO_DIR or --peer"
                 % a.peer)
    out = a.out or tempfile.mkdtemp(prefix="spinup_compare_")
    os.makedirs(out, exist_ok=True)
    run_ppo = os.path.join(a.peer, "run_ppo.py")
    results = []
    for n in [int(x) for x in a.ranks.split(",")]:
        for impl, prefix in (("Spinning Up's mpi_tools (mpi4py)", []),
                             ("mpiml.mpi_tools / mpi_pytorch", [os.path.join(HERE, "mpiml_spinup.py")])):
            d = os.path.join(out, "%s_np%d" % ("mpiml" if prefix else "spinup", n))
            cmd = [PY] + prefix + [run_ppo, "--env", a.env, "--epochs", str(a.epochs),
                                   "--cpu", str(n), "--seed", "0", "--env_seed", "0", "--out", d]
            print("[compare] " + " ".join(cmd), file=sys.stderr, flush=True)
            t0 = time.time()
            p = subprocess.run(cmd, capture_output=True, text=True, cwd=out)
            wall = time.time() - t0
            if p.returncode != 0:
                print(p.stdout[-3000:], p.stderr[-3000:], file=sys.stderr)
                sys.exit("[compare] %s at %d ranks failed (exit %d)" % (impl, n, p.returncode))
            times, rets = epochs_of(os.path.join(d, "progress.txt"))
            results.append((n, impl, times, rets, wall))
    print("| Ranks | MPI modules | epoch time, median (s) | epoch times (s) | AverageEpRet by epoch | whole run (s) |")
    print("| ---: | --- | ---: | --- | --- | ---: |")
    for n, impl, times, rets, wall in results:
        print("| %d | %s | %.2f | %s | %s | %.1f |" % (
            n, impl, statistics.median(times), " ".join("%.2f" % t for t in times),
            " ".join("%.1f" % r for r in rets), wall))


if __name__ == "__main__":
    main()
