#!/usr/bin/env bash
# mpiml under Slurm, on scripts/cluster.sh's cluster (up --slurm: slurmctld on
# h1, a slurmd on h1 and h2), with the commands users run: srun --mpi=pmix
# -N 2 -n 4 of the test binaries, a pytest subset and the c10d tests; mpi_fork
# under srun and inside an allocation; MPICH through srun --mpi=pmi2; faults
# (a rank killed, a rank exiting, a node lost, a slurmd stopped, scancel, a
# rank's exit outlasting the others' status 75 under srun -K, in C++ and
# Python);
# mpiml-run --restarts with srun; and the job script of docs/CLUSTER.md
# through sbatch, requeued once mid-run, resuming and reaching PPO's learning
# bar.
#
#   scripts/slurm_tests.sh [build dir]     (default: build; MPICH_BUILD: build-mpich)
#
# Prints "slurm tests: P passed, F failed"; exits 0 if all passed, 77 with the
# reason if this machine cannot build the cluster, 1 otherwise. The cluster
# (daemons, files, namespaces) is removed at the end, also on failure or
# interruption. PPO=0 skips the sbatch PPO run.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/tests/fault_mark.sh"  # fault_time, fault_now, record_ok
build=$(cd "${1:-$root/build}" && pwd)
mpich_build=${MPICH_BUILD:-$root/build-mpich}
cl=$root/scripts/cluster.sh
why=$("$cl" check 2>&1)
if [ $? -eq 77 ]; then echo "slurm tests: SKIPPED: $why"; exit 77; fi
cleanup() { "$cl" down > /dev/null 2>&1; }
trap cleanup EXIT
trap 'trap - EXIT; cleanup; exit 130' INT TERM HUP
log=$build/slurm-tests
rm -rf "$log"
mkdir -p "$log"
"$cl" up --slurm 2 > "$log/up.log" 2>&1
rc=$?
if [ $rc -eq 77 ]; then echo "slurm tests: SKIPPED: $(tail -1 "$log/up.log")"; exit 77; fi
if [ $rc -ne 0 ]; then
  cat "$log/up.log"
  echo "slurm tests: 0 passed, 1 failed (cannot bring the Slurm cluster up)"
  exit 1
