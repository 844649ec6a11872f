#!/bin/sh
# Runs the benchmark suite: builds it, runs it at 2, 3 and 4 ranks, writes
# bench/results/latest.json; then the PPO comparison (mpiml-ppo against
# Spinning Up's PPO, bench/ppo_compare.py). Each step regenerates
# BENCHMARKS.md from bench/BENCHMARKS.md.in and bench/results/.
#   scripts/bench.sh [suite options]    suite, then the PPO comparison
#   scripts/bench.sh ppo [options]      only the PPO comparison (--help)
#   scripts/bench.sh render             only regenerate BENCHMARKS.md
# Suite options: see bench/run.py --help (e.g. --quick, --ranks=2, --python).
# Before/after of two revisions: scripts/bench_compare.sh.
py=${MPIML_BENCH_PYTHON:-/usr/bin/python3}
here=$(dirname "$0")
case "${1:-}" in
  ppo) shift; exec "$py" "$here/../bench/ppo_compare.py" "$@" ;;
  render) exec "$py" "$here/../bench/report.py" ;;
esac
"$py" "$here/../bench/run.py" "$@" || exit $?
case " $* " in *" --help "*|*" -h "*|*" --render-only "*|*" --python "*) exit 0 ;; esac
case " $* " in *" --no-markdown "*) exec "$py" "$here/../bench/ppo_compare.py" --no-markdown ;; esac
exec "$py" "$here/../bench/ppo_compare.py"
