#!/usr/bin/python3
"""Before/after: two revisions of mpiml built side by side and timed in one
run, their jobs alternated (old, new, then new, old, ...) so that a change of
the machine's load hits both alike.

  scripts/bench_compare.sh OLD_REV [NEW_REV] [--repeats=5] [--workdir=DIR]
                           [--old-build=DIR] [--new-build=DIR] [--no-markdown]

NEW_REV defaults to HEAD. Each revision is checked out (git worktree, detached)
into WORKDIR/<commit> and built in WORKDIR/<commit>/build with the options of
scripts/build.sh (so ccache serves the objects other builds compiled);
--old-build / --new-build use an existing build directory of that revision
instead. Workloads, 2 ranks:

  C++     bench_torch_grads --hidden 64,64 (each revision's own program):
          GradAverager packed and with bucket views, mpi_avg_grads;
          one raw MPI_Allreduce of the same bytes (a control: the same MPI)
  Python  bench/peers/mpiml_peer.py --parts=averager --models=ac64:
          GradAverager and mpi_avg_grads from Python; the seed's (a control)
  c10d    bench/bench_c10d.py --parts=sweep: dist.all_reduce of 4 B and 32 MiB
          through the backend "mpiml"
  4 B     bench_collectives: mpiml::allreduce of 4 B; MPI_Allreduce (a control)
  64 MiB  bench_collectives: mpiml::allreduce of 64 MiB float32; MPI_Allreduce
          (a control)

The Python scripts are this tree's, run on each revision's package. Results:
bench/results/compare.json (each repeat's median for both sides), which
scripts/bench.sh renders into BENCHMARKS.md, and a table on stdout: each job's
best round (minimum over its rounds; for bench_torch_grads the 10th percentile
of single calls: under load the low end is the stable one), the median over
the pairs, and the median over the pairs of the paired ratio new / old, with
its range (and the same ratio from the medians). The controls run code that
is the same in both revisions, so their ratios show the noise of this run.
"""
import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import time

import run  # bench/run.py: launcher, machine and software description, formatting

ROOT = run.ROOT
RESULTS = os.path.join(ROOT, "bench", "results", "compare.json")
PYTHON = run.PYTHON
TARGETS = ["bench_torch_grads", "bench_collectives", "_core", "_torch", "_c10d"]

# (workload, impl as the job reports it, label, control?)
CPP_ROWS = [("GradAverager (plan held)", "C++ `GradAverager`, (64,64)", False),
            ("GradAverager, bucket views", "C++ `GradAverager`, bucket views, (64,64)", False),
            ("mpiml::mpi_avg_grads", "C++ `mpi_avg_grads`, (64,64)", False),
            ("one raw MPI_Allreduce", "C++ one raw `MPI_Allreduce` of the same bytes (control)", True)]
PY_ROWS = [("GradAverager", "Python `GradAverager`, (64,64)", False),
           ("GradAverager_views", "Python `GradAverager`, bucket views, (64,64)", False),
           ("mpi_avg_grads", "Python `mpi_avg_grads`, (64,64)", False),
           ("seed", "Python, the seed's `mpi_avg_grads` (control)", True)]
C10D_ROWS = [(4, "`dist.all_reduce` of 4 B, backend \"mpiml\"", False),
             (32 << 20, "`dist.all_reduce` of 32 MiB, backend \"mpiml\"", False)]
SMALL_ROWS = [("mpiml", "`mpiml::allreduce` of 4 B", False),
              ("MPI_Allreduce", "`MPI_Allreduce` of 4 B (control)", True)]
COLL_ROWS = [("mpiml", "`mpiml::allreduce` of 64 MiB", False),
             ("MPI_Allreduce", "`MPI_Allreduce` of 64 MiB (control)", True)]


def log(*a):
    print("[compare]", *a, file=sys.stderr, flush=True)


def git(*args, cwd=ROOT):
    r = subprocess.run(["git", "-C", cwd] + list(args), capture_output=True, text=True)
    if r.returncode:
        sys.exit("git %s: %s" % (" ".join(args), r.stderr.strip()))
    return r.stdout.strip()


def checkout(rev, workdir):
    commit = git("rev-parse", "--verify", rev + "^{commit}")
    src = os.path.join(workdir, commit[:12])
    if not os.path.isdir(src):
        log("checking out", rev, "into", src)
        git("worktree", "add", "--detach", src, commit)
    elif git("rev-parse", "HEAD", cwd=src) != commit:
        git("checkout", "--detach", commit, cwd=src)
    return commit, src


def build(src, build_dir, nice):
    t0 = time.time()
    run.build_targets(build_dir, TARGETS, nice=nice, src=src)
    log("built in %.0f s" % (time.time() - t0))