fi
sl() { "$cl" slurm "$@"; }  # a command on the login node h1
pypath=$build/install/lib/python3.11/dist-packages
export PYTHONPATH=$pypath PYTHONDONTWRITEBYTECODE=1
shm_filter=--gtest_filter='ShmAllreduce.Float*:ShmAllreduce.Double*:ShmBroadcast*'
passed=0 failed=0
result() {  # name rc [detail]
  if [ "$2" -eq 0 ]; then echo "  ok    $1 ${3:-}"; passed=$((passed + 1))
  else echo "  FAIL  $1 ${3:-} (log: $log/$1.log)"; failed=$((failed + 1)); fi
}
# the command names of what runs on the hosts
host_comms() { for h in h1 h2; do ip netns pids "${MPIML_CLUSTER_PREFIX:-mpiml-}$h"; done | paste -sd, | xargs -r ps -o comm= -p; }
# wait_job id limit: waits for a batch job to leave the queue; cancels it
# after limit seconds (status 1)
wait_job() {
  local out
  for _ in $(seq $(($2 * 2))); do
    # a failed squeue (controller busy) is no answer; an unknown id is gone
    out=$(sl squeue -h -j "$1" 2>&1) && [ -z "$out" ] && return 0
    grep -q "Invalid job id" <<< "$out" && return 0
    sleep 0.5
  done
  echo "job $1 still queued or running after $2 s: cancelled"
  sl scancel "$1"
  return 1
}
secs() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }
# After each case: both nodes idle again and nothing but the daemons left on
# the hosts (waits up to $1 s, 30 by default; a node left down is resumed for
# the next case).
settled() {
  local st left
  for _ in $(seq $((2 * ${1:-30}))); do
    st=$(sl sinfo -h -N -o "%N %t" 2> /dev/null | xargs)
    left=$(host_comms | grep -vxE "munged|slurmctld|slurmscriptd|slurmd" | xargs)
    [ "$st" = "h1 idle h2 idle" ] && [ -z "$left" ] && return 0
    sleep 0.5
  done
  echo "not settled: nodes '$st', left running: '$left'"
  "$cl" ps
  if [ "$st" = "h1 idle h2 idle" ] && [ -z "$(tr ' ' '\n' <<< "$left" | grep -vx slurmstepd)" ]; then
    # Slurm's step daemon alone, stuck after its step ended (seen after a
    # PMIx error under load): no rank is left; it would fail every later case.
    echo "  note  a slurmstepd outlived its step by ${1:-30} s with no rank left: killed" | tee /dev/stderr
    for h in h1 h2; do
      ip netns pids "${MPIML_CLUSTER_PREFIX:-mpiml-}$h" | xargs -r ps -o pid=,comm= -p | awk '$2 == "slurmstepd" { print $1 }' | xargs -r kill -9
    done
    sleep 1
    return 0
  fi
  sl scontrol update NodeName=h1,h2 State=RESUME > /dev/null 2>&1
  return 1
}
# Open MPI 4.1.4 under srun --mpi=pmix now and then crashes a task inside
# MPI_Init (docs/CLUSTER.md, "Known problems"): srun reports the task's
# segmentation fault, and no rank printed mpiml's fatal-signal line, which
# mpiml's handler prints for any crash from the end of MPI_Init on.
startup_crash() {
  grep -qE "task [0-9]+: Segmentation fault" "$1" && ! grep -qE "\[mpiml\] rank [0-9]+/[0-9]+: fatal signal" "$1"
}
# again name log case-function [args]: runs the case, and once more when it
# failed on that start-up crash (the first log kept as log.crashed). The
# function sets rc (0: passed) and detail.
again() {
  local name=$1 f=$2
  shift 2
  "$@"
  if [ "$rc" -ne 0 ] && startup_crash "$f"; then
    echo "  note  $name: a task crashed inside MPI_Init (Open MPI under srun); the case runs once more"
    mv "$f" "$f.crashed"
    "$@"
  fi
}
# srun_case name timeout check-regex count srun-args...: passes when srun -K
# exits 0 and check-regex matches at least count lines
srun_once() {
  local name=$1 limit=$2 regex=$3 count=$4 t0
  shift 4
  t0=$(date +%s.%N)
  timeout "$limit" "$cl" slurm srun -K "$@" > "$log/$name.log" 2>&1
  rc=$?
  [ $rc -eq 0 ] && [ "$(grep -cE -- "$regex" "$log/$name.log")" -ge "$count" ] || rc=1
  settled >> "$log/$name.log" || rc=1
  detail="($(secs "$t0") s)"
}
srun_case() {
  again "$1" "$log/$1.log" srun_once "$@"
  result "$1" $rc "$detail"
}

echo "-- sinfo"
sl sinfo -N > "$log/sinfo.log" 2>&1
[ "$(awk '$4 == "idle"' "$log/sinfo.log" | wc -l)" -eq 2 ]
result sinfo $? "($(awk 'NR > 1 { printf "%s %s ", $1, $4 }' "$log/sinfo.log"))"

