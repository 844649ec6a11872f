#!/usr/bin/env bash
# GradAverager with overlap against without (bench_overlap, LibTorch) and
# against PyTorch DDP on Gloo and on "mpiml" (bench/bench_overlap.py), on one
# host and across the 2 hosts of scripts/cluster.sh's cluster (1 rank a host),
# the link shaped by SHAPE (default "tbf rate 1gbit burst 256kb latency 20ms");
# then 64 MiB allreduces across the hosts with and without Open MPI's TCP put
# (bench/bench_duplex.py).
#
#   scripts/bench_overlap.sh [build dir]   (default build; writes build/bench-overlap/)
#
# ARGS: the model and run (default "--resnet50 1 --image 112 --batch 16 --steps 6":
# ResNet-50, 25.6 M parameters, 97 MiB of gradients, backward 0.6-0.8 of their
# averaging across the hosts on the test machine, whose speed varies: a larger
# --image lengthens backward; the MLP of the same size:
# "--layers 8 --width 2048 --batch 1024 --steps 6").
# MPIFLAGS: extra mpirun flags for every run (e.g. "--mca mpi_yield_when_idle 1").
# MPIML_CLUSTER_DIR / MPIML_CLUSTER_PREFIX: a cluster of its own next to another.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
cl=$root/scripts/cluster.sh
shape=${SHAPE:-tbf rate 1gbit burst 256kb latency 20ms}
args=${ARGS:---resnet50 1 --image 112 --batch 16 --steps 6}
mpiflags=${MPIFLAGS:-}
pyargs=$(echo "$args" | sed -E 's/--([a-z0-9]+) ([0-9]+)/--\1=\2/g')
py=/usr/bin/python3
export PYTHONPATH=$build/install/lib/python3.11/dist-packages
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
out=$build/bench-overlap
mkdir -p "$out"
{
  echo "# $(date -u '+%Y-%m-%d %H:%M UTC'); $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "## one host, 2 ranks"
  # shellcheck disable=SC2086
  mpirun -np 2 --bind-to none $mpiflags "$build/bench/bench_overlap" $args
  # shellcheck disable=SC2086
  mpirun -np 2 --bind-to none $mpiflags -x PYTHONPATH $py "$root/bench/bench_overlap.py" $pyargs
} 2>&1 | tee "$out/one-host.txt"
"$cl" up 2
trap '"$cl" down > /dev/null 2>&1' EXIT INT TERM
"$cl" shape "$shape"
{
  echo "## 2 hosts x 1 rank; qdisc on each host's eth0: $shape"
  # shellcheck disable=SC2086
  "$cl" run -np 2 --host h1:1,h2:1 --bind-to none $mpiflags "$build/bench/bench_overlap" $args
  # shellcheck disable=SC2086
  "$cl" run -np 2 --host h1:1,h2:1 --bind-to none $mpiflags -x PYTHONPATH -x GLOO_SOCKET_IFNAME=eth0 \
    $py "$root/bench/bench_overlap.py" $pyargs
  # Both directions at once: put off (mpiml's default) against Open MPI's TCP put.
  for flags in "" "--mca btl_tcp_flags send,put,inplace,need-ack,need-csum,hetero-rdma"; do
    # shellcheck disable=SC2086
    "$cl" run -np 2 --host h1:1,h2:1 --bind-to none $mpiflags $flags -x PYTHONPATH -x GLOO_SOCKET_IFNAME=eth0 \
      $py "$root/bench/bench_duplex.py"
  done
} 2>&1 | tee "$out/two-hosts.txt"
