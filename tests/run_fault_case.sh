#!/usr/bin/env bash
# run_fault_case.sh <launcher> <flags> <prog> <np> <mode> <faulty-rank> <max-seconds> <regex> [extra args]
# Passes when the job ends non-zero within max-seconds and its output matches regex.
# The time counts from the fault: the earliest line the program appended to
# $MPIML_FAULT_MARK (tests/fault_mark.hpp; a caller that injects the fault
# from outside appends its own), or from the launch when there is none.
# With EXPECT_OK=1: when the job ends with status 0 and its output does NOT match regex.
# With REPORT_RANKS=n: also when the output holds the report of n ranks once, complete.
set -u
launcher=$1 flags=$2 prog=$3 np=$4 mode=$5 faulty=$6 limit=$7 regex=$8
shift 8
# hang reports go to a directory of their own, removed at the end
if [ -z "${MPIML_REPORT_DIR:-}" ]; then
  reports=$(mktemp -d)
  trap 'rm -rf "$reports"' EXIT
  export MPIML_REPORT_DIR=$reports/reports
fi
if [ -z "${MPIML_FAULT_MARK:-}" ]; then
  export MPIML_FAULT_MARK
  MPIML_FAULT_MARK=$(mktemp)
  trap 'rm -rf "${reports:-}" "$MPIML_FAULT_MARK"' EXIT
fi
start=$(date +%s.%N)
# shellcheck disable=SC2086
out=$(timeout $((limit + 30)) "$launcher" -np "$np" $flags "$prog" "$mode" "$faulty" "$@" 2>&1)
rc=$?
end=$(date +%s.%N)
from=$start what=launch
if [ -s "$MPIML_FAULT_MARK" ]; then from=$(sort -n "$MPIML_FAULT_MARK" | head -1) what=fault; fi
elapsed=$(awk -v a="$from" -v b="$end" 'BEGIN { printf "%.2f", b - a }')
total=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.2f", b - a }')
echo "$out" | grep -v '^\s*$' | head -40
echo "---- mode=$mode np=$np faulty=$faulty exit=$rc elapsed=${elapsed}s from the $what (limit ${limit}s; ${total}s from the launch)"
ok=1
[ "$rc" -ne 124 ] || { echo "FAIL: job hung (killed by timeout)"; ok=0; }
awk -v e="$elapsed" -v l="$limit" 'BEGIN { exit !(e <= l) }' || { echo "FAIL: took ${elapsed}s > ${limit}s"; ok=0; }
if [ "${EXPECT_OK:-0}" = 1 ]; then
  [ "$rc" -eq 0 ] || { echo "FAIL: job exited $rc"; ok=0; }
  ! grep -Eq -- "$regex" <<<"$out" || { echo "FAIL: output matches /$regex/"; ok=0; }
else
  [ "$rc" -ne 0 ] || { echo "FAIL: job exited 0"; ok=0; }
  grep -Eq -- "$regex" <<<"$out" || { echo "FAIL: output does not match /$regex/"; ok=0; }
fi
if [ -n "${REPORT_RANKS:-}" ]; then
  f=$(mktemp)
  printf '%s\n' "$out" > "$f"
  bash "$(dirname "$0")/check_report.sh" "$f" "$REPORT_RANKS" || ok=0
  rm -f "$f"
fi
[ $ok -eq 1 ] && echo "PASS" && exit 0
exit 1