echo "-- srun --mpi=pmix -N 2 -n 4 (Open MPI through PMIx, ranks on h1 and h2)"
srun_case hash 120 '^cluster_hash: [0-9a-f]+ nodes=2 hosts=h1,h1,h2,h2$' 1 --mpi=pmix -N 2 -n 4 "$build/tests/cluster_hash"
srun_case test_core 300 'PASSED' 4 --mpi=pmix -N 2 -n 4 "$build/tests/test_core"
srun_case test_shm 300 'PASSED' 4 --mpi=pmix -N 2 -n 4 "$build/tests/test_shm" "$shm_filter"
if [ -d "$pypath/mpiml" ]; then
  cd "$root/python/tests" || exit 1
  export MPIML_TIMEOUT=60
  srun_case pytest 300 ' passed' 4 --mpi=pmix -N 2 -n 4 /usr/bin/python3 -m pytest -q -p no:cacheprovider \
    test_smoke.py test_mpi_tools.py test_mpi_pytorch.py
  if [ -e "$pypath/mpiml/_c10d.cpython-311-x86_64-linux-gnu.so" ]; then
    srun_case c10d 300 ' passed' 4 --mpi=pmix -N 2 -n 4 /usr/bin/python3 -m pytest -q -p no:cacheprovider \
      test_c10d.py test_c10d_ddp.py
  fi
  unset MPIML_TIMEOUT
  cd "$root" || exit 1

  echo "-- mpi_fork(4) under srun and inside an allocation"
  fork=$root/python/tests/fork_in_allocation.py
  # under srun --mpi=pmix: a no-op, the 4 tasks are the ranks
  srun_case fork.srun_pmix 60 '^fork_in_allocation: rank [0-3]/4 on h[12]$' 4 --mpi=pmix -N 2 -n 4 /usr/bin/python3 "$fork"
  # under srun without MPI support: every task refuses, naming itself
  name=fork.srun_none
  t0=$(date +%s.%N)
  timeout 60 "$cl" slurm srun -N 2 -n 4 /usr/bin/python3 "$fork" > "$log/$name.log" 2>&1
  rc=$?
  [ $rc -ne 0 ] && [ $rc -ne 124 ] && ! grep -q '^fork_in_allocation:' "$log/$name.log" &&
    [ "$(grep -cE 'task [0-3] of 4 of an srun step without MPI support .* would start 4 ranks of its own' "$log/$name.log")" -eq 4 ]
  rc=$?
  settled >> "$log/$name.log" || rc=1
  result $name $rc "($(secs "$t0") s)"
  # in a batch script: mpi_fork starts 4 ranks over the allocation, with
  # Open MPI's mpirun and with srun (MPIML_MPIRUN=srun)
  name=fork.sbatch
  fork_sbatch() {
  t0=$(date +%s.%N)
  printf '#!/bin/bash\n/usr/bin/python3 %s 4\nMPIML_MPIRUN=srun /usr/bin/python3 %s 4\n' "$fork" "$fork" > "$log/fork_job.sh"
  jid=$(sl sbatch --parsable -N 2 -n 4 -o "$log/$name.log" "$log/fork_job.sh")
  wait_job "$jid" 120 > "$log/$name.wait"
  rc=$?
  # each rank's line counted wherever it is (a launcher may put two ranks'
  # output on one line)
  [ $rc -eq 0 ] && [ "$(grep -oE 'fork_in_allocation: rank [0-3]/4 on h1' "$log/$name.log" | wc -l)" -eq 4 ] &&
    [ "$(grep -oE 'fork_in_allocation: rank [0-3]/4 on h2' "$log/$name.log" | wc -l)" -eq 4 ] &&
    [ "$(grep -o 'fork_in_allocation:' "$log/$name.log" | wc -l)" -eq 8 ]
  rc=$?
  settled >> "$log/$name.log" || rc=1
  detail="($(secs "$t0") s)"
  }
  again $name "$log/$name.log" fork_sbatch
  result $name $rc "$detail"
else
  echo "  skip  pytest, c10d, mpi_fork (no Python package in $pypath: ctest -R python_install)"
fi

if [ -x "$mpich_build/tests/test_core" ]; then
  echo "-- MPICH through srun --mpi=pmi2: $mpich_build"
  srun_case mpich.hash 120 '^cluster_hash: [0-9a-f]+ nodes=2 hosts=h1,h1,h2,h2$' 1 --mpi=pmi2 -N 2 -n 4 "$mpich_build/tests/cluster_hash"
  srun_case mpich.test_core 300 'PASSED' 4 --mpi=pmi2 -N 2 -n 4 "$mpich_build/tests/test_core"
else
  echo "  skip  MPICH (no MPICH build at $mpich_build)"
fi

