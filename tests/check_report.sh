#!/usr/bin/env bash
# check_report.sh <output file> <ranks>
# Passes when the output holds the job-wide report exactly once and complete:
# its head, each rank's section once, then its end line. Prints what is wrong.
set -u
out=$1 n=$2
ok=1
fail() { echo "FAIL: $*"; ok=0; }
[ "$(grep -c "^\[mpiml\] report: where every rank is ($n ranks)" "$out")" -eq 1 ] || fail "not exactly one report head"
[ "$(grep -c '^\[mpiml\] end of report' "$out")" -eq 1 ] || fail "not exactly one end of report"
for ((r = 0; r < n; r++)); do
  [ "$(grep -c "^==== rank $r/$n " "$out")" -eq 1 ] || fail "rank $r's section is not there exactly once"
done
awk '/^\[mpiml\] report: where/ { h = NR } /^==== rank / { if (!first) first = NR; last = NR }
     /^\[mpiml\] end of report/ { e = NR } END { exit !(h && first > h && e > last) }' "$out" ||
  fail "the sections are not between the report's head and its end"
[ $ok -eq 1 ]
