#!/usr/bin/env bash
# run_fault_case.sh <launcher> <flags> <prog> <np> <mode> <faulty-rank> <max-seconds> <regex> [extra args]
# Passes when the job ends non-zero within max-seconds and its output matches regex.
# The time counts from the fault: the earliest line the program appended to
# $MPIML_FAULT_MARK (tests/fault_mark.hpp; a caller that injects the fault
# from outside appends its own), or from the launch when there is none.
# With EXPECT_OK=1: when the job ends with status 0 and its output does NOT match regex;
# with EXPECT_OK=match: with status 0 and output that matches regex;
# with EXPECT_STATUS=n: with status n and output that matches regex.
# With REPORT_RANKS=n (np: the job's): also when the output holds the report of n ranks once, complete.
# With MPIML_PROFILE=tmp: the job profiles into a directory of its own, and the
# faulty rank's profile_<rank>.json must hold its first allreduce.
set -u
. "$(dirname "$0")/fault_mark.sh"
launcher=$1 flags=$2 prog=$3 np=$4 mode=$5 faulty=$6 limit=$7 regex=$8
shift 8
# hang reports and the fault's mark go to a directory of their own, removed
# at the end (a caller's MPIML_REPORT_DIR and MPIML_FAULT_MARK are kept)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export MPIML_REPORT_DIR=${MPIML_REPORT_DIR:-$tmp/reports}
export MPIML_FAULT_MARK=${MPIML_FAULT_MARK:-$tmp/mark}
[ "${MPIML_PROFILE:-}" = tmp ] && export MPIML_PROFILE=$tmp/profile
start=$(date +%s.%N)
# shellcheck disable=SC2086
out=$(timeout $((limit + 30)) "$launcher" -np "$np" $flags "$prog" "$mode" "$faulty" "$@" 2>&1)
rc=$?
end=$(date +%s.%N)
from=$(fault_time "$MPIML_FAULT_MARK" "$start") what=fault
[ "$from" = "$start" ] && what=launch
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
elif [ -n "${EXPECT_STATUS:-}" ]; then
  [ "$rc" -eq "$EXPECT_STATUS" ] || { echo "FAIL: job exited $rc, not $EXPECT_STATUS"; ok=0; }
  grep -Eq -- "$regex" <<<"$out" || { echo "FAIL: output does not match /$regex/"; ok=0; }
elif [ "${EXPECT_OK:-0}" = match ]; then
  [ "$rc" -eq 0 ] || { echo "FAIL: job exited $rc"; ok=0; }
  grep -Eq -- "$regex" <<<"$out" || { echo "FAIL: output does not match /$regex/"; ok=0; }
else
  [ "$rc" -ne 0 ] || { echo "FAIL: job exited 0"; ok=0; }
  grep -Eq -- "$regex" <<<"$out" || { echo "FAIL: output does not match /$regex/"; ok=0; }
fi
if [ "${MPIML_PROFILE:-}" = "$tmp/profile" ]; then
  /usr/bin/python3 - "$MPIML_PROFILE/profile_$faulty.json" "$faulty" <<'EOF' || { echo "FAIL: the faulty rank's profile"; ok=0; }
import json, sys
d = json.load(open(sys.argv[1]))
assert d["otherData"]["rank"] == int(sys.argv[2]), d["otherData"]
assert any(e.get("cat") == "mpi" and e["args"]["seq"] == 1 for e in d["traceEvents"]), "no allreduce #1"
print("profile of rank %s: %d events" % (sys.argv[2], len(d["traceEvents"])))
EOF
fi
[ "${REPORT_RANKS:-}" = np ] && REPORT_RANKS=$np
if [ -n "${REPORT_RANKS:-}" ]; then
  f=$(mktemp)
  printf '%s\n' "$out" > "$f"
  bash "$(dirname "$0")/check_report.sh" "$f" "$REPORT_RANKS" || ok=0
  rm -f "$f"
fi
[ $ok -eq 1 ] && echo "PASS" && exit 0
exit 1
