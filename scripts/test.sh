#!/usr/bin/env bash
# Installs what is missing, builds mpiml and passes all its tests:
# unit and multi-rank tests, the fault-injection suite, an installed-package
# consumer, the tests again against MPICH, the tests across network-namespace
# hosts and under Slurm, the unit tests under AddressSanitizer + UBSan, the
# threaded parts (watchdog, profiler, overlap, the torch.distributed
# backend's tests) under ThreadSanitizer, and PPO's learning check.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root" || exit 1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
passed=0 failed=0
# Each stage header gives the time since the start: where a slow CI run spent it.
stage() { printf '\n==== %s (at %dm%02ds)\n' "$*" $((SECONDS / 60)) $((SECONDS % 60)); }
count() {  # add a ctest log's totals
  local line
  line=$(grep -E "tests passed, [0-9]+ tests failed out of [0-9]+" "$1" | tail -1)
  if [ -z "$line" ]; then failed=$((failed + 1)); return; fi
  local total fail
  total=$(sed -E 's/.*out of ([0-9]+).*/\1/' <<<"$line")
  fail=$(sed -E 's/.* ([0-9]+) tests failed.*/\1/' <<<"$line")
  passed=$((passed + total - fail)); failed=$((failed + fail))
}
run_ctest() {  # log-name ctest-args...
  local log=$root/build/ctest-$1.log; shift
  ctest --test-dir "$root/build" --output-on-failure "$@" 2>&1 | tee "$log" | grep -vE "^\s*(Start|[0-9]+/[0-9]+ Test)" | tail -40
  count "$log"
}

stage "dependencies"
"$root/scripts/install-deps.sh" || exit 1

stage "build"
"$root/scripts/build.sh" || exit 1

# The MPICH, ASan + UBSan and TSan builds: configure and build, logs beside
# the build directory.
mpich=$root/build-mpich asan=$root/build-asan tsan=$root/build-tsan
build_mpich() {
  cmake -S "$root" -B "$mpich" -DMPIML_WITH_TORCH=OFF -DMPIML_WITH_PYTHON=OFF -DMPIML_BUILD_APPS=OFF -DMPIML_BUILD_BENCH=OFF \
    -DMPI_CXX_COMPILER=mpicxx.mpich -DMPIEXEC_EXECUTABLE=/usr/bin/mpiexec.mpich > "$mpich-configure.log" 2>&1 &&
    cmake --build "$mpich" -j"$(nproc)" > "$mpich-build.log" 2>&1
}
build_asan() {
  cmake -S "$root" -B "$asan" -DCMAKE_BUILD_TYPE=Debug -DMPIML_SANITIZE=ON -DMPIML_WITH_TORCH=OFF -DMPIML_WITH_PYTHON=OFF \
    -DMPIML_BUILD_APPS=OFF -DMPIML_BUILD_BENCH=OFF > "$asan-configure.log" 2>&1 &&
    cmake --build "$asan" -j"$(nproc)" --target test_core test_stats test_errors test_profile test_checkpoint test_shm \
      profile_env_child check_profile > "$asan-build.log" 2>&1
}
# LibTorch and Python are not instrumented (ignored as Open MPI is); mpiml,
# mpiml::torch and the extensions are (python/tests/tsan.cmake); the pytest
# cases import the package installed from this build, so all that is installed is built.
build_tsan() {
  cmake -S "$root" -B "$tsan" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMPIML_SANITIZE_THREAD=ON -DMPIML_WITH_TORCH=ON \
    -DMPIML_WITH_PYTHON=ON -DMPIML_BUILD_APPS=OFF -DMPIML_BUILD_BENCH=OFF > "$tsan-configure.log" 2>&1 &&
    cmake --build "$tsan" -j"$(nproc)" --target test_watchdog test_profile test_torch_overlap test_worker_queue \
      _core _c10d _torch mpiml-run mpiml-report > "$tsan-build.log" 2>&1
}
# They run one after the other while the other stages run, in the idle
# scheduling class (chrt --idle): on the CPU time the tests leave, at some
# cost to the tests' speed (caches, memory), none to their priority. Each
# writes its status to <dir>.status; a stage waits for its build.
# Last, the MPICH build again with the Python package and the LibTorch layer
# (not their C++ tests): only what they add is built, in the same tree, so it
# waits until the stage that runs that tree's tests is done with it
# (<dir>.tested); reconfiguring it earlier would add tests that are not built
# yet to that stage and relink what it runs.
mpich_py=$root/build-mpich-python
build_mpich_py() {
  while [ ! -f "$mpich.tested" ]; do kill -0 $$ 2> /dev/null || return 1; sleep 2; done
  cmake -S "$root" -B "$mpich" -DMPIML_WITH_TORCH=ON -DMPIML_WITH_PYTHON=ON -DMPIML_BUILD_TORCH_TESTS=OFF \
    > "$mpich_py-configure.log" 2>&1 &&
    cmake --build "$mpich" -j"$(nproc)" > "$mpich_py-build.log" 2>&1
}
rm -f "$mpich.status" "$mpich.tested" "$asan.status" "$tsan.status" "$mpich_py.status"
(
  chrt --idle -p 0 "$BASHPID" > /dev/null 2>&1 || echo "chrt --idle failed: the builds run beside the tests at normal priority"
  for b in mpich asan tsan mpich_py; do
    "build_$b"; echo $? > "${!b}.status"
  done
) &
builds=$!
built() {  # dir: waits for its background build; true if it succeeded
  while [ ! -f "$1.status" ] && kill -0 "$builds" 2> /dev/null; do sleep 2; done
  [ "$(cat "$1.status" 2> /dev/null)" = 0 ]
}

