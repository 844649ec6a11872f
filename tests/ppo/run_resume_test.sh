#!/usr/bin/env bash
# mpiml-ppo checkpoints and restarts: a run killed mid-epoch (SIGKILL or
# SIGSEGV on one rank, injected with MPIML_INJECT) and restarted with
# --restarts 1 writes the same progress.txt (every column but Time) and the
# same policy.pt, byte for byte, as a run never interrupted; so does a run
# resumed past a torn newest checkpoint. A checkpoint resumed at another rank
# count continues to the last epoch.
#
#   tests/ppo/run_resume_test.sh path/to/mpiml-ppo OUTDIR [CASE...]
#   CASEs: kill2 segv2 pend2 kill3 torn ranks (default: all)
set -uo pipefail
prog=$1
out=$2
shift 2
cases=${*:-kill2 segv2 stall2 pend2 kill3 torn ranks}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
unset MPIML_INJECT MPIML_ATTEMPT
rm -rf "$out"
mkdir -p "$out"

# Small epochs: 5 x 400 steps, 10 policy and 10 value steps each.
# CartPole-v1 unless the case names another --env.
args=(--seed 3 --steps 400 --train-pi-iters 10 --train-v-iters 10)
failed=0
fail() { echo "FAIL: $*"; failed=1; }

# run NAME [VAR=VALUE...] -- ARGS...: mpiml-ppo into $out/NAME, log in $out/NAME.log.
run() {
  local name=$1; shift
  local envs=()
  while [[ $1 != -- ]]; do envs+=("$1"); shift; done
  shift
  [[ " $* " == *" --env "* ]] || set -- --env CartPole-v1 "$@"
  env "${envs[@]}" timeout 150 "$prog" "${args[@]}" --out "$out/$name" "$@" \
    > "$out/$name.log" 2>&1
  local rc=$?
  if [[ $rc -ne 0 ]]; then
    fail "$name exited with $rc"; tail -30 "$out/$name.log"; return 1
  fi
}

# progress.txt without the Time column.
table() {
  awk -F'\t' 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == "Time") t = i }
              { s = ""; for (i = 1; i <= NF; i++) if (i != t) s = s (s == "" ? "" : "\t") $i; print s }' "$1"
}

# same REF NAME: NAME's outputs equal REF's.
same() {
  local ref=$1 name=$2
  if ! diff <(table "$out/$ref/progress.txt") <(table "$out/$name/progress.txt") > "$out/$name.diff"; then
    fail "$name: progress.txt differs from $ref's (without Time):"; cat "$out/$name.diff"; return
  fi
  local rows
  rows=$(($(wc -l < "$out/$name/progress.txt") - 1))
  if ! cmp -s "$out/$ref/policy.pt" "$out/$name/policy.pt"; then
    fail "$name: policy.pt differs from $ref's"; return
  fi
  echo "ok: $name: $rows rows of progress.txt and policy.pt equal $ref's"
}

# expect NAME REGEX WHAT: NAME's log matches REGEX.
expect() {
  grep -Eq "$2" "$out/$1.log" || fail "$1: $3 (no line matching '$2' in $1.log)"
}

want() { [[ " $cases " == *" $1 "* ]]; }

if want kill2 || want segv2 || want stall2 || want torn || want ranks; then
  run ref2 -- --cpu 2 --epochs 5 || exit 1
fi

# About 45 collectives per epoch (with its checkpoint): the kills and the
# segfault land mid-epoch, in epochs 1 and 2.
# The kill and the stall land at a random collective of epochs 1-3 (the
# number is printed, to replay a failure).
if want kill2; then
  at=$((60 + RANDOM % 90))
  echo "kill2: MPIML_INJECT=kill:1:$at"
  run kill2 MPIML_INJECT=kill:1:$at -- --cpu 2 --epochs 5 --restarts 1 && {
    expect kill2 "MPIML_INJECT: kill" "the kill was not injected"
    expect kill2 "attempt 1 of 2 failed" "no restart line"
    expect kill2 "resuming from .*step-0000000[0-9] \(epoch [0-9]" "the restart did not resume"
    same ref2 kill2
  }
fi

if want segv2; then
  run segv2 MPIML_INJECT=segv:0:110 -- --cpu 2 --epochs 5 --restarts 1 && {
    expect segv2 "MPIML_INJECT: segv" "the segfault was not injected"
    expect segv2 "resuming from .*\(epoch [0-9]" "the restart did not resume"
    same ref2 segv2
  }
