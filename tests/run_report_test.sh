#!/usr/bin/env bash
# run_report_test.sh <launcher> <flags> <case> <program...>
# Rank 2 of 3 is late in sleepy_rank_work while ranks 0 and 1 wait; checks
# the report (docs/DEBUGGING.md). The program is tests/hang_child or
# python/tests/hang_child.py; REPORT_TOOL is mpiml-report. Cases:
#   hang      MPIML_TIMEOUT=2: the report (ranks 0, 1 in the collective at
#             their line, rank 2 in sleepy_rank_work at its line), complete
#             and once although both waiting ranks' deadlines pass together,
#             then each one's watchdog line, and the job ends non-zero within
#             the deadline + 5 s of the late rank's start
#   hang0     the same with rank 0 late (its agent answers ranks 1 and 2)
#   signal    SIGUSR1 to the launcher while rank 2 is late: the report, and
#             the job ends with 0
#   command   the same through mpiml-report <launcher pid>
#   stall     MPIML_STALL_WARNING=2 while rank 2 is late: rank 0, the node's
#             lowest waiting rank, says once where it waits and that rank 2
#             never arrived (or, rank 2 on another host, that every rank of
#             its node did), prints the report once, and the job ends with 0
#   mismatch  MPIML_CHECK=1, rank 1 passes another count: the error names
#             both call sites
set -u
. "$(dirname "$0")/fault_mark.sh"
launcher=$1 flags=$2 case=$3
shift 3
prog=("$@")
src=${REPORT_SOURCE:?set REPORT_SOURCE to the source of the program (for its line numbers)}
line() { grep -n -- "$1" "$src" | head -1 | cut -d: -f1; }
base=$(basename "$src")
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
export MPIML_REPORT_DIR=$dir/reports
ok=1
fail() { echo "FAIL: $*"; ok=0; }
export MPIML_FAULT_MARK=$dir/mark  # when the late rank starts to be late (tests/fault_mark.hpp)
start=$(date +%s.%N)
late=2
case $case in
  hang|hang0)
    [ "$case" = hang0 ] && late=0
    # shellcheck disable=SC2086
    MPIML_TIMEOUT=2 timeout 40 "$launcher" -np 3 $flags "${prog[@]}" hang $late > "$dir/out" 2>&1
    rc=$? ;;
  signal|command)
    # shellcheck disable=SC2086
    timeout 60 "$launcher" -np 3 $flags "${prog[@]}" demand 6 > "$dir/out" 2>&1 &
    job=$!
    # every rank is set up once rank 0 says so; then rank 2 goes to sleepy_rank_work
    for _ in $(seq 300); do grep -q "hang_child: ready" "$dir/out" 2> /dev/null && break; sleep 0.1; done
    sleep 1
    # the launcher: the first mpirun/mpiexec among timeout's descendants
    lpid=
    todo=$job
    while [ -z "$lpid" ] && [ -n "$todo" ]; do
      next=
      for p in $todo; do
        case $(ps -o comm= -p "$p") in mpirun|mpiexec*|orterun|prterun) lpid=$p; break ;; esac
        next="$next $(pgrep -P "$p" | xargs)"
      done
      todo=$next
    done
    [ -n "$lpid" ] || fail "no launcher process under $job"
    if [ "$case" = signal ]; then
      kill -USR1 "$lpid"  # mpirun and Hydra's mpiexec forward it to every rank
    else
      # shellcheck disable=SC2086  # REPORT_TOOL may be a command with arguments
      ${REPORT_TOOL:?} "$lpid" > "$dir/tool.out" 2>&1 || fail "mpiml-report exited $?"
      grep -q "sleepy_rank_work" "$dir/tool.out" || fail "mpiml-report's output does not name sleepy_rank_work"
    fi
    wait $job
    rc=$? ;;
  stall)
    # shellcheck disable=SC2086
    MPIML_STALL_WARNING=2 timeout 60 "$launcher" -np 3 $flags "${prog[@]}" demand 6 > "$dir/out" 2>&1
    rc=$? ;;
  mismatch)
    # shellcheck disable=SC2086
    MPIML_CHECK=1 timeout 40 "$launcher" -np 3 $flags "${prog[@]}" mismatch > "$dir/out" 2>&1
    rc=$? ;;
  *) echo "unknown case $case"; exit 2 ;;
