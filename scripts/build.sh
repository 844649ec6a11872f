#!/usr/bin/env bash
# Configures and builds mpiml into build/ (or $MPIML_BUILD_DIR).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${MPIML_BUILD_DIR:-$root/build}
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=${MPIML_BUILD_TYPE:-RelWithDebInfo} \
  -DMPIML_WITH_TORCH=ON -DMPIML_BUILD_TESTS=ON -DMPIML_BUILD_APPS=ON -DMPIML_BUILD_BENCH=ON "$@" > "$build-configure.log" 2>&1 \
  || { cat "$build-configure.log"; exit 1; }
grep -E "^-- mpiml:" "$build-configure.log" || true
cmake --build "$build" -j"$(nproc)"