fi

# A rank stalls inside a collective: the watchdog (MPIML_TIMEOUT) ends the
# job, and the restart resumes.
if want stall2; then
  at=$((60 + RANDOM % 90))
  echo "stall2: MPIML_INJECT=stall:0:$at"
  run stall2 MPIML_INJECT=stall:0:$at MPIML_TIMEOUT=3 -- --cpu 2 --epochs 5 --restarts 1 && {
    expect stall2 "MPIML_INJECT: stall" "the stall was not injected"
    expect stall2 "watchdog: " "the watchdog did not end the stalled job"
    expect stall2 "resuming from .*\(epoch [0-9]" "the restart did not resume"
    same ref2 stall2
  }
fi

# A Gaussian policy (its log_std is a parameter of the policy's Adam).
if want pend2; then
  run pend_ref -- --env Pendulum-v1 --cpu 2 --epochs 4 &&
  run pend2 MPIML_INJECT=kill:1:100 -- --env Pendulum-v1 --cpu 2 --epochs 4 --restarts 1 && {
    expect pend2 "resuming from .*\(epoch [0-9]" "the restart did not resume"
    same pend_ref pend2
  }
fi

if want kill3; then
  run ref3 -- --cpu 3 --epochs 4 &&
  run kill3 MPIML_INJECT=kill:2:120 -- --cpu 3 --epochs 4 --restarts 1 && {
    expect kill3 "MPIML_INJECT: kill" "the kill was not injected"
    expect kill3 "resuming from .*\(epoch [0-9]" "the restart did not resume"
    same ref3 kill3
  }
fi

# The newest checkpoint torn (a rank's file cut short): resume falls back to
# the one before, with a warning, and still ends like the reference.
if want torn; then
  run torn -- --cpu 2 --epochs 3 && {
    newest=$(ls -d "$out"/torn/checkpoints/step-* | sort | tail -1)
    if [[ $newest != */step-00000002 ]]; then
      fail "torn: the newest checkpoint is $newest, expected step-00000002"
    else
      truncate -s 10 "$newest/rank-00001.bin"
      run torn2 -- --cpu 2 --epochs 5 --resume "$out/torn/checkpoints" && {
        expect torn2 "warning: .*step-00000002 is unusable" "no warning about the torn checkpoint"
        expect torn2 "resuming from .*step-00000001 \(epoch 1," "did not fall back to step 1"
        same ref2 torn2
        # progress.txt of the torn run's folder: --resume auto there cuts it back.
        run torn -- --cpu 2 --epochs 5 --resume auto && {
          expect torn "resuming from .*step-00000001 \(epoch 1," "auto did not fall back to step 1"
          same ref2 torn
        }
      }
    fi
  }
fi

# Another rank count: saved by 2 ranks, continued on 3 (rank 2 starts afresh)
# and on 1.
if want ranks; then
  run ranks3 -- --cpu 2 --epochs 2 &&
  run ranks3 -- --cpu 3 --epochs 4 --resume auto && {
    expect ranks3 "resuming from .*\(epoch 1, saved by 2 ranks\); rank 2 starts" \
      "no resume at 3 ranks"
    rows=$(($(wc -l < "$out/ranks3/progress.txt") - 1))
    [[ $rows -eq 4 ]] || fail "ranks3: progress.txt has $rows rows, expected 4"
    # The two epochs before the checkpoint are the 2-rank run's.
    diff <(table "$out/ref2/progress.txt" | head -3) <(table "$out/ranks3/progress.txt" | head -3) \
      > /dev/null || fail "ranks3: the first two rows differ from the 2-rank run's"
    [[ $failed -eq 0 ]] && echo "ok: ranks3: 2 epochs on 2 ranks, 2 more on 3"
  }
  run ranks1 -- --cpu 1 --epochs 4 --resume "$out/ref2/checkpoints/step-00000002" && {
    expect ranks1 "resuming from .*\(epoch 2, saved by 2 ranks\)" "no resume at 1 rank"
    rows=$(($(wc -l < "$out/ranks1/progress.txt") - 1))
    [[ $rows -eq 4 ]] || fail "ranks1: progress.txt has $rows rows, expected 4"
    [[ $failed -eq 0 ]] && echo "ok: ranks1: a 2-rank checkpoint of epoch 2 continued on 1 rank"
  }
fi

exit $failed
