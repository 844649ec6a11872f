#!/usr/bin/env bash
# run_daemon_case.sh <launcher> <flags> <prog> <np> <limit>
# Kills the launcher's process that started the ranks on this host (Open
# MPI's mpirun, Hydra's hydra_pmi_proxy) with SIGKILL while the ranks run
# collectives (<prog> loop). Passes when every rank and the launcher's
# command have ended within <limit> seconds of the kill, and the abort
# record holds a rank's line naming the killed process.
set -u
. "$(dirname "$0")/fault_mark.sh"
launcher=$1 flags=$2 prog=$3 np=$4 limit=$5
tmp=$(mktemp -d)
export MPIML_FAULT_MARK=$tmp/mark MPIML_ABORT_RECORD=$tmp/record MPIML_REPORT_DIR=$tmp/reports
exe=$(readlink -f "$prog")
# This case's ranks: processes of the program whose environment holds its mark.
live_ranks() {
  local p
  for p in $(pgrep -f "$prog loop"); do
    [ "$(readlink "/proc/$p/exe" 2> /dev/null)" = "$exe" ] || continue
    tr '\0' '\n' < "/proc/$p/environ" 2> /dev/null | grep -qxF "MPIML_FAULT_MARK=$tmp/mark" || continue
    [[ "$(ps -o stat= -p "$p" 2> /dev/null)" == Z* ]] && continue  # ended, not yet reaped
    echo "$p"
  done
}
trap 'kill -9 $(live_ranks) 2> /dev/null; rm -rf "$tmp"' EXIT
# shellcheck disable=SC2086
timeout $((limit + 60)) "$launcher" -np "$np" $flags "$prog" loop 0 > "$tmp/out" 2>&1 &
job=$!
ok=1
# rank 0 marks after its first collective: every rank has started MPI
for _ in $(seq 1 300); do
  [ -s "$tmp/mark" ] && [ "$(live_ranks | wc -l)" -eq "$np" ] && break
  sleep 0.1
done
pids=$(live_ranks)
[ "$(wc -w <<< "$pids")" -eq "$np" ] || { echo "FAIL: $np ranks did not start"; cat "$tmp/out"; exit 1; }
daemon=$(ps -o ppid= -p $pids | tr -d " " | sort -u)
[ "$(wc -w <<< "$daemon")" -eq 1 ] || { echo "FAIL: the ranks have parents $daemon"; exit 1; }
name=$(cat "/proc/$daemon/comm")
echo "ranks $(echo $pids) under $name (pid $daemon): killing it"
start=$(date +%s.%N)
kill -9 "$daemon"
while :; do
  left=$(live_ranks)
  if [ -z "$left" ] && ! kill -0 $job 2> /dev/null; then break; fi
  if awk -v a="$start" -v b="$(date +%s.%N)" -v l="$limit" 'BEGIN { exit !(b - a > l) }'; then
    echo "FAIL: after ${limit}s, ranks left: ${left:-none}; the launcher's command $(kill -0 $job 2> /dev/null && echo runs || echo ended)"
    ok=0
    break
  fi
  sleep 0.05
done
elapsed=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
wait $job 2> /dev/null
rc=$?
grep -v '^\s*$' "$tmp/out" | head -20
echo "---- abort record:"
cat "$tmp/record" 2> /dev/null
echo "---- np=$np launcher exit=$rc elapsed=${elapsed}s from the kill (limit ${limit}s)"
# The watch's lines: a rank may also end first by its peers' ends (MPI's own
# error path, or SIGPIPE writing to the lost output), then without one.
lines=$(grep -Ec "^rank [0-9]+/$np host [^:]+: the launcher's process on this host \\($name, pid $daemon\\) has ended" "$tmp/record" 2> /dev/null)
[ "${lines:-0}" -ge 1 ] || { echo "FAIL: no rank's line in the abort record"; ok=0; }
[ $ok -eq 1 ] && echo "PASS" && exit 0
exit 1
