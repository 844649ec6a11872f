#!/usr/bin/env bash
# The many-hosts benchmark: 2 hosts x 2 ranks on scripts/cluster.sh's cluster,
# the inter-host link shaped by tc netem, mpiml's hierarchical allreduce vs
# MPI_Allreduce (bench_cluster, with the phases under the profiler), and
# gradient averaging of a ResNet-50-sized set (bench_shm's gradient part).
#
#   scripts/bench_cluster.sh [build dir]   (default build; writes build/bench-cluster/)
#
# SHAPE (default "netem delay 0.5ms rate 1gbit limit 100000": one-way 0.5 ms,
# 1 Gbit/s per direction) is the qdisc on every host's eth0; a kernel without
# sch_netem gets "tbf rate 1gbit burst 256kb latency 20ms" (rate only, no
# added delay), and the results say which. ROUNDS (3), MAX_MIB (64).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
cl=$root/scripts/cluster.sh
shape=${SHAPE:-netem delay 0.5ms rate 1gbit limit 100000}
out=$build/bench-cluster
mkdir -p "$out"
"$cl" up 2
trap '"$cl" down > /dev/null 2>&1' EXIT INT TERM
if ! "$cl" shape "$shape" 2> "$out/shape.err"; then
  echo "bench_cluster: '$shape' failed ($(head -1 "$out/shape.err")): rate limit only"
  shape="tbf rate 1gbit burst 256kb latency 20ms"
  "$cl" shape "$shape"
fi
{
  echo "# $(date -u '+%Y-%m-%d %H:%M UTC'); $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg); qdisc on each host's eth0: $shape"
  "$cl" run -np 4 --host h1:2,h2:2 -x MPIML_PROFILE="$out/prof" "$build/bench/bench_cluster" \
    --rounds "${ROUNDS:-3}" --max-mib "${MAX_MIB:-64}"
  "$cl" run -np 4 --host h1:2,h2:2 "$build/bench/bench_shm" --rounds "${ROUNDS:-3}" --min-bytes 4 --max-bytes 4 --no-bcast
} 2>&1 | tee "$out/results.txt"
