#!/usr/bin/env bash
# Every MPIML_* variable is validated at initialization: a bad value stops the
# first mpiml call with an error naming the variable; the boolean words are
# the same everywhere. Runs the public-API program alone (one rank).
set -u
prog=$1
fails=0
bad() {  # VAR=value  expected-text
  local out rc
  out=$(env "$1" timeout 60 "$prog" 2>&1 >/dev/null); rc=$?
  if [ $rc -eq 0 ] || ! grep -q -- "$2" <<<"$out"; then
    echo "FAIL: $1: exit $rc, output: $out"; fails=$((fails + 1))
  fi
}
good() {  # VAR=value...
  local out rc
  out=$(env "$@" timeout 60 "$prog" 2>&1); rc=$?
  if [ $rc -ne 0 ]; then echo "FAIL: $*: exit $rc, output: $out"; fails=$((fails + 1)); fi
}
bad MPIML_CHECK=maybe "MPIML_CHECK='maybe' is not a boolean"
bad MPIML_TIMEOUT=soon "MPIML_TIMEOUT='soon' is not a number of seconds"
bad MPIML_TIMEOUT=-1 "MPIML_TIMEOUT='-1'"
bad MPIML_STALL_WARNING=1m "MPIML_STALL_WARNING='1m' is not a number of seconds"
bad MPIML_SHM=sometimes "MPIML_SHM='sometimes' must be auto, or a boolean"
bad MPIML_SHM_THRESHOLD=12Q "MPIML_SHM_THRESHOLD='12Q' is not a byte count"
bad MPIML_SHM_BCAST_THRESHOLD=-5 "MPIML_SHM_BCAST_THRESHOLD='-5' is not a byte count"
bad MPIML_SHM_CHUNK=1K "MPIML_SHM_CHUNK='1K' must be between"
bad MPIML_SHM_CHUNK=99999999999999999999 "MPIML_SHM_CHUNK='99999999999999999999' is too large"
bad MPIML_NODE_SPLIT=two "MPIML_NODE_SPLIT='two' must be a number"
bad MPIML_PROFILE_CLOCK=sundial "MPIML_PROFILE_CLOCK='sundial' must be auto or measure"
for w in 1 on true yes YES 0 off false no; do good MPIML_CHECK=$w MPIML_SHM=$w; done
good MPIML_SHM=auto MPIML_SHM_THRESHOLD=64K MPIML_SHM_BCAST_THRESHOLD=1MiB MPIML_SHM_CHUNK=4M MPIML_NODE_SPLIT=1 MPIML_TIMEOUT=2.5 MPIML_STALL_WARNING=0 MPIML_PROFILE_CLOCK=measure
if [ $fails -eq 0 ]; then echo "config: all cases passed"; exit 0; fi
exit 1