esac
start=$(fault_time "$MPIML_FAULT_MARK" "$start")
elapsed=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
cat "$dir/out"
echo "---- case=$case exit=$rc elapsed=${elapsed}s"
out=$dir/out
# A section: from its "==== rank R/3" line to the next one.
section() { awk -v r="==== rank $1/3 " 'index($0, r) == 1 { on = 1; print; next } /^==== rank |^\[mpiml\] end of report/ { on = 0 } on' "$out"; }
check_report() {  # the one report, complete: the late rank at its line, the others in the collective at theirs
  bash "$(dirname "$0")/check_report.sh" "$out" 3 || ok=0
  local wait r
  wait=$(line WAIT-LINE)
  section $late | grep -q "not in a collective" || fail "rank $late is not 'not in a collective'"
  section $late | grep -Eq "sleepy_rank_work.*$base:$(line LATE-LINE)|$base\", line $(line LATE-LINE) in sleepy_rank_work" ||
    fail "rank $late's stack does not show sleepy_rank_work at $base:$(line LATE-LINE)"
  for r in 0 1 2; do
    [ "$r" -eq "$late" ] && continue
    section $r | grep -Eq "^==== rank $r/3 .*: in barrier #[0-9]+ .* at [^ ]*$base:$wait" ||
      fail "rank $r is not in the barrier at $base:$wait"
    section $r | grep -Eq "allreduce.* at [^ ]*$base:$(line FIRST-LINE)" ||
      fail "rank $r's history lacks the allreduce at $base:$(line FIRST-LINE)"
  done
  ls "$MPIML_REPORT_DIR"/report-*.txt > /dev/null 2>&1 || fail "no report file in MPIML_REPORT_DIR"
}
case $case in
  hang|hang0)
    check_report
    [ "$rc" -eq 1 ] || fail "the job exited $rc, not with the watchdog's status 1"
    # the waiting ranks' watchdog lines, after the report
    for r in 0 1 2; do
      [ "$r" -eq "$late" ] && continue
      grep -Eq "rank $r/3: watchdog: .*waited" "$out" || fail "no watchdog line of rank $r"
    done
    awk '/^\[mpiml\] end of report/ { e = NR } /watchdog: .*waited.*aborting the job/ && !w { w = NR } END { exit !(e && w > e) }' "$out" ||
      fail "a watchdog line comes before the report's end"
    # from the late rank's start: the 2 s deadline, the report and MPI_Abort
    awk -v e="$elapsed" 'BEGIN { exit !(e <= 12) }' || fail "took ${elapsed}s" ;;
  signal|command)
    check_report
    [ "$rc" -eq 0 ] || fail "the job exited $rc"
    grep -q "hang_child: demand done" "$out" || fail "the job did not go on to its end"
    ! grep -q "stall:" "$out" || fail "a stall warning within MPIML_STALL_WARNING's default 60 s" ;;
  stall)
    check_report
    [ "$rc" -eq 0 ] || fail "the job exited $rc"
    grep -q "hang_child: demand done" "$out" || fail "the job did not go on to its end"
    for r in 0; do
      [ "$(grep -Ec "^\[mpiml\] rank $r/3: stall: barrier #[0-9]+ \(.*, on MPI_COMM_WORLD\) at [^ ]*$base:$(line WAIT-LINE)( in [^ ]+)? has waited [^;]+; (ranks on this node \([^)]+\) that never arrived: 2 \(last entered #[0-9]+\)|every rank on this node \([^)]+\) arrived \(a rank on another node may not have\)) - the job goes on" "$out")" -eq 1 ] ||
        fail "not one stall line of rank $r naming its barrier and rank 2"
    done
    ! grep -Eq "rank [12]/3: stall:" "$out" || fail "a rank other than the node's lowest waiting one warned" ;;
  mismatch)
    [ "$rc" -eq 0 ] || fail "the job exited $rc"
    for r in 0 1 2; do
      grep -Eq "rank $r caught: .*mismatched collectives.*rank 1 called allreduce\(count=3.* at [^ ]*$base:$(line MISMATCH-ONE).*ranks 0, 2 called allreduce\(count=4.* at [^ ]*$base:$(line MISMATCH-OTHERS)|rank $r caught: .*ranks 0, 2 called allreduce\(count=4.* at [^ ]*$base:$(line MISMATCH-OTHERS).*rank 1 called allreduce\(count=3.* at [^ ]*$base:$(line MISMATCH-ONE)" "$out" ||
        fail "rank $r's error does not name both call sites"
    done ;;
esac
[ $ok -eq 1 ] && echo PASS && exit 0
exit 1
