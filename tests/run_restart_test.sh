#!/usr/bin/env bash
# run_restart_test.sh <mpiml-run> <fault_child>: restarts after injected
# failures, through mpiml-run and through mpi_fork(n, {.restarts}).
set -u
run=$1 child=$2
fails=0
check() {  # name expected-rc output regex...
  local name=$1 want=$2 out=$3; shift 3
  local ok=1
  if [ "$want" = nonzero ]; then
    [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || { echo "FAIL $name: exit $rc, want an error"; ok=0; }
  else
    [ "$rc" -eq "$want" ] || { echo "FAIL $name: exit $rc, want $want"; ok=0; }
  fi
  for re in "$@"; do
    grep -Eq -- "$re" <<<"$out" || { echo "FAIL $name: no /$re/"; ok=0; }
  done
  if [ $ok -eq 1 ]; then echo "PASS $name (${secs}s)"; else echo "$out" | tail -30; fails=$((fails + 1)); fi
}
timed() { local t0; t0=$(date +%s.%N); out=$(timeout 90 "$@" 2>&1); rc=$?; secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'); }

for inj in kill:1:3 segv:0:2 exit=5:1:3; do
  timed env MPIML_INJECT=$inj "$run" --restarts 2 --backoff 0.2 -np 2 "$child" attempts 0
  check "mpiml-run $inj" 0 "$out" \
    "\[mpiml\] mpiml-run: attempt 1 of 3 failed with status [0-9]+ \(rank [01]/2 host [^:]+: .*\); restarting in 0.2 s" \
    "^attempt=1$"
  grep -q "attempt 2 of 3 failed" <<<"$out" && { echo "FAIL: a second failure after $inj"; fails=$((fails + 1)); }
done

# A failure on every attempt: the restarts run out, the last status is returned.
timed "$run" --restarts 1 --backoff 0.1 -np 2 "$child" throw_between 1
check "mpiml-run restarts run out" 1 "$out" \
  "attempt 1 of 2 failed with status 1 \(rank 1/2 host [^:]+: uncaught exception .*\); restarting" \
  "attempt 2 of 2 failed with status 1 .*; no restarts left"

# Without restarts: one attempt, its status.
timed env MPIML_INJECT=exit=6:0:2 "$run" -np 2 "$child" attempts 0
check "mpiml-run without restarts" 6 "$out" "attempt 1 of 1 failed with status 6"

# mpi_fork(2, {.restarts = 2}) from the program itself.
timed env MPIML_INJECT=kill:0:2 "$child" fork_restarts 0
check "mpi_fork restarts" 0 "$out" "\[mpiml\] mpiml::mpi_fork: attempt 1 of 3 failed" "^attempt=1$"

# Bad usage is a clear error.
timed "$run" --restarts -1 -np 2 "$child" attempts 0
check "mpiml-run bad --restarts" 2 "$out" "mpiml-run: --restarts must be a whole number from 0"
timed env MPIML_INJECT=kill:one:3 "$run" -np 2 "$child" attempts 0
check "bad MPIML_INJECT" nonzero "$out" "MPIML_INJECT='kill:one:3' is not a list of ACTION:RANK:N"

echo "restart tests: $fails failed"
[ $fails -eq 0 ]
