#!/usr/bin/python3
"""Runs mpiml's benchmark suite, writes bench/results/latest.json and
regenerates BENCHMARKS.md (bench/report.py: bench/BENCHMARKS.md.in filled from
the results in bench/results/).

  scripts/bench.sh [--quick] [--ranks=2,3,4] [--no-build] [--build-dir=DIR]
                   [--output=FILE] [--no-markdown] [--compare=GIT_REF] [--nice=N]
  scripts/bench.sh --python     # the Python package alone: seed vs mpiml's Python vs C++
  scripts/bench.sh render       # only regenerate BENCHMARKS.md from the stored results

--quick is a smoke test (few sizes, 3 rounds); its results are not written
unless --output is given. --compare prints the headline ratios of the
results file at GIT_REF next to this run's. --nice=N runs the jobs at that
niceness (negative needs root), recorded in the results.
"""
import argparse
import datetime
import glob
import json
import math
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHON = os.environ.get("MPIML_BENCH_PYTHON", "/usr/bin/python3")
RESULTS = os.path.join(ROOT, "bench", "results", "latest.json")
PY_RESULTS = os.path.join(ROOT, "bench", "results", "python.json")
C10D_RESULTS = os.path.join(ROOT, "bench", "results", "c10d.json")
JOB_TIMEOUT = 1200  # seconds per mpirun job


def log(*a):
    print("[bench]", *a, file=sys.stderr, flush=True)


def sh(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


# ------------------------------------------------------------------ build

# Configured as scripts/build.sh does, so that ccache serves the objects of
# other builds (MPIML_BENCH_BUILD_TYPE overrides the build type).
CONFIGURE = ["-DCMAKE_BUILD_TYPE=" + os.environ.get("MPIML_BENCH_BUILD_TYPE", "RelWithDebInfo"),
             "-DMPIML_WITH_TORCH=ON", "-DMPIML_BUILD_TESTS=ON", "-DMPIML_BUILD_APPS=ON",
             "-DMPIML_BUILD_BENCH=ON"]


def has_target(build_dir, target):
    """Whether the configured build_dir has this target (CMake made its folder)."""
    return bool(glob.glob(os.path.join(build_dir, "**", "CMakeFiles", target + ".dir"),
                          recursive=True))


def build_targets(build_dir, wanted, nice=5, src=ROOT):
    """Configures build_dir once, then builds those of the wanted targets it has."""
    if not os.path.exists(os.path.join(build_dir, "CMakeCache.txt")):
        log("configuring", build_dir)
        r = sh(["cmake", "-S", src, "-B", build_dir] + CONFIGURE)
        if r.returncode:
            sys.exit("cmake configure failed:\n" + r.stdout[-3000:] + r.stderr[-3000:])
    targets = [t for t in wanted if has_target(build_dir, t)]
    log("building", build_dir, ":", " ".join(targets))
    r = sh(["nice", "-n", str(nice), "cmake", "--build", build_dir, "-j", str(os.cpu_count() or 2),
            "--target"] + targets)
    if r.returncode:
        sys.exit("build failed:\n" + r.stdout[-5000:] + r.stderr[-5000:])
    return targets


def build(build_dir):
    # mpiml-ppo and bench_sgemm: the PPO comparison that scripts/bench.sh chains
    targets = build_targets(build_dir, ["bench_collectives", "bench_grads", "_core", "_torch", "_c10d",
                                        "mpiml-ppo", "bench_sgemm"])
    if "bench_grads" not in targets:
        log("mpiml::torch is not built here: bench_grads is skipped")


# ------------------------------------------------------------------ launch

def mpi_flavour():
    exe = os.environ.get("MPIEXEC", shutil.which("mpirun") or shutil.which("mpiexec") or "mpirun")
    r = sh([exe, "--version"])
    text = (r.stdout + r.stderr).strip()
    return exe, ("Open MPI" if "Open MPI" in text or "OpenRTE" in text else
                 "MPICH" if "HYDRA" in text or "MPICH" in text else "unknown"), text


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launcher(np_, env_names=()):
    exe, flavour, _ = mpi_flavour()
    cmd = [exe, "-np", str(np_)]
    if flavour == "Open MPI":
        if np_ > (os.cpu_count() or 1):
            cmd.append("--oversubscribe")
        if os.geteuid() == 0:
            cmd.append("--allow-run-as-root")
        for n in env_names:
            cmd += ["-x", n]
    return cmd


def run_job(name, cmd, env, logdir, nice=0):
    """Runs one mpirun job; returns (records, error or None, seconds)."""
    log("running", name, ":", " ".join(cmd))
    t0 = time.time()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=env, start_new_session=True,
                         preexec_fn=(lambda: os.nice(nice)) if nice else None)
    try:
        out, err = p.communicate(timeout=JOB_TIMEOUT)
        error = None if p.returncode == 0 else "exit code %d" % p.returncode
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGTERM)
        out, err = p.communicate()
        error = "timed out after %d s" % JOB_TIMEOUT
    secs = time.time() - t0
    with open(os.path.join(logdir, name + ".log"), "w") as f:
        f.write("$ " + " ".join(cmd) + "\n" + out + "\n--- stderr\n" + err)
    records = []
    for line in out.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    if error:
        log(name, "FAILED:", error, "(log:", os.path.join(logdir, name + ".log") + ")")
    return records, error, secs