echo "-- faults (MPIML_TIMEOUT=3): each ends the job non-zero within its limit, naming the rank and host, nothing left"
export MPIML_TIMEOUT=3
fc=$build/tests/fault_child
# fault_case name limit regex mode faulty [action after 4 s]
fault_once() {
  local name=$1 limit=$2 regex=$3 mode=$4 faulty=$5 action=${6:-} t0 job el
  # The limit counts from the fault: the program appends the time it injects
  # it to this file (tests/fault_mark.hpp), an action its own.
  local mark=$log/fault.$name.mark
  rm -f "$mark" "$log/fault.$name.report" ${record_re:+"$MPIML_ABORT_RECORD"}
  t0=$(date +%s.%N)
  MPIML_FAULT_MARK=$mark timeout $((limit + 60)) "$cl" slurm srun --mpi=pmix -N 2 -n 4 "$fc" "$mode" "$faulty" > "$log/fault.$name.log" 2>&1 &
  job=$!
  if [ -n "$action" ]; then sleep 4; fault_now "$mark"; eval "$action" >> "$log/fault.$name.log" 2>&1; fi
  wait $job
  rc=$?
  local total; total=$(secs "$t0")
  t0=$(fault_time "$mark" "$t0")
  el=$(secs "$t0")
  echo "---- exit=$rc elapsed=${el}s from the fault (limit ${limit}s; ${total}s from the launch)" >> "$log/fault.$name.log"
  [ $rc -ne 0 ] && [ $rc -ne 124 ] && awk -v e="$el" -v l="$limit" 'BEGIN { exit !(e <= l) }' &&
    grep -Eq -- "$regex" "$log/fault.$name.log" &&
    { [ -z "${REPORT_RANKS:-}" ] || bash "$root/tests/check_report.sh" "$log/fault.$name.log" "$REPORT_RANKS" > "$log/fault.$name.report"; }
  rc=$?
  [ -f "$log/fault.$name.report" ] && cat "$log/fault.$name.report" >> "$log/fault.$name.log" && rm -f "$log/fault.$name.report"
  record_ok >> "$log/fault.$name.log" 2>&1 || rc=1  # record_re: the ranks' lines
  "$cl" link h2 up
  [ -e "$log/restart_slurmd" ] && { "$cl" slurmd h2 start; rm "$log/restart_slurmd"; }
  settled >> "$log/fault.$name.log" || rc=1
  detail="(${el} s)"
}
fault_case() {
  again "fault.$1" "$log/fault.$1.log" fault_once "$@"
  result "fault.$1" $rc "$detail"
}
# srun names the task (the rank) and the node; the other ranks see their peer
# gone and the step is ended.
fault_case rank_killed_on_h2 13 "^srun: error: h2: task 3: Killed" sigkill 3
fault_case rank_exits_on_h2 10 "rank 3/4: exited with status 3 \\(host h2\\) while (rank [0-2] waits|ranks [0-2, ]+ wait) in allreduce #2" exit 3
# ... before it starts MPI (status 0; srun without -K): the rank starts MPI
# on its way out and ends the step at the door after MPI_Init. Ended with
# _exit (no exit handler): rank 2, on the same host, sees it gone and ends;
# srun leaves h1's ranks to the watchdog in MPI_Init (MPIML_TIMEOUT, at
# least 10 s).
fault_case rank_exits_before_mpi_on_h2 10 "rank 3/4: exited with status 0 \\(host h2\\) before it started MPI, while ranks 0, 1, 2 start MPI - aborting the job" exit_before_mpi 3
fault_case rank_os_exits_before_mpi_on_h2 30 "rank \\?: rank 3( \\(pid [0-9]+\\))? on this host ended before it started MPI" os_exit_before_mpi 3
# ranks 0-2 on both hosts time out together: one report, complete, then the job ends
REPORT_RANKS=4 fault_case rank_stalled_on_h2 13 "rank 3/4 +host h2 +pid [0-9]+: not in a collective" stall 3
# h2 lost (its slurmd killed, its link cut): h1's ranks wait in a collective
# until MPIML_TIMEOUT and end the step; srun then gives up on h2's tasks.
fault_case h2_lost 25 "rank [01]/4: watchdog: .* every rank on this node \\(h1\\) arrived \\(a rank on another node may not have\\)" loop -1 \
  "touch '$log/restart_slurmd'; '$cl' slurmd h2 stop; '$cl' link h2 down"
