#!/usr/bin/env bash
# Long soak of the randomized differential test (tests/differential.cpp):
# 100,000 operations by default, split over 2, 3 and 4 ranks, with and
# without simulated nodes (MPIML_NODE_SPLIT). Any failure prints the seed and
# the operation; replay it with `test_differential --seed S --first K --ops 1`.
#   scripts/soak.sh [TOTAL_OPS] [SEED]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${MPIML_BUILD_DIR:-$root/build}
total=${1:-100000}
seed=${2:-$(date +%s)}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
cmake --build "$build" --target test_differential -j"$(nproc)" > /dev/null
prog=$build/tests/test_differential
mpirun=$(grep -E "^MPIEXEC_EXECUTABLE:" "$build/CMakeCache.txt" | cut -d= -f2)
configs=("4 0" "4 2" "3 0" "3 2" "2 0" "2 1" "4 3")
per=$((total / ${#configs[@]}))
batch=2000
start=$(date +%s)
for c in "${configs[@]}"; do
  read -r n split <<<"$c"
  for ((first = 0; first < per; first += batch)); do
    ops=$(( per - first < batch ? per - first : batch ))
    MPIML_NODE_SPLIT=$split timeout 900 "$mpirun" -np "$n" "$prog" \
      --seed "$seed" --first "$first" --ops "$ops" | grep -E "^(FAIL|differential)"
  done
done
echo "soak: $((per * ${#configs[@]})) operations, seed $seed, $(( $(date +%s) - start )) s: all equal to the reference"