def jobs(build_dir, tmp):
    """(name, argv, env names, parse(records, json file) -> {key: us})."""
    peers = os.path.join(ROOT, "bench", "peers")
    grads_json = os.path.join(tmp, "torch_grads.json")

    # each parser: {key: (median, low)}, low = the minimum over rounds (the
    # 10th percentile of single calls for bench_torch_grads)
    def cpp(_recs):
        with open(grads_json) as f:
            rows = json.load(f)["results"]
        return {r["method"]: (r["median_us"], r["p10_us"]) for r in rows
                if r["hidden"] == "(64,64)" and r["operation"] == "average gradients"}

    def by_impl(recs):
        return {r["impl"]: (r["median_us"], r["min_us"]) for r in recs}

    def c10d(recs):
        return {r["bytes"]: (r["median_us"], r["min_us"]) for r in recs
                if r.get("bench") == "all_reduce"}

    def allreduce_of(size):
        return lambda recs: {r["impl"]: (r["median_us"], r["min_us"]) for r in recs
                             if r.get("bench") == "allreduce" and r.get("bytes") == size}

    def sweep(size, round_ms):
        return [os.path.join(build_dir, "bench", "bench_collectives"), "--parts=sweep",
                "--min-bytes=%d" % size, "--max-bytes=%d" % size, "--rounds=7",
                "--round-ms=%d" % round_ms]

    return [
        ("cpp", [os.path.join(build_dir, "bench", "bench_torch_grads"), "--hidden", "64,64",
                 "--samples", "2000", "--json", grads_json], (), cpp),
        ("python", [PYTHON, os.path.join(peers, "mpiml_peer.py"), "--parts=averager",
                    "--side-by-side", "--models=ac64", "--rounds=7"], ("PYTHONPATH",), by_impl),
        ("c10d", [PYTHON, os.path.join(ROOT, "bench", "bench_c10d.py"), "--parts=sweep",
                  "--sizes=4,%d" % (32 << 20), "--gloo=0", "--rounds=7", "--round-ms=100"],
         ("PYTHONPATH", "MASTER_ADDR", "MASTER_PORT"), c10d),
        ("small", sweep(4, 50), (), allreduce_of(4)),
        ("coll", sweep(64 << 20, 200), (), allreduce_of(64 << 20)),
    ]


ROWS = {"cpp": CPP_ROWS, "python": PY_ROWS, "c10d": C10D_ROWS, "small": SMALL_ROWS,
        "coll": COLL_ROWS}


def pair(by_rep):
    """by_rep[job][key][repeat][side] = (median, low) -> samples[job][key] =
    {"old": [...], "new": [...], "old_low": [...], "new_low": [...]} over the
    repeats where both sides gave a figure."""
    samples = {}
    for name, keys in by_rep.items():
        for k, reps in keys.items():
            pairs = [reps[r] for r in sorted(reps) if len(reps[r]) == 2]
            samples.setdefault(name, {})[k] = {
                "old": [p["old"][0] for p in pairs], "new": [p["new"][0] for p in pairs],
                "old_low": [p["old"][1] for p in pairs], "new_low": [p["new"][1] for p in pairs]}
    return samples


def outside_signal(log_path):
    """', mpirun received signal N from outside the job' when its log says so."""
    try:
        with open(log_path) as f:
            m = re.search(r"mpirun: Forwarding signal (\d+) to job", f.read())
    except OSError:
        m = None
    return ", mpirun received signal %s from outside the job" % m.group(1) if m else ""


def summarize(samples):
    """samples[job][key] = {"old": [...], "new": [...]} -> table rows."""
    out = []
    for job, rows in ROWS.items():
        for key, label, control in rows:
            s = samples.get(job, {}).get(str(key))
            if not s or not s["old"]:
                out.append({"label": label, "control": control, "missing": True})
                continue
            ratios = [n / o for o, n in zip(s["old_low"], s["new_low"]) if o]
            med_ratios = [n / o for o, n in zip(s["old"], s["new"]) if o]
            out.append({"label": label, "control": control, "job": job, "key": str(key),
                        "old_us": [round(x, 3) for x in s["old"]],
                        "new_us": [round(x, 3) for x in s["new"]],
                        "old_low_us": [round(x, 3) for x in s["old_low"]],
                        "new_low_us": [round(x, 3) for x in s["new_low"]],
                        "ratio": statistics.median(ratios), "ratio_min": min(ratios),
                        "ratio_max": max(ratios), "median_ratio": statistics.median(med_ratios)})
    return out


