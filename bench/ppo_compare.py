#!/usr/bin/python3
"""mpiml-ppo against Spinning Up's own PyTorch PPO, side by side in one run.

CartPole-v1, 4000 env steps per epoch, Spinning Up's defaults, seed 0, both
programs on the same BLAS (whatever libblas.so.3 points to), at each rank
count: mpiml-ppo, then the peer when present: Spinning Up's PPO
(github.com/openai/spinningup, unmodified, with a run_ppo.py runner; not part
of this repository), found at --peer, else $SPINUP_PPO_DIR, else
../shared/peers/spinup_ppo beside the repository (where the test machines
keep it). Its commit is read from the folder (a git checkout, or a README
that names it).
Epoch time = the difference of consecutive `Time` values in progress.txt;
the first epoch is dropped and the median of the next ones is reported.
mpiml-ppo's phases come from its own end-of-run line (rank 0), the FLOP floor
from its update arithmetic over bench_sgemm's rate for [rows x 64] x [64 x 64]
measured in the same run. Writes bench/results/ppo.json and regenerates
BENCHMARKS.md (bench/report.py).

  bench/ppo_compare.py [--ranks 1,2] [--epochs 5] [--peer DIR] [--baseline PROG] [--no-markdown]
"""
import argparse
import datetime
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

import run  # bench/run.py: the build type of a build directory

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "bench", "results", "ppo.json")
PEER_REPO = "github.com/openai/spinningup"
# Where the test machines keep the peer; SPINUP_PPO_DIR or --peer override it.
DEFAULT_PEER = os.path.join(os.path.dirname(ROOT), "shared", "peers", "spinup_ppo")


