#!/usr/bin/env bash
# The learning check: PPO on CartPole-v1 must reach AverageEpRet >= 475 in
# some epoch within 60 epochs, with 1 and with 2 ranks, for seeds 0, 1, 2.
# Each run stops at the first such epoch (--stop-at-return).
#
#   scripts/check_learning.sh [path/to/mpiml-ppo] [output folder]
#   (defaults: build/apps/mpiml-ppo and build/check_learning in the repository)
#
# Environment: RANKS ("1 2"), SEEDS ("0 1 2"), EPOCHS (60), TARGET (475).
# Prints one line per run and a summary; exits 1 if any run failed to learn.
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
prog=${1:-$root/build/apps/mpiml-ppo}
out=${2:-$root/build/check_learning}
ranks=${RANKS:-1 2}
seeds=${SEEDS:-0 1 2}
epochs=${EPOCHS:-60}
target=${TARGET:-475}

if [[ ! -x $prog ]]; then
  echo "check_learning: no executable at $prog (build first, or pass its path)" >&2
  exit 2
fi
mkdir -p "$out"
summary="$out/summary.tsv"
printf 'ranks\tseed\tresult\tepoch\tAverageEpRet\twall_s\tenv_steps\tsteps_per_s\n' > "$summary"

failed=0
start_all=$(date +%s%N)
for np in $ranks; do
  for seed in $seeds; do
    dir="$out/np$np-s$seed"
    rm -rf "$dir"
    t0=$(date +%s%N)
    "$prog" --env CartPole-v1 --cpu "$np" --seed "$seed" --epochs "$epochs" \
      --stop-at-return "$target" --out "$dir" > "$dir.log" 2>&1
    rc=$?
    ms=$(( ($(date +%s%N) - t0) / 1000000 ))
    # First epoch with AverageEpRet >= target, from progress.txt.
    read -r epoch ret steps < <(awk -F'\t' -v target="$target" '
      NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
      { r = $col["AverageEpRet"]; last = $col["TotalEnvInteracts"] }
      r != "nan" && (best == "" || r + 0 > best + 0) { best = r }
      r != "nan" && r + 0 >= target { print $col["Epoch"], r, last; hit = 1; exit }
      END { if (!hit) print "-", (best == "" ? "nan" : best), (last == "" ? 0 : last) }' \
      "$dir/progress.txt" 2>/dev/null)
    if [[ $rc -ne 0 ]]; then
      result=error
    elif [[ ${epoch:--} == - ]]; then
      result=FAIL
    else
      result=ok
    fi
    [[ $result == ok ]] || failed=1
    printf '%s\t%s\t%s\t%s\t%s\t%d.%01d\t%s\t%d\n' "$np" "$seed" "$result" "${epoch:--}" \
      "${ret:--}" $((ms / 1000)) $((ms % 1000 / 100)) "${steps:-0}" \
      $(( ${steps:-0} * 1000 / (ms > 0 ? ms : 1) )) | tee -a "$summary"
    if [[ $result == error ]]; then tail -20 "$dir.log" >&2; fi
  done
done
total=$(( ($(date +%s%N) - start_all) / 1000000000 ))
printf 'check_learning: %s in %d s (target AverageEpRet >= %s within %s epochs)\n' \
  "$([[ $failed == 0 ]] && echo passed || echo FAILED)" "$total" "$target" "$epochs"
exit $failed
