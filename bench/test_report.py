#!/usr/bin/python3
"""Tests of BENCHMARKS.md's generator (ctest -R bench_report):

1. BENCHMARKS.md and its figures are what bench/BENCHMARKS.md.in and the
   stored results make (so edits go to the template, not the output);
2. made from synthetic results: every section and figure is there, the SVGs
   are well-formed with one line per series and one bar per value, a missing
   results file names the command that makes it;
3. the before/after ratios of bench/compare.py: paired (a failed job's
   repeat left out), their median and range.
"""
import json
import os
import sys
import tempfile
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import compare  # noqa: E402
import report  # noqa: E402

failures = []


def expect(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def svg_elements(svg, tag):
    root = ET.fromstring(svg)  # raises on malformed XML
    return root.findall(".//{http://www.w3.org/2000/svg}" + tag)


# 1. the stored output is up to date
stale = report.check()
expect(not stale, "BENCHMARKS.md is stale: %s (run scripts/bench.sh render)" % stale)

# 2. synthetic results
meta = {"date": "2000-01-01 00:00 UTC", "loadavg": [0.5, 3.5], "command": "scripts/bench.sh",
        "machine": {"cpu": "Test CPU", "cores": 2, "memory_gib": 1},
        "software": {"mpi": "Open MPI", "mpi_version": "9.9", "commit": "abc1234"},
        "seconds": 1}
results = []
for b in (4, 1024, 1 << 20):
    results += [{"ranks": 2, "suite": "collectives", "bench": "allreduce", "impl": "mpiml", "bytes": b,
                 "median_us": 1.0 + b / 1e3, "busbw_GBps": 1.0},
                {"ranks": 2, "suite": "collectives", "bench": "allreduce", "impl": "MPI_Allreduce",
                 "bytes": b, "median_us": 2.0 + b / 1e3, "busbw_GBps": 0.5},
                {"ranks": 2, "suite": "c10d", "bench": "all_reduce", "impl": "mpiml", "bytes": b,
                 "median_us": 9.0 + b / 1e3},
                {"ranks": 2, "suite": "c10d", "bench": "all_reduce", "impl": "gloo", "bytes": b,
                 "median_us": 90.0 + b / 1e3}]
for impl, t in (("mpiml", 5.0), ("seed_python", 300.0), ("gloo_bucketed", 1500.0)):
    results.append({"ranks": 2, "suite": "grads", "bench": "avg_grads", "impl": impl, "model": "ac64",
                    "median_us": t, "tensors": 13, "bytes": 44340})
samples = {"cpp": {"GradAverager (plan held)": {"old": [4.0, 4.0, 4.0], "new": [4.0, 4.0, 4.0],
                                                "old_low": [1.0, 2.0, 4.0],
                                                "new_low": [2.0, 2.0, 3.0]}},
           "coll": {"MPI_Allreduce": {"old": [10.0], "new": [11.0], "old_low": [10.0],
                                      "new_low": [12.0]}}}
paired = compare.pair({"coll": {"mpiml": {0: {"old": (1, 1), "new": (2, 2)},
                                          1: {"old": (3, 3)},  # new failed: no pair
                                          2: {"new": (4, 4), "old": (5, 5)}}}})
expect(paired == {"coll": {"mpiml": {"old": [1, 5], "new": [2, 4], "old_low": [1, 5],
                                     "new_low": [2, 4]}}},
       "a failed job's repeat is left out, the others stay paired (got %s)" % paired)
rows = compare.summarize(samples)
by_label = {r["label"]: r for r in rows}
g = by_label["C++ `GradAverager`, (64,64)"]
expect((g["ratio"], g["ratio_min"], g["ratio_max"], g["median_ratio"]) == (1.0, 0.75, 2.0, 1.0),
       "paired ratios of best rounds: median 1, range 0.75-2, medians' ratio 1 (got %s)" % g)
expect(by_label["`MPI_Allreduce` of 64 MiB (control)"]["ratio"] == 1.2, "one pair: ratio 1.2")
expect(by_label["Python `GradAverager`, (64,64)"].get("missing"), "a workload without samples is n/a")
cmp_meta = {"date": "2000-01-01 00:00 UTC", "machine": {"cpu": "Test CPU", "cores": 2},
            "mpi": "Open MPI 9.9", "repeats": 3, "command": "scripts/bench_compare.sh a b",
            "loadavg": [0.1, 0.2, 0.3], "failures": {},
            "old": {"short": "aaaaaaa", "commit": "a" * 40, "subject": "old"},
            "new": {"short": "bbbbbbb", "commit": "b" * 40, "subject": "new"}}
with tempfile.TemporaryDirectory() as d:
    with open(os.path.join(d, "latest.json"), "w") as f:
        json.dump({"meta": meta, "results": results}, f)
    with open(os.path.join(d, "compare.json"), "w") as f:
        json.dump({"meta": cmp_meta, "rows": rows}, f)
    template = os.path.join(d, "in.md")
    with open(template, "w") as f:
        f.write("# T\n\n{{allreduce}}\n\n{{grads}}\n\n{{ppo}}\n\n{{compare}}\n")
    text, svgs = report.render(d, template)
    expect("![allreduce time against message size](bench/results/figures/allreduce.svg)" in text,
           "the allreduce figure is linked")
    expect("load average (1 min) 0.5 / 3.5 before / after (2 cores): **the machine was shared" in text,
           "a loaded run says so, with its load")
    expect("Command: `scripts/bench.sh`" in text and "Open MPI 9.9" in text and "2000-01-01" in text,
           "the caption names the command, the MPI and the date")
    expect("_Not measured yet: the PPO comparison comes from `scripts/bench.sh ppo`._" in text,
           "a missing results file names its command")
    expect("| C++ `GradAverager`, (64,64) | 2.00 µs | 2.00 µs | **1.00** | 0.75-2.00 | 1.00 |" in text,
           "the before/after row")
    expect("paired ratios, 1.20-1.20 in this run" in text, "the controls' range is the noise")
    expect(sorted(svgs) == ["allreduce.svg", "grads.svg"], "two figures (got %s)" % sorted(svgs))
    lines = svg_elements(svgs["allreduce.svg"], "polyline")
    expect(len(lines) == 4, "4 series in the allreduce figure (got %d)" % len(lines))
    expect(all(len(p.get("points").split()) == 3 for p in lines), "3 sizes per series")
    bars = [r for r in svg_elements(svgs["grads.svg"], "rect")
            if r.find("{http://www.w3.org/2000/svg}title") is not None]
    expect(len(bars) == 3, "one bar per measured implementation (got %d)" % len(bars))
    expect("ac64" not in svgs["grads.svg"] and "actor-critic (64,64)" in svgs["grads.svg"],
           "bars are labelled by model")

print("%d check(s) failed" % len(failures) if failures else "bench_report: ok")
sys.exit(1 if failures else 0)