def have_module(prefix):
    """Whether the build's Python package has this extension (_core, _c10d, ...)."""
    d = os.path.join(BUILD_DIR, "python", "mpiml")
    return os.path.isdir(d) and any(f.startswith(prefix) for f in os.listdir(d))


def plan_python(quick, have_grads):
    """--python: the seed's module, mpiml's Python package and the same
    mpiml C++ calls, side by side in one process at 2 ranks (mpiml_peer.py
    --side-by-side: interleaved round by round, so load hits them alike)."""
    peers = os.path.join(ROOT, "bench", "peers")
    common = ["--rounds=" + ("3" if quick else "7")]
    return [("python_side_by_side_np2", 2,
             [PYTHON, os.path.join(peers, "mpiml_peer.py"), "--side-by-side",
              "--models=ac64,ac256", "--stats-sizes=1000"] + common, ("PYTHONPATH",))]


def plan(ranks, quick, have_grads):
    """The jobs: (name, ranks, argv, env names). 2 ranks: everything;
    more: a reduced set (they are oversubscribed on small machines)."""
    cores = os.cpu_count() or 1
    jobs = []
    coll = os.path.join(BUILD_DIR, "bench", "bench_collectives")
    grads = os.path.join(BUILD_DIR, "bench", "bench_grads")
    peers = os.path.join(ROOT, "bench", "peers")
    py = have_module("_core")
    for n in ranks:
        over = n > cores
        rounds = "3" if quick else ("5" if over else "7")
        common = ["--rounds=" + rounds]
        sweep = ["--max-bytes=" + ("65536" if quick else "67108864"),
                 "--step=" + ("4" if quick or over else "2")]
        models = "ac64,ac256" if quick else "ac64,ac256,resnet50"
        jobs.append(("collectives_np%d" % n, n, [coll] + sweep + common, ()))
        if have_grads:
            jobs.append(("grads_np%d" % n, n, [grads, "--models=" + models] + common, ()))
        jobs.append(("seed_np%d" % n, n, [PYTHON, os.path.join(peers, "seed_peer.py"),
                                          "--models=" + models] + common, ()))
        if py:
            jobs.append(("mpiml_python_np%d" % n, n, [PYTHON, os.path.join(peers, "mpiml_peer.py"),
                                                      "--models=" + models] + common,
                         ("PYTHONPATH",)))
        jobs.append(("gloo_np%d" % n, n, [PYTHON, os.path.join(peers, "gloo_peer.py"),
                                          "--models=" + models] + common,
                     ("MASTER_ADDR", "MASTER_PORT")))
        if have_module("_c10d") and not over:  # dist.all_reduce: backend "mpiml" against Gloo
            jobs.append(("c10d_np%d" % n, n, [PYTHON, os.path.join(ROOT, "bench", "bench_c10d.py"),
                                              "--parts=sweep", "--max-bytes=" + sweep[0].split("=")[1]]
                         + common, ("PYTHONPATH", "MASTER_ADDR", "MASTER_PORT")))
    return jobs


# ------------------------------------------------------------------ metadata

def build_type(build_dir):
    try:
        with open(os.path.join(build_dir, "CMakeCache.txt")) as f:
            return re.search(r"^CMAKE_BUILD_TYPE:\w+=(.*)$", f.read(), re.M).group(1)
    except (OSError, AttributeError):
        return "?"


def machine_info():
    info = {"cores": os.cpu_count(), "kernel": platform.release(), "arch": platform.machine()}
    r = sh(["lscpu"])
    for line in r.stdout.splitlines():
        k, _, v = line.partition(":")
        if k.strip() == "Model name":
            info["cpu"] = v.strip()
        if k.strip() == "Thread(s) per core":
            info["threads_per_core"] = int(v.strip())
    try:
        with open("/proc/meminfo") as f:
            kb = int(re.search(r"MemTotal:\s+(\d+)", f.read()).group(1))
        info["memory_gib"] = round(kb / 2**20, 1)
    except (OSError, AttributeError):
        pass
    return info