def sh(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def epoch_times(progress):
    with open(progress) as f:
        rows = [line.rstrip("\n").split("\t") for line in f if line.strip()]
    col = rows[0].index("Time")
    t = [float(r[col]) for r in rows[1:]]
    return [b - a for a, b in zip([0.0] + t, t)]


def median_tail(times):
    return statistics.median(times[1:]) if len(times) > 1 else float("nan")


def run_mpiml(prog, ranks, epochs, out):
    p = sh([prog, "--env", "CartPole-v1", "--cpu", str(ranks), "--epochs", str(epochs),
            "--seed", "0", "--out", out], timeout=1800)
    if p.returncode != 0:
        sys.exit("ppo_compare: %s failed:\n%s%s" % (prog, p.stdout[-2000:], p.stderr[-2000:]))
    res = {"epoch": median_tail(epoch_times(os.path.join(out, "progress.txt")))}
    m = re.search(r"rollout ([\d.]+) s, policy update ([\d.]+) s, value update ([\d.]+) s"
                  r"(?:; update arithmetic ([\d.]+) GFLOP)?", p.stdout)
    if m:
        res.update(rollout=float(m[1]), policy=float(m[2]), value=float(m[3]),
                   gflop=float(m[4]) if m[4] else None)
    return res


def run_peer(peer, ranks, epochs, out):
    p = sh(["/usr/bin/python3", "run_ppo.py", "--env", "CartPole-v1", "--cpu", str(ranks),
            "--epochs", str(epochs), "--seed", "0", "--out", out], cwd=peer, timeout=3600)
    if p.returncode != 0:
        sys.exit("ppo_compare: the peer failed:\n%s%s" % (p.stdout[-2000:], p.stderr[-2000:]))
    return {"epoch": median_tail(epoch_times(os.path.join(out, "progress.txt")))}


def sgemm_rate(tool, rows):
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", GOTO_NUM_THREADS="1",
               BLIS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    p = sh([tool, str(rows)], env=env, timeout=300)
    return float(p.stdout.strip()) if p.returncode == 0 else None


def machine():
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    mpi = sh(["mpirun", "--version"]).stdout.splitlines()
    blas = os.path.realpath("/usr/lib/x86_64-linux-gnu/libblas.so.3")
    return {"cpu": cpu, "cores": os.cpu_count(), "mpi": mpi[0] if mpi else "?", "blas": blas}


def peer_commit(peer):
    """The peer's commit: from git when it is a checkout, else from its README."""
    p = sh(["git", "-C", peer, "rev-parse", "HEAD"])
    if p.returncode == 0:
        return p.stdout.strip()
    try:
        with open(os.path.join(peer, "README.md")) as f:
            m = re.search(r"commit\s+`?([0-9a-f]{7,40})", f.read())
        return m.group(1) if m else "unknown"
    except OSError:
        return "unknown"


def fmt_s(x):
    return "%.3f s" % x if x == x else "n/a"


def render(data):
    """The PPO tables of BENCHMARKS.md from a ppo.json."""
    info, rows, epochs = data["meta"], data["rows"], data["meta"]["epochs"]
    peer = info.get("peer")
    lines = ["mpiml-ppo against %s: CartPole-v1, 4000 env steps per epoch summed over ranks, "
             "Spinning Up's defaults (80 policy / 80 value steps at most, MLP (64,64) tanh), "
             "seed 0; both programs in the same run on the same BLAS. Epoch = difference of "
             "consecutive `Time` values in progress.txt; %d epochs, the first dropped, median of "
             "the other %d." % ("Spinning Up's PyTorch PPO (`%s`, commit `%s`, unmodified)"
                                % (peer["repository"], peer["commit"][:12]) if peer else
                                "nothing (the peer was not found)", epochs, epochs - 1), "",
             "Measured %s UTC on %s (%d cores), %s; BLAS `%s`; %s build; load average %s before, "
             "%s after%s. Command: `%s`." % (
                 info["when"], info["cpu"], info["cores"], info["mpi"], info["blas"],
                 info.get("build_type", "RelWithDebInfo"), info["load0"], info["load1"],
                 ": **the machine was shared with other jobs**, so times are upper bounds and "
                 "2 ranks may not get two free cores" if max(float(info["load0"]), float(info["load1"]))
                 >= info["cores"] else "", info.get("command", "scripts/bench.sh ppo")), ""]
    has_base = any("base" in r for r in rows)
    head = "| ranks | mpiml-ppo | Spinning Up | Spinning Up / mpiml-ppo |"
    sep = "|---|---|---|---|"
    if has_base:
        head += " mpiml-ppo before (%s) | speed-up |" % info.get("baseline_label", "baseline")
        sep += "---|---|"
    lines += ["Median epoch:", "", head, sep]
    for r in rows:
        peer_t = r.get("peer", {}).get("epoch", float("nan"))
        ratio = "%.1fx" % (peer_t / r["mpiml"]["epoch"]) if peer_t == peer_t else "n/a"
        line = "| %d | %s | %s | %s |" % (r["ranks"], fmt_s(r["mpiml"]["epoch"]), fmt_s(peer_t), ratio)
        if has_base:
            b = r["base"]["epoch"]
            line += " %s | %.1fx |" % (fmt_s(b), b / r["mpiml"]["epoch"])
        lines.append(line)
    lines += ["", "mpiml-ppo's epoch by phase (rank 0) and the FLOP floor: the update's "
              "matrix-product arithmetic per rank (forward and backward of the policy and value "
              "MLPs, as many policy steps as KL early stopping let run) over the BLAS's "
              "single-core rate for [rows x 64] x [64 x 64] (`bench_sgemm`, same run).", "",
              "| ranks | epoch | rollout | policy update | value update | rest (logging, "
              "advantages) | update GFLOP per rank | sgemm GFLOP/s | update floor | update "
              "at % of floor |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        m = r["mpiml"]
        if "policy" not in m:
            continue
        upd = m["policy"] + m["value"]
        rest = max(0.0, m["epoch"] - m["rollout"] - upd)
        floor = m["gflop"] / r["rate"] if m.get("gflop") and r.get("rate") else float("nan")
        pct = "%.0f %%" % (100 * floor / upd) if floor == floor else "n/a"
        lines.append("| %d | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            r["ranks"], fmt_s(m["epoch"]), fmt_s(m["rollout"]), fmt_s(m["policy"]),
            fmt_s(m["value"]), fmt_s(rest),
            "%.2f" % m["gflop"] if m.get("gflop") else "n/a",
            "%.0f" % r["rate"] if r.get("rate") else "n/a", fmt_s(floor), pct))
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench_build = os.path.join(ROOT, "build-bench")  # scripts/bench.sh's, when it has the programs
    ap.add_argument("--build-dir", default=bench_build if os.access(
        os.path.join(bench_build, "apps", "mpiml-ppo"), os.X_OK) else os.path.join(ROOT, "build"),
        help="where mpiml-ppo and bench_sgemm are (default: build-bench/ when it has them, else build/)")
    ap.add_argument("--peer", default=os.environ.get("SPINUP_PPO_DIR") or DEFAULT_PEER,
                    help="Spinning Up's PPO folder (with run_ppo.py): $SPINUP_PPO_DIR if set, else "
                         "../shared/peers/spinup_ppo beside the repository (now %(default)s)")
    ap.add_argument("--ranks", default="1,2")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--baseline", help="another mpiml-ppo binary to time beside (e.g. an older build)")
    ap.add_argument("--baseline-label", default="baseline")
    ap.add_argument("--no-markdown", action="store_true", help="do not regenerate BENCHMARKS.md")
    ap.add_argument("--output", default=RESULTS, help="results file (default %(default)s)")
    args = ap.parse_args()
    if args.epochs < 2:
        ap.error("--epochs must be at least 2 (the first is dropped)")
    prog = os.path.join(args.build_dir, "apps", "mpiml-ppo")
    tool = os.path.join(args.build_dir, "bench", "bench_sgemm")
    if not os.access(prog, os.X_OK):
        sys.exit("ppo_compare: no %s (build first: scripts/build.sh)" % prog)
    peer = args.peer if os.path.isfile(os.path.join(args.peer, "run_ppo.py")) else None
    if not peer:
        print("ppo_compare: no Spinning Up peer at %s; timing mpiml-ppo alone" % args.peer)
    for k, v in (("OMPI_ALLOW_RUN_AS_ROOT", "1"), ("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")):
        os.environ.setdefault(k, v)

    info = machine()
    info["when"] = datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M")
    info["load0"] = "%.1f" % os.getloadavg()[0]
    info["build_type"] = run.build_type(args.build_dir)
    info["epochs"] = args.epochs
    info["baseline_label"] = args.baseline_label
    info["command"] = " ".join(["scripts/bench.sh ppo"] + sys.argv[1:])
    info["peer"] = {"repository": PEER_REPO, "commit": peer_commit(peer)} if peer else None
    rows = []
    tmp = tempfile.mkdtemp(prefix="ppo_compare_")
    try:
        for n in [int(x) for x in args.ranks.split(",")]:
            row = {"ranks": n}
            row["rate"] = sgemm_rate(tool, 4000 // n) if os.access(tool, os.X_OK) else None
            row["mpiml"] = run_mpiml(prog, n, args.epochs, os.path.join(tmp, "mpiml%d" % n))
            if peer:
                row["peer"] = run_peer(peer, n, args.epochs, os.path.join(tmp, "peer%d" % n))
            if args.baseline:
                row["base"] = run_mpiml(args.baseline, n, args.epochs, os.path.join(tmp, "base%d" % n))
            rows.append(row)
            print("ranks %d: mpiml-ppo %s, Spinning Up %s%s" % (
                n, fmt_s(row["mpiml"]["epoch"]), fmt_s(row.get("peer", {}).get("epoch", float("nan"))),
                ", before %s" % fmt_s(row["base"]["epoch"]) if "base" in row else ""), flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    info["load1"] = "%.1f" % os.getloadavg()[0]
    data = {"meta": info, "rows": rows}
    with open(args.output, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.write("\n")
    print(render(data))
    if not args.no_markdown and os.path.abspath(args.output) == RESULTS:
        import report
        print("ppo_compare: wrote %s" % report.write())


if __name__ == "__main__":
    main()
