#!/bin/sh
# Runs the benchmark suite: builds it, runs it at 2, 3 and 4 ranks, writes
# bench/results/latest.json and the tables in BENCHMARKS.md; then the PPO
# comparison (mpiml-ppo against Spinning Up's PPO, bench/ppo_compare.py).
#   scripts/bench.sh [suite options]    suite, then the PPO comparison
#   scripts/bench.sh ppo [options]      only the PPO comparison (--help)
# Suite options: see bench/run.py --help (e.g. --quick, --ranks=2).
py=${MPIML_BENCH_PYTHON:-/usr/bin/python3}
here=$(dirname "$0")
if [ "${1:-}" = ppo ]; then
  shift
  exec "$py" "$here/../bench/ppo_compare.py" "$@"
fi
"$py" "$here/../bench/run.py" "$@" || exit $?
case " $* " in *" --help "*|*" -h "*|*" --render-only "*) exit 0 ;; esac
case " $* " in *" --no-markdown "*) exec "$py" "$here/../bench/ppo_compare.py" --no-markdown ;; esac
exec "$py" "$here/../bench/ppo_compare.py"