# h2's slurmstepd of the step killed: h2's ranks end themselves (nothing
# else would; their lines go to the abort record, their output went through
# that slurmstepd), h1's ranks then wait in a collective until MPIML_TIMEOUT,
# or, when a send to them was under way, Open MPI's ob1 ends the job itself on
# the failed write ("FATAL"; mpiml's SIGPIPE handling leaves it to fail).
MPIML_ABORT_RECORD=$log/fault.stepd_killed_on_h2.record \
  record_re="1:^rank [23]/4 host h2: the launcher's process on this host \\(slurmstepd, pid [0-9]+\\) has ended" \
  fault_case stepd_killed_on_h2 25 "rank [01]/4: watchdog: .* every rank on this node \\(h1\\) arrived|pml_ob1_[a-z]+\\.c:[0-9]+ FATAL" loop -1 \
  "kill -9 \$(ps -o ppid= -p \$(ip netns pids '${MPIML_CLUSTER_PREFIX:-mpiml-}h2' | xargs ps -o pid=,comm= -p | awk '\$2 == \"fault_child\" { print \$1; exit }'))"
# h2's slurmd alone stopped: the steps it started go on (slurmstepd runs them)
name=slurmd_stopped_on_h2
slurmd_stopped() {
t0=$(date +%s.%N)
timeout 60 "$cl" slurm srun --mpi=pmix -N 2 -n 4 "$fc" ticks 0 > "$log/fault.$name.log" 2>&1 &
job=$!
# once the step runs on both hosts (every rank passed a collective)
for _ in $(seq 300); do grep -q "^ticks: every rank started" "$log/fault.$name.log" 2> /dev/null && break; sleep 0.1; done
"$cl" slurmd h2 stop
wait $job
rc=$?
grep -q "^ticks done on 4 ranks, attempt 0$" "$log/fault.$name.log" || rc=1
"$cl" slurmd h2 start
settled >> "$log/fault.$name.log" || rc=1
detail="(the job completes; $(secs "$t0") s)"
}
again "fault.$name" "$log/fault.$name.log" slurmd_stopped
result "fault.$name" $rc "$detail"
unset MPIML_TIMEOUT
# scancel: every rank of a batch job ends, on both hosts
name=scancel
t0=$(date +%s.%N)
printf '#!/bin/bash\nsrun --mpi=pmix %s loop -1\n' "$fc" > "$log/loop_job.sh"
jid=$(sl sbatch --parsable -N 2 -n 4 -o "$log/$name.out" "$log/loop_job.sh")
for _ in $(seq 40); do
  [ "$(host_comms | grep -cx fault_child)" -eq 4 ] && break
  sleep 0.5
done
sl scancel "$jid"
t1=$(date +%s.%N)
# the ranks end within 10 s; Slurm's own slurmstepd may take longer after a
# PMIx error on the way (seen at 37 s on a loaded machine)
rc=1
for _ in $(seq 100); do
  [ "$(host_comms | grep -cx fault_child)" -eq 0 ] && { rc=0; break; }
  sleep 0.1
done
gone=$(secs "$t1")
settled 90 > "$log/$name.log" || rc=1
cat "$log/$name.out" >> "$log/$name.log"
grep -q "CANCELLED" "$log/$name.log" || rc=1
result $name $rc "(4 ranks running, gone ${gone} s after scancel; Slurm settled after $(secs "$t1") s)"

# Every rank stops on request (status 75); rank 3's exit goes on 0.5 s past
# MPI_Finalize. srun -K sends it SIGTERM once the others ended: the signal
# does not cut its exit short, and srun ends with 75 (what the job script's
# requeue reads), not 143.
name=stopped_slow_exit
stopped_slow_exit() {
  t0=$(date +%s.%N)
  timeout 60 "$cl" slurm srun -K --mpi=pmix -N 2 -n 4 "$fc" stopped_slow_exit 3 > "$log/$name.log" 2>&1
  rc=$?
  echo "---- exit=$rc" >> "$log/$name.log"
  if [ $rc -eq 75 ] && grep -q "^fault_child: rank 3 finished its exit" "$log/$name.log"; then rc=0; else rc=1; fi
  settled >> "$log/$name.log" || rc=1
  detail="(srun -K: status 75, rank 3's exit complete; $(secs "$t0") s)"
}
again $name "$log/$name.log" stopped_slow_exit
result $name $rc "$detail"
# The same from Python under MPIML_PROFILE, whose ranks meet at the exit
# guard in an atexit handler, before Python knows their status.
name=stopped_slow_exit.python
stopped_slow_exit_python() {
  t0=$(date +%s.%N)
  MPIML_PROFILE=$log/$name.prof timeout 60 "$cl" slurm srun -K --mpi=pmix -N 2 -n 4 /usr/bin/python3 \
    "$root/python/tests/slow_exit.py" 0.5 75 0 0 > "$log/$name.log" 2>&1
  rc=$?
  echo "---- exit=$rc" >> "$log/$name.log"
  if [ $rc -eq 75 ] && grep -q "^slow_exit: rank 3 finished its exit" "$log/$name.log" &&
    [ -e "$log/$name.prof/profile_3.prof" ]; then rc=0; else rc=1; fi
  settled >> "$log/$name.log" || rc=1
  detail="(srun -K: status 75, rank 3's exit complete, profile written; $(secs "$t0") s)"
}
again $name "$log/$name.log" stopped_slow_exit_python
result $name $rc "$detail"