stage "unit and multi-rank tests"
run_ctest main -LE "fault|learning" -j2 --timeout 600
stage "fault-injection suite (two jobs at a time; each case has a deadline, met at half of it or less)"
run_ctest fault -L fault -j2

stage "installed package consumer"
prefix=$(mktemp -d)
if cmake --install "$root/build" --prefix "$prefix" > "$root/build/install.log" 2>&1 &&
   cmake -S tests/consumer -B "$root/build/consumer" -DCMAKE_PREFIX_PATH="$prefix" \
     -DREQUIRE_TORCH_TARGET="$(grep -q 'building mpiml::torch' "$root/build-configure.log" && echo ON || echo OFF)" \
     > "$root/build/consumer.log" 2>&1 &&
   cmake --build "$root/build/consumer" >> "$root/build/consumer.log" 2>&1 &&
   timeout 60 mpirun -np 2 "$root/build/consumer/consumer" | tee -a "$root/build/consumer.log" | grep -q "consumer: ok"; then
  echo "consumer: built against $prefix and ran on 2 ranks: ok"; passed=$((passed + 1))
else
  echo "consumer: FAILED"; cat "$root/build/install.log" "$root/build/consumer.log" | tail -30; failed=$((failed + 1))
fi
rm -rf "$prefix"

