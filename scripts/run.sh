#!/usr/bin/env bash
# Installs what is missing, builds mpiml, and runs the main job: data-parallel
# PPO on CartPole-v1 with 2 MPI ranks. Extra arguments go to mpiml-ppo.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/install-deps.sh"
"$root/scripts/build.sh" > "$root/build.log" 2>&1 \
  || { tail -40 "$root/build.log"; exit 1; }
out=${MPIML_OUT:-$root/out/ppo-cartpole}
"$root/build/apps/mpiml-ppo" --cpu 2 --env CartPole-v1 --seed 0 --epochs 30 --out "$out" "$@"
echo
echo "Outputs in $out: progress.txt (per-epoch table), config.json, the trained policy,"
echo "and the learning curve plot. Replay the policy: $root/build/apps/mpiml-ppo --test $out"