echo "-- restarts inside an allocation"
# mpiml-run --restarts 1 with MPIML_MPIRUN=srun in a batch job: rank 3 (on h2)
# killed at its 300th collective; attempt 2 resumes from the last checkpoint.
name=mpiml_run_srun_restart
srun_restart() {
rm -rf "$log/restart_out"
t0=$(date +%s.%N)
cat > "$log/restart_job.sh" << EOF
#!/bin/bash
export MPIML_MPIRUN=srun MPIML_INJECT=kill:3:300
"$build/mpiml-run" --restarts 1 --backoff 0.5 -np 4 "$build/apps/mpiml-ppo" --seed 0 --epochs 3 --steps 800 \
  --train-pi-iters 40 --train-v-iters 40 --out "$log/restart_out"
EOF
jid=$(sl sbatch --parsable -N 2 -n 4 -o "$log/$name.log" "$log/restart_job.sh")
wait_job "$jid" 300 > "$log/$name.wait"
rc=$?
cat "$log/$name.wait" >> "$log/$name.log"
for re in "mpiml-run: attempt 1 of 2 failed with status [0-9]+ \\(rank 3/4 host h2: MPIML_INJECT: kill" \
  "^mpiml-ppo: resuming from .* saved by 4 ranks"; do
  grep -Eq "$re" "$log/$name.log" || { echo "---- no line matches: $re" >> "$log/$name.log"; rc=1; }
done
last=$(awk 'END { print $1 }' "$log/restart_out/progress.txt" 2> /dev/null)
[ "$last" = 2 ] || { echo "---- progress.txt ends at epoch '$last', not 2" >> "$log/$name.log"; rc=1; }
settled >> "$log/$name.log" || rc=1
detail="($(secs "$t0") s)"
}
again $name "$log/$name.log" srun_restart
result $name $rc "$detail"

# A rank killed from outside mpiml (no abort record): mpiml-run names the
# failed attempt by srun's line for the task.
name=mpiml_run_srun_names_the_task
names_the_task() {
t0=$(date +%s.%N)
printf '#!/bin/bash\nMPIML_MPIRUN=srun %s --restarts 1 --backoff 0.5 -np 4 %s sigkill 3\n' "$build/mpiml-run" "$fc" > "$log/killed_job.sh"
jid=$(sl sbatch --parsable -N 2 -n 4 -o "$log/$name.log" "$log/killed_job.sh")
wait_job "$jid" 120 > "$log/$name.wait"
rc=$?
cat "$log/$name.wait" >> "$log/$name.log"
grep -Eq "mpiml-run: attempt 1 of 2 failed with status [0-9]+ \(srun: error: h2: task 3: Killed\); restarting" "$log/$name.log" || rc=1
settled >> "$log/$name.log" || rc=1
detail="($(secs "$t0") s)"
}
again $name "$log/$name.log" names_the_task
result $name $rc "$detail"