stage "all tests but LibTorch's against MPICH"
if built "$mpich"; then
  for part in "main:-LE fault -j2 --timeout 600" "fault:-L fault -j2"; do
    log=$mpich/ctest-${part%%:*}.log
    part=${part#*:}
    # shellcheck disable=SC2086
    ctest --test-dir "$mpich" --output-on-failure $part 2>&1 | tee "$log" | grep -vE "^\s*(Start|[0-9]+/[0-9]+ Test)" | tail -12
    count "$log"
  done
else
  echo "MPICH build FAILED"; tail -30 "$mpich-configure.log" "$mpich-build.log"; failed=$((failed + 1))
fi
touch "$mpich.tested"

# A test script's "<what>: P passed, F failed" line; skipped (no root or no ip
# netns) counts as neither passed nor failed, and says so.
run_script() {  # what log script args...
  local what=$1 log=$2 line
  shift 2
  "$@" 2>&1 | tee "$log"
  line=$(grep -E "^$what: [0-9]+ passed, [0-9]+ failed" "$log" | tail -1)
  if [ -n "$line" ]; then
    passed=$((passed + $(awk '{print $3}' <<<"$line"))); failed=$((failed + $(awk '{print $5}' <<<"$line")))
  elif ! grep -q "$what: SKIPPED" "$log"; then
    failed=$((failed + 1))
  fi
}
stage "many hosts: 2 and 3 network-namespace hosts over TCP (scripts/cluster_tests.sh, docs/CLUSTER.md)"
run_script "cluster tests" "$root/build/cluster-tests.log" "$root/scripts/cluster_tests.sh" "$root/build"
stage "Slurm on the namespace hosts: srun, sbatch, faults, requeue (scripts/slurm_tests.sh, docs/CLUSTER.md)"
run_script "slurm tests" "$root/build/slurm-tests.log" "$root/scripts/slurm_tests.sh" "$root/build"

stage "unit tests under AddressSanitizer + UndefinedBehaviorSanitizer"
if built "$asan"; then
  # Full stacks (the MPI libraries have no frame pointers) and loaded MCA
  # components, so that the suppressions can tell the MPI runtime's
  # allocations from mpiml's.
  export OMPI_MCA_mca_base_component_disable_dlclose=1
  export ASAN_OPTIONS=detect_leaks=1:fast_unwind_on_malloc=0:abort_on_error=1
  export LSAN_OPTIONS=suppressions=$root/tests/lsan.supp:print_suppressions=0:fast_unwind_on_malloc=0
  export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  log=$asan/ctest.log
  ctest --test-dir "$asan" --output-on-failure -R "^test_(core|stats|errors|profile|checkpoint|shm\.np)" -j2 2>&1 | tee "$log" | tail -8
  count "$log"
else
  echo "sanitizer build FAILED"; tail -30 "$asan-configure.log" "$asan-build.log"; failed=$((failed + 1))
fi

stage "watchdog, profiler, GradAverager's overlap and the torch.distributed backend (its pytest cases) under ThreadSanitizer"
if built "$tsan"; then
  # Open MPI is not built with TSan: its modules are ignored, its own locking suppressed.
  log=$tsan/ctest.log
  OMPI_MCA_btl=self,vader OMPI_MCA_mca_base_component_disable_dlclose=1 \
  TSAN_OPTIONS="halt_on_error=1 ignore_noninstrumented_modules=1 suppressions=$root/tests/tsan.supp" \
    ctest --test-dir "$tsan" --output-on-failure -R "^(test_(watchdog|profile|torch_overlap(_shmoff)?|worker_queue)|tsan_.*)\.np" -j2 2>&1 | tee "$log" | tail -6
  count "$log"
else
  echo "ThreadSanitizer build FAILED"; tail -30 "$tsan-configure.log" "$tsan-build.log"; failed=$((failed + 1))
fi

# Debian's mpi4py is built for Open MPI: the suites that compare with it run
# with Open MPI only (test_jobs.py skips its mpi4py cases here).
stage "the Python package against MPICH: the backend, overlap, checkpoints, jobs under Hydra (failures, signals, mpi_fork), a second MPI library"
if built "$mpich_py"; then
  log=$mpich/ctest-python.log
  ctest --test-dir "$mpich" --output-on-failure -L python -j2 \
    -R '^(pytest_(smoke|c10d|c10d_ddp|c10d_comm_hooks|c10d_profiler|overlap|checkpoint|checkpoint_ddp)\.np2|c10d_timeout\.np2|pytest_(one_mpi|jobs|pyprofile)\.np1)$' \
    2>&1 | tee "$log" | grep -vE "^\s*(Start|[0-9]+/[0-9]+ Test)" | tail -8
  count "$log"
else
  echo "MPICH build with Python FAILED"; tail -30 "$mpich_py-configure.log" "$mpich_py-build.log"; failed=$((failed + 1))
fi

if [ "${MPIML_LEARNING_CHECK:-1}" = 1 ] && [ -x "$root/scripts/check_learning.sh" ]; then
  stage "PPO learning check"
  if "$root/scripts/check_learning.sh"; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
fi

# The output of every failed test, last: CI shows the end of the run.
failed_output() {  # ctest-log: each failed test's last 60 lines
  awk '/^ *[0-9]+\/[0-9]+ Test +#[0-9]+:/ { if (name != "") flush(); name = ""; if ($0 ~ /\*\*\*|Failed/) { name = $0; n = 0 } next }
       /^ *Start +[0-9]+:|^[0-9]+% tests passed/ { if (name != "") flush(); name = ""; next }
       name != "" { buf[n++] = $0 }
       function flush(  i) { print "---- " name; for (i = (n > 60 ? n - 60 : 0); i < n; i++) print buf[i] }
       END { if (name != "") flush() }' "$1"
}
if [ "$failed" -gt 0 ]; then
  stage "output of the failed tests"
  for log in "$root"/build/ctest-*.log "$root"/build-mpich/ctest-*.log "$root"/build-asan/ctest.log "$root"/build-tsan/ctest.log; do
    [ -f "$log" ] && grep -q "tests FAILED" "$log" && failed_output "$log"
  done
  # the cluster and Slurm scripts name each failed case's log
  sed -n 's/^  FAIL .*(log: \(.*\))$/\1/p' "$root"/build/cluster-tests.log "$root"/build/slurm-tests.log 2> /dev/null |
    while IFS= read -r f; do
      echo "---- $f (last 60 lines)"
      tail -n 60 "$f" 2> /dev/null
    done
fi

echo
echo "mpiml: $passed passed, $failed failed (in $((SECONDS / 60)) min $((SECONDS % 60)) s)"
[ "$failed" -eq 0 ]
