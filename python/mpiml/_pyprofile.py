"""cProfile on every rank, alongside mpiml's profile (see docs/PROFILING.md).

profile_start / MPIML_PROFILE run cProfile on the thread that starts the
profile (the main thread for MPIML_PROFILE). When the profile stops, each rank
writes DIR/profile_<rank>.prof, and rank 0 adds the Python functions whose
cumulative time differs most between ranks to the summary (printed, and in
summary.json / summary.csv). Gathered with mpiml's own collectives.
"""
import cProfile
import csv
import io
import json
import os
import pstats

import numpy as np

from . import _core

TOP_PER_RANK = 30  # each rank's slowest functions (cumulative) that enter the comparison
TABLE_ROWS = 15

_prof = None  # the running cProfile.Profile


def running():
    """True from start() to stop() or discard() (also while paused)."""
    return _prof is not None


def start():
    """Starts cProfile on the calling thread (no-op when it runs)."""
    global _prof
    if _prof is not None:
        return
    p = cProfile.Profile()
    p.enable()
    _prof = p


def pause():
    """Stops recording; stop() or discard() follows."""
    if _prof is not None:
        _prof.disable()


def _take():
    """Stops cProfile; returns its pstats.Stats (None if it was not running)."""
    global _prof
    p, _prof = _prof, None
    if p is None:
        return None
    p.disable()
    p.create_stats()
    return pstats.Stats(p)


def discard():
    _take()


def write_own(directory, rank, size):
    """Not collective: this rank ends the job. Writes its cProfile statistics
    to directory/profile_<rank>.prof (the other ranks' are lost) and says so
    on stderr; never raises."""
    import sys
    try:
        stats = _take()
        if stats is None or not directory:
            return
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, "profile_%d.prof" % rank)
        stats.dump_stats(path)
        sys.stderr.write("[mpiml] rank %d/%d: its Python profile until it ended the job: %s\n"
                         % (rank, size, path))
        sys.stderr.flush()
    except Exception:  # noqa: BLE001 - on the way out of a failed job
        pass


def func_label(key):
    """file:line name, as pstats.func_std_string but with the line first."""
    filename, line, name = key
    if filename == "~" and line == 0:  # built-in
        return name
    return "%s:%d %s" % (filename, line, name)


def _allreduce(x, op):
    out = np.empty_like(x)
    _core.allreduce(x, out, op, None)
    return out


def stop(directory):
    """Collective. Stops cProfile, writes directory/profile_<rank>.prof and, on
    rank 0, the Python section of the summary. Call after the C++ profile
    stopped (it wrote summary.json and summary.csv)."""
    call = "mpiml.profile_stop"
    stats = _take()
    rank, size = _core.world()
    error = ""
    if stats is None:
        stats = pstats.Stats(cProfile.Profile())  # empty: this rank did not profile Python
    else:
        try:
            stats.dump_stats(os.path.join(directory, "profile_%d.prof" % rank))
        except OSError as e:
            error = "cannot write '%s': %s" % (os.path.join(directory, "profile_%d.prof" % rank), e)
    table = stats.stats  # key -> (primitive calls, calls, own time, cumulative, callers)
    top = sorted(table, key=lambda k: table[k][3], reverse=True)[:TOP_PER_RANK]
    mine = json.dumps([list(k) for k in top]).encode()
    # 1. errors and the longest list of names
    head = _allreduce(np.array([len(mine), rank + 1 if error else 0], dtype=np.int64), "max")
    if head[1]:
        bad = int(head[1]) - 1
        raise _error(call, rank, size, error if bad == rank else
                     "the Python profile of rank %d was not written" % bad)
    # 2. every rank's names (a row per rank, summed), their union
    names = np.zeros((size, int(head[0])), dtype=np.uint8)
    names[rank, :len(mine)] = np.frombuffer(mine, dtype=np.uint8)
    names = _allreduce(names, "sum")
    keys = set()
    for r in range(size):
        keys.update(tuple(k) for k in json.loads(bytes(names[r]).rstrip(b"\0").decode() or "[]"))
    keys = sorted(keys)
    # 3. every rank's calls and cumulative time of each
    cum = np.zeros((size, len(keys)), dtype=np.float64)
    calls = np.zeros((size, len(keys)), dtype=np.int64)
    for i, k in enumerate(keys):
        if k in table:
            calls[rank, i] = table[k][1]
            cum[rank, i] = table[k][3]
    cum = _allreduce(cum, "sum")
    calls = _allreduce(calls, "sum")
    if rank != 0:
        return
    try:
        _write_summary(directory, keys, cum, calls)
    except (OSError, ValueError) as e:
        print("[mpiml] Python profile summary not written: %s" % e, flush=True)