# The job script of docs/CLUSTER.md: sbatch, requeued (scontrol requeue) once
# it has checkpointed epoch 2; the second run resumes, and once it has
# checkpointed epoch 4 gets the time limit's warning (SIGUSR2 to the step's
# tasks, as --signal=USR2@120 sends it): every rank stops after the same
# epoch with a checkpoint, status 75, and the script requeues itself; the
# third run resumes from that epoch and reaches the bar (seed 0: in epoch 19,
# as without the requeues).
if [ "${PPO:-1}" = 1 ]; then
  echo "-- sbatch of docs/CLUSTER.md's job script (mpiml-ppo to AverageEpRet 475), requeued mid-run, stopped by the time limit's signal"
  name=sbatch_ppo
  sbatch_ppo() {
  t0=$(date +%s.%N)
  mkdir -p "$log/job"
  awk '/^#!\/bin\/bash$/ { on = 1 } on && /^```/ { exit } on' "$root/docs/CLUSTER.md" |
    sed "s| build/apps/| $build/apps/|" > "$log/job/ppo.sh"
  rc=0
  jid=$(cd "$log/job" && sl sbatch --parsable ppo.sh) || rc=1
  out=$log/job/ppo-$jid
  ckpt() { compgen -G "$out/checkpoints/step-0000000[$1-9]" > /dev/null; }  # epoch $1 or later saved
  # a requeued job, once back in the queue, waits about 2 minutes before it
  # may start again: in 2 s (one started within the second of the requeue is
  # refused by slurmd, "Job credential revoked")
  soon() {
    for _ in $(seq 60); do [ "$(sl squeue -h -j "$jid" -o "%T %r")" = "PENDING BeginTime" ] && break; sleep 0.5; done
    sl scontrol update JobId="$jid" StartTime=now+2 >> "$log/$name.log" 2>&1 || rc=1
  }
  for _ in $(seq 600); do ckpt 2 && break; sleep 0.5; done
  ckpt 2 || rc=1
  sl scontrol requeue "$jid" > "$log/$name.log" 2>&1 || rc=1
  soon
  for _ in $(seq 600); do grep -q "^mpiml-ppo: resuming from" "$log/job/ppo-$jid.out" && ckpt 4 && break; sleep 0.5; done
  ckpt 4 || rc=1
  sl scancel -s USR2 "$jid" >> "$log/$name.log" 2>&1 || rc=1
  soon
  wait_job "$jid" 600 >> "$log/$name.log" || rc=1
  state=$(sl squeue -h -j "$jid" -t all -o "%T %r" 2>&1)
  cat "$log/job/ppo-$jid.out" >> "$log/$name.log"
  # the epoch the ranks stopped after is the one the third run resumes from
  stopped=$(sed -nE 's/^mpiml-ppo: stopping after epoch ([0-9]+) on request \(SIGUSR2 on rank 0\).*/\1/p' "$log/$name.log")
  [ -n "$stopped" ] && grep -Eq "^mpiml-ppo: resuming from .*step-0*$stopped \(epoch $stopped, saved by 4 ranks\)" "$log/$name.log" || rc=1
  best=$(awk -F'\t' 'NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
    $c["AverageEpRet"] != "nan" && $c["AverageEpRet"] + 0 > b + 0 { b = $c["AverageEpRet"] } END { print b + 0 }' \
    "$out/progress.txt" 2> /dev/null)
  lanes=$(grep -o '"name":"rank [0-9]* ([^)]*)"' "$out/profile/timeline.json" 2> /dev/null | sed 's/.*(\(.*\))"/\1/' | sort | uniq -c | xargs)
  grep -q "DUE TO JOB REQUEUE" "$log/$name.log" && grep -q "^mpiml-ppo: resuming from .* saved by 4 ranks" "$log/$name.log" &&
    grep -q "^Reached AverageEpRet >= 475 in epoch" "$log/$name.log" &&
    awk -v b="${best:-0}" 'BEGIN { exit !(b >= 475) }' && [ "$lanes" = "2 h1 2 h2" ] || rc=1
  settled >> "$log/$name.log" || rc=1
  detail="(job $jid ${state:-gone}; stopped after epoch ${stopped:-none}; best AverageEpRet ${best:-none}, ranks per host ${lanes:-none}, $(secs "$t0") s)"
  }
  again $name "$log/$name.log" sbatch_ppo
  result $name $rc "$detail"
fi

echo "slurm tests: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
