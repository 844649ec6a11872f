#!/bin/sh
# Runs the benchmark suite: builds it, runs it at 2, 3 and 4 ranks, writes
# bench/results/latest.json and the tables in BENCHMARKS.md.
# Options: see bench/run.py --help (e.g. --quick, --ranks=2).
exec "${MPIML_BENCH_PYTHON:-/usr/bin/python3}" "$(dirname "$0")/../bench/run.py" "$@"
