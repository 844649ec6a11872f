#!/usr/bin/env bash
# Tests across hosts on scripts/cluster.sh's cluster (2 hosts, TCP between them):
# the test binaries at 2 hosts x 2 ranks and 2 x 1, simulated nodes against
# real ones bit for bit, faults on one host, mpiml-ppo spanning both hosts,
# then 3 hosts (equal and unequal nodes).
#
#   scripts/cluster_tests.sh [build dir]     (default: build)
#
# Prints "cluster tests: P passed, F failed"; exits 0 if all passed, 77 with
# the reason if this machine cannot build the cluster (needs root, ip netns),
# 1 otherwise. The cluster is removed at the end, also on failure.
# CLUSTER_CASES=<regex> runs only the cases whose name it matches (a group:
# when it matches one of the group's names), e.g. 'report|fault.rank_stalled'.
# PPO=0 skips the PPO run; it passes when AverageEpRet reaches PPO_TARGET
# within PPO_EPOCHS epochs: by default the one-host learning check's bar, 475
# within 60 (seed 0 reaches it in 14 epochs; the run stops there).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/tests/fault_mark.sh"  # fault_time, fault_now, record_ok
build=$(cd "${1:-$root/build}" && pwd)
cl=$root/scripts/cluster.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
why=$("$cl" check 2>&1)
if [ $? -eq 77 ]; then echo "cluster tests: SKIPPED: $why"; exit 77; fi
hosts=2
"$cl" up $hosts || { echo "cluster tests: cannot bring the cluster up"; exit 1; }
trap '"$cl" down > /dev/null 2>&1' EXIT INT TERM
mpirun_cl=${MPIML_CLUSTER_DIR:-/run/mpiml-cluster}/mpirun
log=$build/cluster-tests
mkdir -p "$log"
cd "$log" || exit 1  # files the test programs write go here, not into the caller's directory
passed=0 failed=0
ns=${MPIML_CLUSTER_PREFIX:-mpiml-}  # the hosts' network namespaces: $ns<host>
picked() { [ -z "${CLUSTER_CASES:-}" ] || [[ $1 =~ $CLUSTER_CASES ]]; }
result() {  # name rc [detail]
  if [ "$2" -eq 0 ]; then echo "  ok    $1 ${3:-}"; passed=$((passed + 1))
  else echo "  FAIL  $1 ${3:-} (log: $log/$1.log)"; failed=$((failed + 1)); fi
}
# Nothing of ours may stay on a host after a job: waits up to 10 s for it.
hosts_empty() {
  local t
  for t in $(seq 20); do
    [ -z "$(for h in $(ip netns list | awk -v p="$ns" 'index($1, p "h") == 1 && substr($1, length(p) + 2) ~ /^[0-9]+$/ { print $1 }'); do ip netns pids "$h"; done)" ] && return 0
    sleep 0.5
  done
  echo "left running:"; "$cl" ps
  "$cl" down > /dev/null; "$cl" up "$hosts" > /dev/null  # clean slate for the next case
  return 1
}
secs() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }

# binary_case test layout: a test binary on the hosts of layout (h1:2,h2:2);
# every rank's gtest summary must say PASSED.
binary_case() {
  local t=$1 layout=$2 np name t0 rc filter=()
  np=$(tr , '\n' <<< "$layout" | awk -F: '{ n += $2 } END { print n }')
  name=$t.${layout//[:,]/_}
  picked "$name" || return 0
  t0=$(date +%s.%N)
  # test_shm: the integer types and > 64 MiB stay on the one-host runs (time)
  [ "$t" = test_shm ] && filter=(--gtest_filter='-ShmAllreduce.*Int*:ShmAllreduce.*Short:ShmAllreduce.*Long*:ShmAllreduce.Above64MiB')
  # test_torch_overlap: the equivalence cases (with and without overlap, bit for bit)
  # and overlap on across nodes without overlap_on_one_node
  [ "$t" = test_torch_overlap ] && filter=(--gtest_filter='TorchOverlap.Equals*:TorchOverlap.Gradient*:TorchOverlap.MpiPath*:TorchOverlap.FixedOrder*:TorchOverlap.OneNode*')
  timeout 400 "$cl" run -np "$np" --host "$layout" "$build/tests/$t" "${filter[@]}" > "$log/$name.log" 2>&1
  rc=$?
  [ $rc -eq 0 ] && [ "$(grep -o 'PASSED' "$log/$name.log" | wc -l)" -ge "$np" ] || rc=1
  hosts_empty >> "$log/$name.log" || rc=1
  result "$name" $rc "($(secs "$t0") s)"
}
# hash_case name split layout np nodes: cluster_hash with MPIML_NODE_SPLIT=split
# on one host and on the real hosts of layout (MPI seeing nodes nodes) hold
# the same bits.
hash_case() {
  local name=$1 split=$2 hl=$3 np=$4 nodes=$5 sim real hs hr
  picked "$name" || return 0
  sim=$(MPIML_NODE_SPLIT=$split timeout 120 mpirun --oversubscribe -np "$np" "$build/tests/cluster_hash" 2>&1)
  real=$(timeout 120 "$cl" run -np "$np" --host "$hl" "$build/tests/cluster_hash" 2>&1)
  printf 'simulated: %s\nreal: %s\n' "$sim" "$real" > "$log/$name.log"
  hs=$(sed -n 's/^cluster_hash: \([0-9a-f]*\) .*/\1/p' <<< "$sim")
  hr=$(sed -n "s/^cluster_hash: \\([0-9a-f]*\\) nodes=$nodes .*/\\1/p" <<< "$real")
  [ -n "$hs" ] && [ "$hs" = "$hr" ]
  result "$name" $? "($hl; simulated $hs, real ${hr:-none})"
}

echo "-- test binaries across hosts (hierarchical path over TCP)"
for t in test_core test_errors test_shm test_profile test_torch; do
  [ -x "$build/tests/$t" ] || { echo "  skip  $t (not built)"; continue; }
  for layout in h1:2,h2:2 h1:1,h2:1; do binary_case $t $layout; done
done

echo "-- simulated nodes (MPIML_NODE_SPLIT, one host) against real hosts, bit for bit"
hash_case hash.np4 2 h1:2,h2:2 4 2
hash_case hash.np2 1 h1:1,h2:1 2 2

echo "-- faults (each: non-zero exit naming the rank/host within its limit of the fault, nothing left)"
export MPIML_TIMEOUT=3
fc=$build/tests/fault_child
# fault_case name limit regex mode faulty [action after 3 s]
fault_case() {
  local name=$1 limit=$2 regex=$3 mode=$4 faulty=$5 action=${6:-}
  picked "fault.$name" || return 0
  local mark=$log/fault.$name.mark  # when the fault came (tests/fault_mark.hpp)
  rm -f "$mark" ${record_re:+"$MPIML_ABORT_RECORD"}
  MPIML_FAULT_MARK=$mark bash "$root/tests/run_fault_case.sh" "$mpirun_cl" "${fault_hosts:---host h1:2,h2:2}" "${fault_prog:-$fc}" "${fault_np:-4}" "$mode" "$faulty" \
    "$limit" "$regex" > "$log/fault.$name.log" 2>&1 &
  local job=$!
  if [ -n "$action" ]; then sleep 3; fault_now "$mark"; eval "$action" >> "$log/fault.$name.log" 2>&1; fi
  wait $job
  local rc=$?
  record_ok >> "$log/fault.$name.log" 2>&1 || rc=1  # record_re: the ranks' lines
  ip -n "${ns}h2" link set eth0 up
  hosts_empty >> "$log/fault.$name.log" || rc=1
  result "fault.$name" $rc "($(grep -o 'elapsed=[0-9.]*s' "$log/fault.$name.log"))"
}
[ -x "$fc" ] || { echo "  FAIL  fault_child not built"; failed=$((failed + 1)); }
if [ -x "$fc" ]; then
  fault_case rank_killed_on_h2 13 "rank 3 .* on node h2 .*(signal 9|Killed)" sigkill 3
  # mpirun's line for a killed rank or, when a rank on h1 notices first (its
  # TCP transport), Open MPI's own end naming h2 as the lost peer's host
  fault_case h2_ranks_killed 16 "rank [23] .* on node h2 .*(signal 9|Killed)|Peer host: +h2" loop -1 \
    'kill -9 $(ip netns pids ${ns}h2 | xargs ps -o pid=,comm= -p | awk "\$2 == \"fault_child\" {print \$1}")'
  # h2's daemon killed: its ranks end themselves (nothing else would), and
  # mpirun ends the job on h1
  MPIML_ABORT_RECORD=$log/fault.h2_daemon_killed.record record_re="1:^rank [23]/4 host h2: the launcher's process on this host \\(orted, pid [0-9]+\\) has ended" \
    fault_case h2_daemon_killed 10 "lost communication with a remote daemon" loop -1 \
    'kill -9 $(ip netns pids ${ns}h2 | xargs ps -o pid=,comm= -p | awk "\$2 == \"orted\" {print \$1}")'
  # (the link comes back after the limit in any case, so that a hang cannot outlive the case)
  fault_case h2_link_cut 16 "rank [0-3]/4: watchdog: .*(never arrived|on this node \\(h[12]\\) arrived)|lost communication with a remote daemon" loop -1 \
    'ip -n "${ns}h2" link set eth0 down; (sleep 20; ip -n "${ns}h2" link set eth0 up) &'
  # ranks 0-2 on both hosts time out together: one report, complete, then the job ends
  REPORT_RANKS=4 fault_case rank_stalled_on_h2 13 "rank 3/4 +host h2 +pid [0-9]+: not in a collective" stall 3
  # A rank that ends while the others wait for it (the exit guard, across hosts).
  fault_case rank_exits_on_h2 10 "rank 3/4: exited with status 3 \\(host h2\\) while (rank [0-2] waits|ranks [0-2, ]+ wait) in allreduce #2" exit 3
  fault_case rank_returns_on_h1 10 "rank 0/4: exited with status 0 \\(host h1\\) while (rank [1-3] waits|ranks [1-3, ]+ wait) in allreduce #2" return 0
  EXPECT_OK=1 fault_case rank_ends_first_on_h2 12 "aborting the job" early_ok 3
  # ... before their first collective: mpiml started MPI (the guard is set up
  # in MPI_Init), or the program did, one rank a host (the door at exit).
  fault_case rank_exits_before_first_on_h2 10 "rank 3/4: exited with status 3 \\(host h2\\) while (rank [0-2] waits|ranks [0-2, ]+ wait) in allreduce #1" exit_before 3
  # ... before it starts MPI (status 0: mpirun does not end the job): the
  # rank starts MPI on its way out and ends the job at the door after
  # MPI_Init, with a host of its own too and without MPIML_TIMEOUT. Ended
  # with _exit (no exit handler): rank 2, on the same host, sees it gone;
  # alone on its host, only the watchdog (MPIML_TIMEOUT, at least 10 s in
  # MPI_Init) ends the others' wait.
  fault_case rank_exits_before_mpi_on_h2 10 "rank 3/4: exited with status 0 \\(host h2\\) before it started MPI, while ranks 0, 1, 2 start MPI - aborting the job" exit_before_mpi 3
  MPIML_TIMEOUT=0 fault_hosts="--host h1:1,h2:1" fault_np=2 fault_case rank_exits_before_mpi_alone_on_h2 10 "rank 1/2: exited with status 0 \\(host h2\\) before it started MPI, while rank 0 starts MPI - aborting the job" exit_before_mpi 1
  fault_case rank_os_exits_before_mpi_on_h2 15 "rank \\?: (rank 3 \\(pid [0-9]+\\)|local rank 1 of 2) on this host ended before it started MPI" os_exit_before_mpi 3
  fault_hosts="--host h1:1,h2:1" fault_np=2 fault_case rank_os_exits_before_mpi_alone_on_h2 30 "watchdog: MPI_Init_thread waited [0-9.]+ s, past the timeout of 10 s \\(rank 0 of the launcher\\)" os_exit_before_mpi 1
  FAULT_OWN_INIT=1 fault_hosts="--host h1:1,h2:1" fault_np=2 fault_case rank_returns_before_first_owninit_on_h2 10 "rank 1/2: finalized MPI \\(host h2\\) while rank 0 waits in allreduce #1" return_before 1
  # h2 cut off mid-run under mpiml-run --min-ranks 2: the job restarts on h1 alone.
  name=restart_without_h2
  if picked "fault.$name"; then
  t0=$(date +%s.%N)
  timeout 150 "$cl" exec h1 "$build/mpiml-run" --restarts 1 --backoff 0.5 --min-ranks 2 \
    --hostfile "${MPIML_CLUSTER_DIR:-/run/mpiml-cluster}/hostfile" -np 4 "$fc" ticks 0 > "$log/fault.$name.log" 2>&1 &
  job=$!
  # mid-run: once every rank of the first attempt passed a collective
  for _ in $(seq 300); do grep -q "^ticks: every rank started" "$log/fault.$name.log" 2> /dev/null && break; sleep 0.1; done
  sleep 1
  ip -n "${ns}h2" link set eth0 down
  wait $job
  rc=$?
  ip -n "${ns}h2" link set eth0 up
  grep -q "mpiml-run: attempt 1 of 2 failed" "$log/fault.$name.log" &&
    grep -q "mpiml-run: leaving out h2 (cannot be reached); next attempt: 2 ranks on h1" "$log/fault.$name.log" &&
    grep -q "^ticks done on 2 ranks, attempt 1$" "$log/fault.$name.log" || rc=1
  hosts_empty >> "$log/fault.$name.log" || rc=1
  result "fault.$name" $rc "($(secs "$t0") s)"
  fi
  # One rank a host: only the remote read (one-sided MPI) sees the waiting rank.
  fault_hosts="--host h1:1,h2:1" fault_np=2 fault_case rank_exits_alone_on_h2 10 "rank 1/2: exited with status 3 \\(host h2\\) while rank 0 waits in allreduce #2" exit 1
  # Without MPIML_CHECK, calls MPI carries across hosts compare the ranks'
  # arguments beside the call: every rank that returns from it throws, in
  # place of MPI's truncation error on one rank and a partial result on the
  # other (one rank a host: an allreduce; a broadcast whose rank on h2
  # expects more, an allgather, over MPI's path on 2 hosts x 2).
  after="on rank [0-3]/[24]: mismatched calls on MPI's path, found after the call \\(its result is not valid\\)"
  MPIML_CHECK=0 fault_hosts="--host h1:1,h2:1" fault_np=2 fault_case mismatch_alone_on_h2 10 "mpiml::allreduce $after: count 999 on one rank, 1000 on another" shm_count_off 1
  MPIML_CHECK=0 fault_case mismatch_bcast_on_h2 10 "mpiml::broadcast $after: count 1000 on one rank, 1200 on another" bcast_count_off 3
  MPIML_CHECK=0 fault_case mismatch_allgather_on_h2 10 "mpiml::allgather $after: count 3 on one rank, 4 on another" allgather_count_off 3
fi
# GradAverager(overlap=true), one rank a host: the rank on h2 fails during
# backward() while rank 0's communication thread waits for it in its allreduce.
ftc=$build/tests/fault_torch_child
if [ -x "$ftc" ]; then
  fault_hosts="--host h1:1,h2:1" fault_np=2 fault_prog=$ftc
  fault_case overlap.rank_exits_on_h2 10 "rank 1/2: exited with status 3 \\(host h2\\) while (rank 0 waits in allreduce #[0-9]+|allreduce #[0-9]+ was under way on another of its threads) - aborting the job" exit 1
  fault_case overlap.rank_exits_on_h1 10 "rank 0/2: exited with status 3 \\(host h1\\) while (rank 1 waits in allreduce #[0-9]+|allreduce #[0-9]+ was under way on another of its threads) - aborting the job" exit 0
  fault_case overlap.rank_exits_inside_on_h2 10 "rank 1/2: exited with status 3 \\(host h2\\) while allreduce #[0-9]+ was under way on another of its threads - aborting the job" exit_inside 1
  fault_case overlap.rank_killed_on_h2 13 "rank 1 .* on node h2 .*(signal 9|Killed)" sigkill 1
  fault_case overlap.rank_throws_on_h2 10 "rank 1/2: uncaught exception .*injected failure during backward" throw 1
  fault_case overlap.rank_throws_in_run_on_h2 10 "rank 1/2: uncaught exception .*injected failure during backward" throw_run 1
  unset fault_hosts fault_np fault_prog
fi
unset MPIML_TIMEOUT

# Where every rank is: rank 2 of 3, alone on h2, is late in a function of its
# own; rank 0's agent (h1) asks h2's for its section (tests/run_report_test.sh).
# With h1:1,h2:2 the waiting ranks 0 and 1 time out together on both hosts
# (hang0: rank 0 late on h1, ranks 1 and 2 on h2 ask its agent).
echo "-- report of where every rank is (the late rank alone on h2)"
pypath=$build/install/lib/python3.11/dist-packages
report_case() {  # name case program...
  local name=$1 c=$2 t0 rc
  shift 2
  picked "$name" || return 0
  t0=$(date +%s.%N)
  REPORT_TOOL="$cl exec h1 $build/mpiml-report" bash "$root/tests/run_report_test.sh" "$mpirun_cl" \
    "--host ${report_hosts:-h1:2,h2:1} -x PYTHONPATH=$pypath" "$c" "$@" > "$log/$name.log" 2>&1
  rc=$?
  hosts_empty >> "$log/$name.log" || rc=1
  result "$name" $rc "($(secs "$t0") s)"
}
for c in hang signal command stall; do
  REPORT_SOURCE=$root/tests/hang_child.cpp report_case report.cpp.$c $c "$build/tests/hang_child"
done
for c in hang hang0; do
  report_hosts=h1:1,h2:2 REPORT_SOURCE=$root/tests/hang_child.cpp report_case report.cpp.$c.h1_1_h2_2 $c "$build/tests/hang_child"
done
if [ -d "$pypath/mpiml" ]; then
  REPORT_SOURCE=$root/python/tests/hang_child.py report_case report.py.hang hang /usr/bin/python3 "$root/python/tests/hang_child.py"
else
  echo "  skip  report.py.hang (no installed Python package at $pypath)"
fi

# MPICH: the same hosts through Hydra's rsh launcher and the same agent, with
# the MPICH build of the tests (scripts/test.sh builds it before this stage).
mpich_build=${MPICH_BUILD:-$root/build-mpich}
if ! picked "mpich.test_core mpich.test_shm mpich.cluster_hash mpich.rank_exits mpich.rank_exits_before_mpi mpich.mismatch"; then
  :
elif [ -x "$mpich_build/tests/test_core" ] && command -v mpiexec.mpich > /dev/null; then
  echo "-- MPICH (Hydra) across hosts: $mpich_build"
  for t in test_core test_shm cluster_hash; do
    [ -x "$mpich_build/tests/$t" ] || { echo "  skip  mpich.$t (not built)"; continue; }
    name=mpich.$t.h1_2_h2_2
    t0=$(date +%s.%N)
    filter=()
    [ $t = test_shm ] && filter=(--gtest_filter='-ShmAllreduce.*Int*:ShmAllreduce.*Short:ShmAllreduce.*Long*:ShmAllreduce.Above64MiB')
    MPIML_CLUSTER_MPI=mpich timeout 400 "$cl" run -n 4 -hosts h1:2,h2:2 "$mpich_build/tests/$t" "${filter[@]}" > "$log/$name.log" 2>&1
    rc=$?
    if [ $t = cluster_hash ]; then
      # every rank holds the same bits (else exit 1), and MPI sees 2 nodes; the
      # bits themselves differ from Open MPI's where MPI_Allreduce reduces
      grep -q '^cluster_hash: [0-9a-f]* nodes=2 hosts=h1,h1,h2,h2$' "$log/$name.log" || rc=1
    else
      [ $rc -eq 0 ] && [ "$(grep -o 'PASSED' "$log/$name.log" | wc -l)" -ge 4 ] || rc=1
    fi
    hosts_empty >> "$log/$name.log" || rc=1
    result "$name" $rc "($(secs "$t0") s)"
  done
  # The exit guard under Hydra: a rank that exits while the others wait for it,
  # with 2 ranks a host and with 1 (the remote read); alone on its host, a
  # rank that exits before it starts MPI (Hydra ends no such job itself).
  # Without MPIML_CHECK, a rank on h2 that passes fewer floats to an
  # allreduce (MPICH's own allreduce gives it a partial result, no error).
  if [ -x "$mpich_build/tests/fault_child" ]; then
    for spec in "rank_exits h1:2,h2:2 4 3 exit" "rank_exits h1:1,h2:1 2 1 exit" \
                "rank_exits_before_mpi h1:1,h2:1 2 1 exit3_before_mpi" "mismatch h1:1,h2:1 2 1 shm_count_off"; do
      read -r what hl np faulty mode <<<"$spec"
      name=mpich.$what.${hl//[:,]/_}
      if [ "$mode" = exit ]; then
        re="rank $faulty/$np: exited with status 3 \(host h2\) while (rank [0-9]+ waits|ranks [0-9, ]+ wait) in allreduce #2"
      elif [ "$mode" = shm_count_off ]; then
        re="mpiml::allreduce on rank [01]/2: mismatched calls on MPI's path, found after the call \(its result is not valid\): count 999 on one rank, 1000 on another"
      else
        re="rank $faulty/$np: exited with status 3 \(host h2\) before it started MPI, while rank 0 starts MPI - aborting the job"
      fi
      t0=$(date +%s.%N)
      MPIML_CHECK=0 MPIML_TIMEOUT=0 MPIML_CLUSTER_MPI=mpich timeout 60 "$cl" run -n "$np" -hosts "$hl" "$mpich_build/tests/fault_child" \
        "$mode" "$faulty" > "$log/$name.log" 2>&1
      rc=$?
      # passes when the job ended non-zero (not by the timeout) with the guard's line
      if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -Eq "$re" "$log/$name.log"; then
        rc=0
      else
        rc=1
      fi
      hosts_empty >> "$log/$name.log" || rc=1
      result "$name" $rc "($(secs "$t0") s)"
    done
  fi
else
  echo "-- MPICH across hosts: skipped (no MPICH build at $mpich_build or no mpiexec.mpich)"
fi

if [ "${PPO:-1}" = 1 ] && picked ppo_across_hosts && [ -x "$build/apps/mpiml-ppo" ]; then
  target=${PPO_TARGET:-475} epochs=${PPO_EPOCHS:-60}
  echo "-- mpiml-ppo --cpu 4 across 2 hosts (mpi_fork with MPIML_HOSTFILE), CartPole-v1 seed 0, AverageEpRet >= $target within $epochs epochs"
  out=$log/ppo
  rm -rf "$out"
  t0=$(date +%s.%N)
  timeout 600 "$cl" exec h1 "$build/apps/mpiml-ppo" --env CartPole-v1 --cpu 4 --seed 0 --epochs "$epochs" \
    --stop-at-return "$target" --out "$out/run" --profile "$out/prof" > "$log/ppo.log" 2>&1
  rc=$?
  best=$(awk -F'\t' 'NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
    $c["AverageEpRet"] != "nan" && $c["AverageEpRet"] + 0 > b + 0 { b = $c["AverageEpRet"] } END { print b + 0 }' \
    "$out/run/progress.txt" 2> /dev/null)
  lanes=$(grep -o '"name":"rank [0-9]* ([^)]*)"' "$out/prof/timeline.json" 2> /dev/null | sed 's/.*(\(.*\))"/\1/' | sort | uniq -c | xargs)
  [ $rc -eq 0 ] && awk -v b="${best:-0}" -v t="$target" 'BEGIN { exit !(b >= t) }' && [ "$lanes" = "2 h1 2 h2" ]
  rc=$?
  hosts_empty >> "$log/ppo.log" || rc=1
  result ppo_across_hosts $rc "(best AverageEpRet ${best:-none}, ranks per host: ${lanes:-none}, $(secs "$t0") s)"
fi

# 3 hosts: the per-node-rank exchange among 3 nodes (a reduce-scatter and an
# allgather per chunk, not the 2-node pairwise one) and the leader path of
# nodes of unequal size, each against its one-host simulation bit for bit;
# GradAverager with overlap and without, bit for bit, on MPI's path.
echo "-- 3 hosts (h1 h2 h3)"
if ! picked "test_core.h1_1_h2_1_h3_1 test_shm.h1_1_h2_1_h3_1 test_torch_overlap.h1_1_h2_1_h3_1 hash3.np3 hash3.np5"; then
  :
elif "$cl" down > /dev/null 2>&1; hosts=3; "$cl" up $hosts > "$log/up3.log" 2>&1; then
  for t in test_core test_shm test_torch_overlap; do
    [ -x "$build/tests/$t" ] && binary_case $t h1:1,h2:1,h3:1
  done
  hash_case hash3.np3 1 h1:1,h2:1,h3:1 3 3
  hash_case hash3.np5 2 h1:2,h2:2,h3:1 5 3
else
  echo "  FAIL  cannot bring up 3 hosts (log: $log/up3.log)"; failed=$((failed + 1))
fi

echo "cluster tests: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
