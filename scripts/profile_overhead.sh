#!/usr/bin/env bash
# Overhead of mpiml's profiler on mpiml-ppo: the same run (CartPole-v1, 2 ranks,
# same seed) with and without --profile, in interleaved pairs (off/on, then
# on/off, ...), so that drifting machine load hits both sides alike.
#   scripts/profile_overhead.sh [pairs=3]    env: EPOCHS=10, MPIML_PPO=path
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
ppo=${MPIML_PPO:-$root/build/apps/mpiml-ppo}
pairs=${1:-3}
epochs=${EPOCHS:-10}
[ -x "$ppo" ] || { echo "no mpiml-ppo at $ppo (build first, or set MPIML_PPO)" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

TIMEFORMAT="%R %U %S"
run() {  # mode index -> "mode wall user sys"
  local args=(--env CartPole-v1 --cpu 2 --epochs "$epochs" --seed 0 --out "$work/$1-$2")
  [ "$1" = on ] && args+=(--profile "$work/profile-$2")
  local t
  t=$( { time "$ppo" "${args[@]}" > "$work/$1-$2.log" 2>&1; } 2>&1 )
  echo "$1 $t"
}

strip_time() {  # progress.txt without its Time column
  awk -F'\t' 'NR == 1 { for (i = 1; i <= NF; i++) if ($i != "Time") keep[i] = 1 }
               { s = ""; for (i = 1; i <= NF; i++) if (keep[i]) s = s $i "\t"; print s }' "$1"
}

echo "mpiml-ppo CartPole-v1, 2 ranks, $epochs epochs, seed 0; $pairs pairs; $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
results=()
for ((i = 0; i < pairs; i++)); do
  if ((i % 2 == 0)); then order=(off on); else order=(on off); fi
  for m in "${order[@]}"; do
    r=$(run "$m" "$i"); results+=("$r"); echo "  pair $i: $r (wall user sys, s)"
  done
  # Same seed, same results: the profiler must not change the computation.
  if ! cmp -s <(strip_time "$work/off-$i/progress.txt") <(strip_time "$work/on-$i/progress.txt"); then
    echo "  pair $i: progress.txt differs (apart from Time) between the runs" >&2
  fi
done
events=$(grep -c '"ph":"X"' "$work/profile-0/timeline.json" || true)
printf '%s\n' "${results[@]}" | awk -v events="$events" '
  { wall[$1] = wall[$1] " " $2; cpu[$1] = cpu[$1] " " ($3 + $4) }
  function median(s,   a, n, i, j, t) {
    n = split(s, a, " ")
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
  }
  END {
    off = median(wall["off"]); on = median(wall["on"])
    coff = median(cpu["off"]); con = median(cpu["on"])
    printf "median wall: off %.1f s, on %.1f s: %+.2f%%\n", off, on, 100 * (on / off - 1)
    printf "median CPU (user+sys, both ranks): off %.1f s, on %.1f s: %+.2f%%\n", coff, con, 100 * (con / coff - 1)
    printf "events in one profile (all ranks, incl. wait slices): %d\n", events
  }'
