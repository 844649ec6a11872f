# The torch.distributed backend under ThreadSanitizer (a build with
# MPIML_SANITIZE_THREAD; scripts/test.sh builds only _core and _c10d there).
# /usr/bin/python3 is not instrumented, so every rank preloads the TSan
# runtime (without it, importing an instrumented extension fails: "cannot
# allocate memory in static TLS block") and imports the installed package
# (the fixture python_install installs this build into its install/ first,
# so scripts/test.sh builds every installed target). pytest leaves fd 2 alone (--capture=sys): a report reaches the
# log before halt_on_error ends the rank. A report also fails a case whose
# exit status is not checked. Open MPI's launcher: -x passes LD_PRELOAD to
# the ranks only, not to mpirun.
if(MPIML_SANITIZE_THREAD AND TARGET _c10d AND MPIML_MPI_VENDOR STREQUAL "Open MPI")
  execute_process(COMMAND ${CMAKE_CXX_COMPILER} -print-file-name=libtsan.so
    OUTPUT_VARIABLE _tsan_rt OUTPUT_STRIP_TRAILING_WHITESPACE)
  file(REAL_PATH "${_tsan_rt}" _tsan_rt)
  set(_tsan_env
    "PYTHONPATH=${MPIML_PY_TEST_PATH}" PYTHONDONTWRITEBYTECODE=1 MPIML_TIMEOUT=60
    "MPIML_REPORT_DIR=${CMAKE_CURRENT_BINARY_DIR}/mpiml-reports"
    # Open MPI is not instrumented: no dlclose of its modules (full stacks for the suppressions).
    OMPI_MCA_btl=self,vader OMPI_MCA_mca_base_component_disable_dlclose=1
    "TSAN_OPTIONS=halt_on_error=1:ignore_noninstrumented_modules=1:suppressions=${PROJECT_SOURCE_DIR}/tests/tsan.supp")

  # tsan_c10d_case(NAME n TIMEOUT s [PASS regex] COMMAND args...): 2 ranks.
  function(tsan_c10d_case)
    cmake_parse_arguments(T "" "NAME;TIMEOUT;PASS" "COMMAND" ${ARGN})
    add_test(NAME tsan_${T_NAME}.np2
      COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 ${MPIML_MPIEXEC_FLAGS} -x LD_PRELOAD=${_tsan_rt}
              ${Python_EXECUTABLE} ${T_COMMAND}
      WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}/tests)
    set_tests_properties(tsan_${T_NAME}.np2 PROPERTIES TIMEOUT ${T_TIMEOUT} PROCESSORS 1
      FIXTURES_REQUIRED mpiml_python
      LABELS "mpi;python;c10d;tsan" ENVIRONMENT "${_tsan_env}"
      FAIL_REGULAR_EXPRESSION "WARNING: ThreadSanitizer")
    if(T_PASS)
      set_tests_properties(tsan_${T_NAME}.np2 PROPERTIES PASS_REGULAR_EXPRESSION "${T_PASS}")
    endif()
  endfunction()

  set(_pytest -m pytest -q -p no:cacheprovider --capture=sys)
  # Every collective through the worker queue, async works and futures,
  # subgroups, errors, the check set while operations run.
  tsan_c10d_case(NAME pytest_c10d TIMEOUT 120 COMMAND ${_pytest} test_c10d.py)
  # Future callbacks that issue collectives (PowerSGD, allreduce and fp16 hooks).
  tsan_c10d_case(NAME pytest_c10d_comm_hooks TIMEOUT 120 COMMAND ${_pytest} test_c10d_comm_hooks.py)
  # DDP: the reducer's bucket all_reduces and their futures; ZeroRedundancyOptimizer.
  tsan_c10d_case(NAME pytest_c10d_ddp TIMEOUT 120 COMMAND ${_pytest} test_c10d_ddp.py)
  # Profiler events opened on the worker and closed where the Work completes.
  tsan_c10d_case(NAME pytest_c10d_profiler TIMEOUT 120 COMMAND ${_pytest} test_c10d_profiler.py)
  # Large all_reduces through MPI: the worker's quiet waits and own allreduce.
  tsan_c10d_case(NAME pytest_c10d_large TIMEOUT 300 COMMAND ${_pytest} test_c10d_large.py)
  set_tests_properties(tsan_pytest_c10d_large.np2 PROPERTIES ENVIRONMENT "${_tsan_env};MPIML_SHM=off")
  # The watchdog ends a stalled operation on the worker thread, with the report.
  tsan_c10d_case(NAME c10d_timeout TIMEOUT 90 PASS "${MPIML_C10D_TIMEOUT_REPORT}" COMMAND c10d_timeout.py)
endif()