def table(data):
    """Markdown table of a compare.json."""
    m = data["meta"]
    rows = []
    for r in data["rows"]:
        if r.get("missing"):
            rows.append([r["label"], "n/a", "n/a", "n/a", ""])
            continue
        rows.append([r["label"], run.fmt_us(statistics.median(r["old_low_us"])),
                     run.fmt_us(statistics.median(r["new_low_us"])), "**%.2f**" % r["ratio"],
                     "%.2f-%.2f" % (r["ratio_min"], r["ratio_max"]), "%.2f" % r["median_ratio"]])
    return run.table(["Workload (2 ranks)", "before `%s`" % m["old"]["short"],
                      "after `%s`" % m["new"]["short"], "after / before",
                      "range over %d pairs" % m["repeats"], "after / before, medians"], rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("old", help="the revision before (a commit, branch or tag)")
    ap.add_argument("new", nargs="?", default="HEAD", help="the revision after (default HEAD)")
    ap.add_argument("--repeats", type=int, default=5, help="pairs of runs of every job")
    ap.add_argument("--workdir", default=os.path.join(ROOT, "build-compare"),
                    help="where the revisions are checked out and built (default %(default)s)")
    ap.add_argument("--old-build", help="an existing build directory of OLD (skips its build)")
    ap.add_argument("--new-build", help="an existing build directory of NEW (skips its build)")
    ap.add_argument("--nice", type=int, default=5, help="niceness of the builds")
    ap.add_argument("--output", default=RESULTS,
                    help="results file; BENCHMARKS.md is rewritten only for the default")
    ap.add_argument("--no-markdown", action="store_true", help="do not rewrite BENCHMARKS.md")
    a = ap.parse_args()
    t_start = time.time()
    workdir = os.path.abspath(a.workdir)
    os.makedirs(workdir, exist_ok=True)
    sides = {}
    for side, rev, given in (("old", a.old, a.old_build), ("new", a.new, a.new_build)):
        commit = git("rev-parse", "--verify", rev + "^{commit}")
        if given:
            build_dir = os.path.abspath(given)
        else:
            commit, src = checkout(rev, workdir)
            build_dir = os.path.join(src, "build")
            build(src, build_dir, a.nice)
        sides[side] = {"rev": rev, "commit": commit, "short": commit[:7],
                       "subject": git("log", "-1", "--format=%s", commit), "build": build_dir}
    build_seconds = time.time() - t_start

    tmp = os.path.join(workdir, "runs")
    os.makedirs(tmp, exist_ok=True)
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               MASTER_ADDR="127.0.0.1")
    by_rep, failures, loads = {}, {}, []  # by_rep[job][key][repeat][side] = (median, low)
    t0 = time.time()
    for rep in range(a.repeats):
        order = ("old", "new") if rep % 2 == 0 else ("new", "old")
        for job_i in range(len(jobs("", tmp))):
            for side in order:
                s = sides[side]
                name, argv, env_names, parse = jobs(s["build"], tmp)[job_i]
                env["PYTHONPATH"] = os.path.join(s["build"], "python")
                env["MASTER_PORT"] = str(run.free_port())
                loads.append(os.getloadavg()[0])
                if os.path.exists(os.path.join(tmp, "torch_grads.json")):
                    os.remove(os.path.join(tmp, "torch_grads.json"))  # no stale results
                recs, err, _ = run.run_job("%s_%s_%d" % (name, side, rep),
                                           run.launcher(2, env_names) + argv, env, tmp)
                if err:
                    failures["%s_%s_%d" % (name, side, rep)] = err + outside_signal(
                        os.path.join(tmp, "%s_%s_%d.log" % (name, side, rep)))
                    continue
                try:
                    got = parse(recs)
                except (OSError, KeyError, ValueError) as e:
                    failures["%s_%s_%d" % (name, side, rep)] = "no results: %s" % e
                    continue
                for k, v in got.items():
                    by_rep.setdefault(name, {}).setdefault(str(k), {}).setdefault(rep, {})[side] = v
    samples = pair(by_rep)
    soft = run.software_info()
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": run.machine_info(), "mpi": "%s %s" % (soft["mpi"], soft["mpi_version"]),
            "old": {k: v for k, v in sides["old"].items() if k != "build"},
            "new": {k: v for k, v in sides["new"].items() if k != "build"},
            "repeats": a.repeats, "ranks": 2,
            "command": "scripts/bench_compare.sh %s %s" % (a.old, a.new),
            "loadavg": [round(min(loads), 2), round(statistics.median(loads), 2),
                        round(max(loads), 2)] if loads else None,
            "run_seconds": round(time.time() - t0), "build_seconds": round(build_seconds),
            "failures": failures,
            "mpiml_env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("MPIML_")}}
    data = {"meta": meta, "rows": summarize(samples)}
    with open(a.output, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.write("\n")
    print(table(data))
    log("wrote", a.output, "; builds %.0f s, runs %.0f s" % (build_seconds, meta["run_seconds"]))
    if failures:
        log("failed jobs:", failures)
    if not a.no_markdown and os.path.abspath(a.output) == RESULTS:
        import report
        report.write()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