def _error(call, rank, size, what):
    from .errors import Error
    e = Error("%s on rank %d/%d: %s" % (call, rank, size, what))
    e.call, e.rank = call, rank
    return e


def _rows(keys, cum, calls, wall):
    """The functions whose slowest rank adds the most (max - mean), at least
    0.1% of the wall time."""
    rows = []
    for i, k in enumerate(keys):
        col = cum[:, i]
        mean, mx = float(col.mean()), float(col.max())
        rows.append({
            "function": func_label(k), "file": k[0], "line": k[1], "name": k[2],
            "ranks": int((calls[:, i] > 0).sum()),
            "calls_min": int(calls[:, i].min()), "calls_max": int(calls[:, i].max()),
            "min_s": float(col.min()), "mean_s": mean, "max_s": mx,
            "slowest_rank": int(col.argmax()),
            "imbalance": (mx - mean) / mx if mx > 0 else 0.0,
            "excess_s": mx - mean,
        })
    rows.sort(key=lambda r: (-r["excess_s"], r["function"]))
    return [r for r in rows if r["excess_s"] > 0 and r["excess_s"] >= 1e-3 * wall][:TABLE_ROWS]


def _shorten(s, w):
    return s if len(s) <= w else "..." + s[len(s) - w + 3:]


def format_table(rows, directory):
    w = min(max([8] + [len(r["function"]) for r in rows]), 60)
    out = ["Python functions whose cumulative time differs most between ranks (cProfile, "
           "seconds per rank; excess = max - mean)",
           "%-*s %11s %10s %10s %10s %7s %10s %6s" % (w, "function", "calls", "min", "mean", "max",
                                                     "slowest", "excess", "imbal")]
    for r in rows:
        c = r["calls_min"], r["calls_max"]
        calls = str(c[1]) if c[0] == c[1] else "%d-%d" % c
        out.append("%-*s %11s %10.4f %10.4f %10.4f %7s %10.4f %6.3f" % (
            w, _shorten(r["function"], w), calls, r["min_s"], r["mean_s"], r["max_s"],
            "rank %d" % r["slowest_rank"], r["excess_s"], r["imbalance"]))
    if not rows:
        out.append("(none differs by 0.1% of the wall time or more)")
    out.append("files: %s/profile_<rank>.prof (pstats.Stats; snakeviz)" % directory)
    return "\n".join(out) + "\n"


def _write_summary(directory, keys, cum, calls):
    jpath = os.path.join(directory, "summary.json")
    with open(jpath) as f:
        summary = json.load(f)
    wall = float(summary.get("wall_s") or 0.0)
    rows = _rows(keys, cum, calls, wall)
    print(format_table(rows, directory), end="", flush=True)
    summary["python"] = {"time": "cumulative", "rows": rows}
    with open(jpath + ".tmp", "w") as f:
        json.dump(summary, f, indent=0)
        f.write("\n")
    os.replace(jpath + ".tmp", jpath)
    # summary.csv: a slowest_rank column (empty for regions and collectives),
    # then one row per function with kind "python" (mpi, wait: empty).
    cpath = os.path.join(directory, "summary.csv")
    with open(cpath, newline="") as f:
        old = list(csv.reader(f))
    buf = io.StringIO()
    out = csv.writer(buf, lineterminator="\n")
    out.writerow(old[0] + ["slowest_rank"])
    for row in old[1:]:
        out.writerow(row + [""])
    for r in rows:
        out.writerow([r["function"], "python", r["ranks"], r["calls_min"], r["calls_max"],
                      "%.9f" % r["min_s"], "%.9f" % r["mean_s"], "%.9f" % r["max_s"],
                      "%.6f" % (r["mean_s"] / wall if wall > 0 else 0.0), "%.6f" % r["imbalance"],
                      "", "", r["slowest_rank"]])
    with open(cpath + ".tmp", "w", newline="") as f:
        f.write(buf.getvalue())
    os.replace(cpath + ".tmp", cpath)