def software_info():
    exe, flavour, text = mpi_flavour()
    m = re.search(r"(\d+\.\d+(\.\d+)?)", text)
    info = {"mpi": flavour, "mpi_version": m.group(1) if m else text.splitlines()[0],
            "mpirun": exe}
    r = sh([PYTHON, "-c", "import sys, mpi4py, numpy, torch; print(sys.version.split()[0], "
            "mpi4py.__version__, numpy.__version__, torch.__version__)"])
    if r.returncode == 0:
        v = r.stdout.split()
        info.update(python=v[0], mpi4py=v[1], numpy=v[2], torch_python=v[3])
    r = sh(["c++", "--version"])
    if r.returncode == 0:
        info["compiler"] = r.stdout.splitlines()[0]
    r = sh(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"])
    if r.returncode == 0:
        dirty = sh(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"]).stdout
        info["commit"] = r.stdout.strip() + ("+dirty" if dirty.strip() else "")
    return info


# ------------------------------------------------------------------ analysis

def find(results, ranks, suite, bench, impl, **kw):
    for r in results:
        if (r.get("ranks") == ranks and r.get("suite") == suite and r.get("bench") == bench
                and r.get("impl") == impl and all(r.get(k) == v for k, v in kw.items())):
            return r
    return None


def t_us(results, ranks, suite, bench, impl, **kw):
    r = find(results, ranks, suite, bench, impl, **kw)
    return r["median_us"] if r else None


def ratio(a, b):
    return a / b if a is not None and b else None


def headline(results):
    """Targets at 2 ranks: list of dicts (name, value, target, met, detail)."""
    out = []

    def grads(model):
        return {k: t_us(results, 2, "grads", "avg_grads", k, model=model)
                for k in ("mpiml", "seed_python", "mpi_allreduce_flat", "mpi_allreduce_per_param",
                          "gloo_bucketed", "gloo_per_param")}

    for model, label, want in (("ac64", "hidden (64,64)", 20.0), ("ac256", "hidden (256,256)", 5.0)):
        g = grads(model)
        r = ratio(g["seed_python"], g["mpiml"])
        floor = ratio(g["seed_python"], g["mpi_allreduce_flat"])
        out.append({"key": "avg_grads_vs_seed_" + model,
                    "name": "mpi_avg_grads vs the seed's Python, %s" % label,
                    "kind": "speedup", "value": r, "target": want,
                    "met": None if r is None else r >= want,
                    "detail": "seed %s, mpiml %s; one raw allreduce of the same bytes %s "
                              "(seed / that raw allreduce, the ceiling for any implementation: %s)"
                              % (fmt_us(g["seed_python"]), fmt_us(g["mpiml"]),
                                 fmt_us(g["mpi_allreduce_flat"]), fmt_x(floor))})
    for model, label in (("ac64", "hidden (64,64)"), ("ac256", "hidden (256,256)"),
                         ("resnet50", "ResNet-50 set")):
        g = grads(model)
        r = ratio(g["mpiml"], g["mpi_allreduce_flat"])
        mem = memcpy_gbps(results, find(results, 2, "grads", "avg_grads", "mpiml", model=model))
        extra = None if r is None else g["mpiml"] - g["mpi_allreduce_flat"]
        rec = find(results, 2, "grads", "avg_grads", "mpiml", model=model)
        copy_us = (2 * rec["bytes"] / (mem * 1e9) * 1e6) if rec and mem else None
        out.append({"key": "avg_grads_vs_flat_" + model,
                    "name": "mpi_avg_grads within 1.2x of one raw MPI_Allreduce of the same "
                            "bytes, %s" % label,
                    "kind": "slowdown", "value": r, "target": 1.2,
                    "met": None if r is None else r <= 1.2,
                    "detail": "mpiml %s, one flat MPI_Allreduce %s: %s more, against %s for "
                              "copying the gradients into and out of a bucket at the measured "
                              "memcpy bandwidth"
                              % (fmt_us(g["mpiml"]), fmt_us(g["mpi_allreduce_flat"]),
                                 fmt_us(extra), fmt_us(copy_us))})
    s = {k: t_us(results, 2, "statistics", "mpi_statistics_scalar", k, samples_per_rank=1000)
         for k in ("mpiml", "seed_python", "seed_algorithm_cpp_raw_mpi")}
    r = ratio(s["seed_python"], s["mpiml"])
    out.append({"key": "statistics_vs_seed_1e3",
                "name": "mpi_statistics_scalar vs the seed's Python, 1e3 samples per rank",
                "kind": "speedup", "value": r, "target": 10.0,
                "met": None if r is None else r >= 10.0,
                "detail": "seed %s, mpiml %s; the seed's algorithm in C++ on raw MPI %s"
                          % (fmt_us(s["seed_python"]), fmt_us(s["mpiml"]),
                             fmt_us(s["seed_algorithm_cpp_raw_mpi"]))})
    return out


def get_repeats(results, kind, key, impl):
    if kind == "avg_grads":
        r = find(results, 2, "grads", "avg_grads", impl, model=key)
    elif kind == "statistics":
        r = find(results, 2, "statistics", "mpi_statistics_scalar", impl, samples_per_rank=key)
    else:
        r = find(results, 2, "mpi_avg", "mpi_avg", impl, elements=key)
    return r.get("repeat_medians_us") if r else None


def python_headline(results):
    """The Python package's targets at 2 ranks."""
    out = []
    rows = [("avg_grads", "ac64", "`mpi_avg_grads`, actor-critic (64,64)", 10.0),
            ("avg_grads", "ac256", "`mpi_avg_grads`, actor-critic (256,256)", 3.0),
            ("statistics", 1000, "`mpi_statistics_scalar`, 1e3 samples per rank", 5.0),
            ("mpi_avg", 1, "`mpi_avg` of a scalar", None),
            ("mpi_avg", 1000, "`mpi_avg` of 1000 float32", None)]
    for kind, key, label, want in rows:
        if kind == "avg_grads":
            get = lambda impl: t_us(results, 2, "grads", "avg_grads", impl, model=key)  # noqa: E731
        elif kind == "statistics":
            get = lambda impl: t_us(results, 2, "statistics", "mpi_statistics_scalar", impl,  # noqa: E731
                                    samples_per_rank=key)
        else:
            get = lambda impl: t_us(results, 2, "mpi_avg", "mpi_avg", impl, elements=key)  # noqa: E731
        seed, py, cpp = get("sbs_seed_python"), get("sbs_mpiml_python"), get("sbs_mpiml_cpp")
        vs_seed, vs_cpp = ratio(seed, py), ratio(py, cpp)
        reps = {impl: get_repeats(results, kind, key, impl)
                for impl in ("sbs_seed_python", "sbs_mpiml_python", "sbs_mpiml_cpp")}
        if all(reps.values()) and len({len(v) for v in reps.values()}) == 1:
            # ratios within each repeat (same process, same minutes), then their median
            s_, p_, c_ = reps["sbs_seed_python"], reps["sbs_mpiml_python"], reps["sbs_mpiml_cpp"]
            vs_seed = statistics.median(a / b for a, b in zip(s_, p_))
            vs_cpp = statistics.median(a / b for a, b in zip(p_, c_))
            seed, py, cpp = statistics.median(s_), statistics.median(p_), statistics.median(c_)
        out.append({"key": "python_%s_%s" % (kind, key), "name": label, "seed": seed, "python": py,
                    "cpp": cpp, "vs_seed": vs_seed, "vs_cpp": vs_cpp, "target": want,
                    "met_seed": None if vs_seed is None or want is None else vs_seed >= want,
                    "met_cpp": None if vs_cpp is None else vs_cpp <= 1.5})
    return out


def load_words(loadavg, cores):
    """How busy the machine was, from the load averages before and after a run."""
    if not cores or max(loadavg) < cores:
        return " (no more runnable tasks than cores)"
    return ": **the machine was shared with other jobs**"


def render_python(data):
    meta = data["meta"]
    s, m = meta["software"], meta["machine"]
    L = []
    L.append("Generated by `scripts/bench.sh --python` on %s from commit `%s`, 2 ranks on %s "
             "(%s cores), %s %s, Python %s, PyTorch %s, mpi4py %s; load average %.2f / %.2f "
             "before / after%s, so absolute figures move with the load. The three implementations run in ONE "
             "process per rank (`bench/peers/mpiml_peer.py --side-by-side`), interleaved round "
             "by round, so the load hits them alike. The job ran %d times: times are the median of "
             "the runs' medians, ratios the median of the per-run ratios (every run's median is "
             "in `bench/results/python.json`)." % (
                 meta["date"], s.get("commit", "?"), m.get("cpu", "?"), m.get("cores"), s["mpi"],
                 s["mpi_version"], s.get("python", "?"), s.get("torch_python", "?"),
                 s.get("mpi4py", "?"), meta["loadavg"][0], meta["loadavg"][1],
                 load_words(meta["loadavg"], m.get("cores")),
                 meta.get("repeats", 1)))
    L.append("")
    rows = []

    def status(ok):
        return "n/a" if ok is None else "**met**" if ok else "**MISSED**"
    for h in data["headline"]:
        rows.append([h["name"], fmt_us(h["seed"]), fmt_us(h["python"]), fmt_us(h["cpp"]),
                     fmt_x(h["vs_seed"]) + ("" if h["target"] is None else
                                            " (≥ %gx: %s)" % (h["target"], status(h["met_seed"]))),
                     fmt_x(h["vs_cpp"]) + " (≤ 1.5x: %s)" % status(h["met_cpp"])])
    L.append(table(["Workload (2 ranks)", "seed's Python (mpi4py)", "mpiml Python", "mpiml C++ (same call, C++ loop)",
                    "seed / mpiml Python", "mpiml Python / C++"], rows))
    L += ["", "Median over rounds of the slowest rank's time per operation. The C++ column "
          "calls the same mpiml C++ functions on the same data from a C++ loop "
          "(`mpiml::mpi_avg_grads` on the module's parameter tensors, "
          "`mpiml::mpi_statistics_scalar`, `mpiml::mpi_avg`); the difference to it is the "
          "Python call, argument conversion and, for `mpi_avg_grads`, collecting the "
          "module's parameters."]
    return "\n".join(L)


def memcpy_gbps(results, rec):
    """memcpy bandwidth measured at the sweep size nearest to rec's bytes."""
    if not rec:
        return None
    best = None
    for r in results:
        if r.get("ranks") == 2 and r.get("bench") == "memcpy":
            d = abs(math.log(r["bytes"]) - math.log(rec["bytes"]))
            if best is None or d < best[0]:
                best = (d, r["algbw_GBps"])
    return best[1] if best else None


# ------------------------------------------------------------------ markdown

def fmt_us(v):
    if v is None:
        return "n/a"
    if v >= 1e5:
        return "%.0f ms" % (v / 1e3)
    if v >= 1e4:
        return "%.1f ms" % (v / 1e3)
    if v >= 100:
        return "%.0f µs" % v
    if v >= 10:
        return "%.1f µs" % v
    return "%.2f µs" % v


def fmt_x(v):
    if v is None:
        return "n/a"
    return ("%.0fx" % v) if v >= 100 else ("%.1fx" % v) if v >= 10 else ("%.2fx" % v)


def fmt_bytes(b):
    for unit, size in (("MiB", 2**20), ("KiB", 2**10)):
        if b >= size:
            v = b / size
            return ("%d %s" % (v, unit)) if v == int(v) else ("%.1f %s" % (v, unit))
    return "%d B" % b


def fmt_gbps(v):
    return "n/a" if v is None else ("%.2f" % v if v < 10 else "%.1f" % v)


def table(header, rows, align=None):
    align = align or ["l"] + ["r"] * (len(header) - 1)
    sep = ["---:" if a == "r" else "---" for a in align]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(sep) + " |"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


GRAD_IMPLS = [
    ("mpiml", "**mpiml** (`mpi_avg_grads` / `sync_params`)"),
    ("mpi_allreduce_per_param", "C++, one `MPI_Allreduce` per parameter (+ divide)"),
    ("mpi_bcast_per_param", "C++, one `MPI_Bcast` per parameter"),
    ("mpi_allreduce_flat", "C++, one `MPI_Allreduce` of a flat buffer of the same bytes"),
    ("mpi_bcast_flat", "C++, one `MPI_Bcast` of a flat buffer of the same bytes"),
    ("mpiml_python", "mpiml's Python package (`mpiml.mpi_pytorch`)"),
    ("seed_python", "seed's Python (`mpi_pytorch`, mpi4py)"),
    ("gloo_per_param", "torch.distributed Gloo, one call per parameter"),
    ("gloo_bucketed", "torch.distributed Gloo, flattened 25 MiB buckets"),
]
MODELS = [("ac64", "actor-critic (64,64)"), ("ac256", "actor-critic (256,256)"),
          ("resnet50", "ResNet-50 set")]
STATS_IMPLS = [
    ("mpiml", "**mpiml** `mpi_statistics_scalar`, float input"),
    ("mpiml_double_input", "mpiml, double input"),
    ("seed_algorithm_cpp_raw_mpi", "seed's algorithm in C++ on raw MPI (2 allreduces)"),
    ("mpiml_python", "mpiml's Python package (`mpiml.mpi_tools`)"),
    ("seed_python", "seed's Python (2 allreduces)"),
    ("seed_python_min_max", "seed's Python, `with_min_and_max=True` (4 allreduces)"),
]


def grads_table(results, n, bench):
    models = [(m, l) for m, l in MODELS if find(results, n, "grads", bench, "seed_python", model=m)
              or find(results, n, "grads", bench, "mpiml", model=m)]
    if not models:
        return "_No results._"
    header = ["Implementation"]
    for m, label in models:
        rec = (find(results, n, "grads", bench, "mpiml", model=m)
               or find(results, n, "grads", bench, "seed_python", model=m))
        header.append("%s<br>%d tensors, %s" % (label, rec["tensors"], fmt_bytes(rec["bytes"])))
    rows = []
    for impl, label in GRAD_IMPLS:
        cells, any_ = [label], False
        for m, _ in models:
            t = t_us(results, n, "grads", bench, impl, model=m)
            base = t_us(results, n, "grads", bench, "mpiml", model=m)
            if t is None:
                cells.append("")
                continue
            any_ = True
            cells.append(fmt_us(t) if impl == "mpiml" else
                         "%s (%s)" % (fmt_us(t), fmt_x(ratio(t, base))))
        if any_:
            rows.append(cells)
    return table(header, rows)


def stats_table(results, n):
    sizes = sorted({r["samples_per_rank"] for r in results
                    if r.get("ranks") == n and r.get("suite") == "statistics"})
    if not sizes:
        return "_No results._"
    header = ["Implementation"] + ["%s samples per rank" % ("1e%d" % round(math.log10(s))
                                                            if s >= 1000 else s) for s in sizes]
    rows = []
    for impl, label in STATS_IMPLS:
        cells = [label]
        for s in sizes:
            t = t_us(results, n, "statistics", "mpi_statistics_scalar", impl, samples_per_rank=s)
            base = t_us(results, n, "statistics", "mpi_statistics_scalar", "mpiml",
                        samples_per_rank=s)
            cells.append("" if t is None else fmt_us(t) if impl == "mpiml" else
                         "%s (%s)" % (fmt_us(t), fmt_x(ratio(t, base))))
        rows.append(cells)
    return table(header, rows)


def sweep_table(results, n, bench, peer):
    sizes = sorted({r["bytes"] for r in results if r.get("ranks") == n and r.get("bench") == bench})
    if not sizes:
        return "_No results._", None
    rows, ratios = [], []
    for b in sizes:
        a = find(results, n, "collectives", bench, "mpiml", bytes=b)
        p = find(results, n, "collectives", bench, peer, bytes=b)
        m = find(results, n, "collectives", "memcpy", "memcpy", bytes=b)
        r = ratio(p and p["median_us"], a and a["median_us"])
        if r:
            ratios.append(r)
        rows.append([fmt_bytes(b), fmt_us(a and a["median_us"]), fmt_us(p and p["median_us"]),
                     fmt_x(r), fmt_gbps(a and a["busbw_GBps"]), fmt_gbps(p and p["busbw_GBps"]),
                     fmt_gbps(m and m["algbw_GBps"])])
    header = ["Size", "mpiml", peer, "%s / mpiml" % peer, "mpiml busbw GB/s",
              "%s busbw GB/s" % peer, "memcpy GB/s (1 core)"]
    geo = math.exp(sum(math.log(r) for r in ratios) / len(ratios)) if ratios else None
    return table(header, rows), (geo, min(ratios) if ratios else None,
                                 max(ratios) if ratios else None)


def calibration_text(results):
    parts = []
    m = [r for r in results if r.get("ranks") == 2 and r.get("bench") == "memcpy"]
    if m:
        big = max(m, key=lambda r: r["bytes"])
        best = max(m, key=lambda r: r["algbw_GBps"])
        parts.append("memcpy %s GB/s at %s, %s GB/s at best (%s, in cache)" % (
            fmt_gbps(big["algbw_GBps"]), fmt_bytes(big["bytes"]), fmt_gbps(best["algbw_GBps"]),
            fmt_bytes(best["bytes"])))
    pf = find(results, 2, "calibration", "page_fault", "first_touch")
    if pf:
        parts.append("first touch of freshly mapped memory %.1f µs per %d-byte page, i.e. "
                     "%.0f ms per 100 MB" % (pf["us_per_page"], pf["page_bytes"],
                                             pf["ms_per_100MB"]))
    return "; ".join(parts) or "n/a"


def render(data):
    meta, results = data["meta"], data["results"]
    m, s = meta["machine"], meta["software"]
    rank_counts = sorted({r["ranks"] for r in results if "ranks" in r and r.get("suite") != "meta"})
    cores = m.get("cores") or 1
    L = []
    L.append("Generated by `scripts/bench.sh` on %s from commit `%s`: **one run on a shared "
             "machine**, so figures move by tens of percent between runs; the ratios, measured "
             "side by side in the same run, are the headline." % (meta["date"], s.get("commit", "?")))
    L.append("")
    L.append(table(["", ""], align=["l", "l"], rows=[
        ["Machine", "%s, %s cores (%s thread(s) per core), %s GiB, Linux %s" % (
            m.get("cpu", "?"), m.get("cores"), m.get("threads_per_core", "?"),
            m.get("memory_gib", "?"), m.get("kernel", "?"))],
        ["MPI", "%s %s (`%s`)" % (s["mpi"], s["mpi_version"], meta.get("mpi_library_version", ""))],
        ["Ranks", ", ".join("%d%s" % (n, " (oversubscribed)" if n > cores else "")
                            for n in rank_counts)],
        ["Date", meta["date"]],
        ["Build", "%s, CMake %s%s" % (s.get("compiler", "?"), meta.get("build_type", "Release"), "".join(
            ", `%s=%s`" % kv for kv in meta.get("mpiml_env", {}).items()))],
        ["Python peers", "Python %s, mpi4py %s, NumPy %s, PyTorch %s" % (
            s.get("python", "?"), s.get("mpi4py", "?"), s.get("numpy", "?"),
            s.get("torch_python", "?"))],
        ["Calibration (rank 0, one core)", calibration_text(results)],
        ["Load average (1 min) before / after", "%.2f / %.2f%s" % (
            meta["loadavg"][0], meta["loadavg"][1],
            ", jobs at niceness %d" % meta["nice"] if meta.get("nice") else "")],
        ["Suite time", "%.0f s" % meta["seconds"]],
    ]))
    if meta.get("failures"):
        L += ["", "**Jobs that failed in this run:** " + "; ".join(
            "`%s`: %s" % (k, v) for k, v in meta["failures"].items())]
    if meta.get("skipped"):
        L += ["", "**Not run:** " + "; ".join(meta["skipped"])]

    L += ["", "#### Targets (2 ranks)", ""]
    rows = []
    for h in data["headline"]:
        want = ("≥ %gx faster" if h["kind"] == "speedup" else "≤ %gx the time") % h["target"]
        got = (fmt_x(h["value"]) + (" faster" if h["kind"] == "speedup" else " the time")
               if h["value"] is not None else "n/a")
        status = "not measured" if h["met"] is None else "**met**" if h["met"] else "**MISSED**"
        rows.append([h["name"], want, got, status])
    L.append(table(["Target", "Wanted", "Measured", ""], rows, ["l", "l", "l", "l"]))
    missed = [h for h in data["headline"] if h["met"] is False]
    if missed:
        L += ["", "Missed in this run, with the figures that explain it (see *Why targets are "
              "missed* below the tables):", ""]
        L += ["- %s: %s." % (h["name"], h["detail"]) for h in missed]
    L += ["", "All figures: median over rounds of the slowest rank's time per call "
          "(see *Method*). In the comparison tables, (Nx) after a peer's time is peer time / "
          "mpiml time: above 1 mpiml is faster, below 1 it is slower."]

    for n in rank_counts:
        over = n > cores
        title = "%d ranks%s" % (n, " — oversubscribed (%d ranks on %d cores): indicative only"
                                % (n, cores) if over else "")
        L += ["", "#### " + title, ""]
        L += ["##### Gradient averaging (`mpi_avg_grads`), %d ranks" % n, "",
              grads_table(results, n, "avg_grads"), ""]
        L += ["##### Parameter sync (`sync_params`), %d ranks" % n, "",
              grads_table(results, n, "sync_params"), ""]
        L += ["##### `mpi_statistics_scalar`, %d ranks" % n, "", stats_table(results, n), ""]
        for bench, peer, what in (("allreduce", "MPI_Allreduce",
                                   "float32 sum, out of place; busbw = algbw × 2(p-1)/p"),
                                  ("broadcast", "MPI_Bcast", "root 0; busbw = algbw")):
            tab, summ = sweep_table(results, n, bench, peer)
            L += ["##### %s sweep, %d ranks (%s)" % (bench.capitalize(), n, what), ""]
            if summ and summ[0]:
                L += ["%s / mpiml over all sizes: geometric mean %s, range %s to %s." % (
                    peer, fmt_x(summ[0]), fmt_x(summ[1]), fmt_x(summ[2])), ""]
            L += [tab, ""]
    return "\n".join(L)


def write_results(data, path):
    """Compact JSON: the metadata, then one result per line."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    lines = ["{", '"schema": 1,', '"meta": %s,' % json.dumps(data["meta"], sort_keys=True),
             '"headline": [']
    lines.append(",\n".join(json.dumps({k: h[k] for k in ("key", "kind", "value", "target", "met")})
                            for h in data["headline"]) + "],")
    lines.append('"results": [')
    lines.append(",\n".join(json.dumps(r) for r in data["results"]))
    lines.append("]}")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def compare(ref, data):
    r = sh(["git", "-C", ROOT, "show", "%s:bench/results/latest.json" % ref])
    if r.returncode:
        log("no results at", ref)
        return
    old = {h["key"]: h for h in json.loads(r.stdout).get("headline", [])}
    print("%-28s %12s %12s" % ("headline", ref, "this run"))
    for h in data["headline"]:
        o = old.get(h["key"], {}).get("value")
        print("%-28s %12s %12s" % (h["key"], fmt_x(o), fmt_x(h["value"])))


# ------------------------------------------------------------------ main

BUILD_DIR = os.path.join(ROOT, "build-bench")


def main():
    global BUILD_DIR
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke test: few sizes, 3 rounds")
    ap.add_argument("--ranks", default="2,3,4")
    ap.add_argument("--no-build", action="store_true")
    ap.add_argument("--build-dir", default=BUILD_DIR)
    ap.add_argument("--output", default=None, help="results file (default: %s)" % RESULTS)
    ap.add_argument("--no-markdown", action="store_true")
    ap.add_argument("--compare", metavar="GIT_REF")
    ap.add_argument("--nice", type=int, default=0, help="niceness of the benchmark jobs")
    ap.add_argument("--only", metavar="JOBS",
                    help="run only these jobs (collectives,grads,seed,mpiml_python,gloo,c10d); "
                         "e.g. --only=c10d --output=bench/results/c10d.json: the "
                         "torch.distributed sweep alone, shown when the suite's results have none")
    ap.add_argument("--repeats", type=int, default=None,
                    help="--python: run the jobs this many times, interleaved, and keep each "
                         "workload's best median (default 3): a shared machine's load then hits "
                         "every implementation alike")
    ap.add_argument("--python", action="store_true",
                    help="only the Python package vs the seed vs C++ (2 ranks); writes %s" % PY_RESULTS)
    ap.add_argument("--render-only", action="store_true",
                    help="regenerate BENCHMARKS.md from the results file, run nothing")
    a = ap.parse_args()
    BUILD_DIR = os.path.abspath(a.build_dir)

    if a.render_only:
        import report
        report.write()
        return

    if not a.no_build:
        build(BUILD_DIR)
    have_grads = os.path.exists(os.path.join(BUILD_DIR, "bench", "bench_grads"))
    ranks = [int(x) for x in a.ranks.split(",") if x]
    logdir = os.path.join(BUILD_DIR, "bench-logs")
    os.makedirs(logdir, exist_ok=True)

    env = dict(os.environ)
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    env["MASTER_ADDR"] = "127.0.0.1"
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(BUILD_DIR, "python")] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    load0 = os.getloadavg()[0]
    log("load average before the run: %.2f (%d cores)" % (load0, os.cpu_count() or 1))
    t0 = time.time()
    results, failures, seconds = [], {}, {}
    mpi_version = ""
    jobs = plan_python(a.quick, have_grads) if a.python else plan(ranks, a.quick, have_grads)
    if a.only:
        jobs = [j for j in jobs if j[0].split("_np")[0] in a.only.split(",")]
    if a.python:
        ranks = [2]
        repeats = a.repeats or (1 if a.quick else 5)
        jobs = [(name + "_run%d" % i, n, argv, env_names)
                for i in range(repeats) for name, n, argv, env_names in jobs]
    for name, n, argv, env_names in jobs:
        env["MASTER_PORT"] = str(free_port())
        recs, err, secs = run_job(name, launcher(n, env_names) + argv, env, logdir, a.nice)
        seconds[name] = round(secs, 1)
        if err:
            failures[name] = err
        for r in recs:
            if r.get("suite") == "meta":
                mpi_version = r.get("mpi_library_version", mpi_version)
            elif "bench" in r:  # not a program's header line
                r["oversubscribed"] = n > (os.cpu_count() or 1)
                results.append(r)
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine_info(), "software": software_info(),
        "mpi_library_version": mpi_version, "ranks": ranks, "quick": a.quick, "nice": a.nice,
        "build_type": build_type(BUILD_DIR), "command": " ".join(["scripts/bench.sh"] + sys.argv[1:]),
        "mpiml_env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("MPIML_")},
        "loadavg": [round(load0, 2), round(os.getloadavg()[0], 2)],
        "seconds": round(time.time() - t0, 1), "job_seconds": seconds, "failures": failures,
        "skipped": [] if have_grads else ["bench_grads (mpiml::torch not built)"],
    }
    data = {"meta": meta, "results": results}
    if a.python:
        best = {}
        for r in results:  # each workload's best median over the interleaved repeats
            key = json.dumps({k: v for k, v in r.items() if k not in (
                "iters", "rounds", "median_us", "min_us", "oversubscribed")}, sort_keys=True)
            medians = best[key]["repeat_medians_us"] if key in best else []
            medians.append(round(r["median_us"], 3))
            if key not in best or r["median_us"] < best[key]["median_us"]:
                best[key] = dict(r)
            best[key]["repeat_medians_us"] = medians
        results = list(best.values())
        data["results"] = results
        meta["repeats"] = repeats
        data["headline"] = python_headline(results)
        out = a.output or (None if a.quick else PY_RESULTS)
        if out:
            with open(out, "w") as f:
                json.dump(data, f, indent=1, sort_keys=True)
            log("wrote", out)
            if not a.no_markdown and os.path.abspath(out) == PY_RESULTS:
                import report
                log("wrote", report.write())
        for h in data["headline"]:
            log("%-45s seed %10s python %10s C++ %10s  seed/python %7s  python/C++ %6s" % (
                h["name"], fmt_us(h["seed"]), fmt_us(h["python"]), fmt_us(h["cpp"]),
                fmt_x(h["vs_seed"]), fmt_x(h["vs_cpp"])))
        log("took %.0f s" % meta["seconds"])
        return 1 if failures else 0
    data["headline"] = headline(results)
    out = a.output or (None if a.quick else RESULTS)
    if out:
        write_results(data, out)
        log("wrote", out)
        if not a.no_markdown and os.path.abspath(out) in (RESULTS, C10D_RESULTS):
            import report
            log("wrote", report.write())
    for h in data["headline"]:
        log("%-75s %10s  %s" % (h["name"], fmt_x(h["value"]),
                                "n/a" if h["met"] is None else "met" if h["met"] else "MISSED"))
    if a.compare:
        compare(a.compare, data)
    log("suite took %.0f s" % meta["seconds"])
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
