#!/usr/bin/env bash
# Installs what mpiml needs from Debian's packages (only what is missing).
# Open MPI is the default MPI; MPICH is installed beside it for the tests.
set -euo pipefail
pkgs=(build-essential cmake ccache pkg-config bc
      libopenmpi-dev openmpi-bin mpich libmpich-dev
      libtorch-dev libgtest-dev libgmock-dev libbenchmark-dev
      libfmt-dev libcli11-dev nlohmann-json3-dev
      python3-dev pybind11-dev python3-pybind11 python3-numpy python3-torch
      python3-pytest python3-mpi4py
      python3-scipy python3-joblib  # scipy, joblib: Spinning Up's PPO (bench/spinup_shim)
      libblas-dev libopenblas0-pthread)  # cblas.h; OpenBLAS takes over libblas.so.3 (README: BLAS)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all packages present"
  exit 0
fi
sudo=""
[ "$(id -u)" -eq 0 ] || sudo=sudo
echo "install-deps: installing ${missing[*]}"
$sudo apt-get update -q
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
