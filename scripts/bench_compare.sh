#!/bin/sh
# Before/after in one run: builds OLD_REV and NEW_REV (default HEAD) in
# worktrees under build-compare/ (ccache reuses their objects) and times
# both, interleaved: (64,64) GradAverager and mpi_avg_grads from C++ and
# Python, 4 B and 32 MiB dist.all_reduce on the backend, 64 MiB allreduce.
# Writes bench/results/compare.json and its table in BENCHMARKS.md.
#   scripts/bench_compare.sh OLD_REV [NEW_REV] [--repeats=5] [--help]
py=${MPIML_BENCH_PYTHON:-/usr/bin/python3}
exec "$py" "$(dirname "$0")/../bench/compare.py" "$@"
