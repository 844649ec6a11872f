# bench/bench_overlap.py, small: every variant (GradAverager with and without
# overlap, bucket views, DDP on Gloo and on "mpiml") steps, and the averaged
# models stay bit-identical (else it exits 1 on every rank).
if(TARGET _torch AND TARGET _c10d)
  add_test(NAME bench_overlap_py.smoke
    COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 ${MPIML_MPIEXEC_FLAGS}
            ${Python_EXECUTABLE} ${PROJECT_SOURCE_DIR}/bench/bench_overlap.py
            --layers=2 --width=256 --batch=16 --steps=2)
  set_tests_properties(bench_overlap_py.smoke PROPERTIES TIMEOUT 120
    FIXTURES_REQUIRED mpiml_python PROCESSORS 2 LABELS "mpi;python;bench;overlap"
    FAIL_REGULAR_EXPRESSION "Traceback|bit-identical: NO"
    ENVIRONMENT "PYTHONPATH=${MPIML_PY_TEST_PATH};PYTHONDONTWRITEBYTECODE=1;MPIML_TIMEOUT=60")
endif()

# bench/bench_duplex.py, small: every variant runs and every sum is exact
# (else it exits 1 on every rank).
if(TARGET _torch AND TARGET _c10d)
  add_test(NAME bench_duplex_py.smoke
    COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 ${MPIML_MPIEXEC_FLAGS}
            ${Python_EXECUTABLE} ${PROJECT_SOURCE_DIR}/bench/bench_duplex.py --mib=1 --calls=2 --rounds=1)
  set_tests_properties(bench_duplex_py.smoke PROPERTIES TIMEOUT 120
    FIXTURES_REQUIRED mpiml_python PROCESSORS 2 LABELS "mpi;python;bench"
    FAIL_REGULAR_EXPRESSION "Traceback|exact on every rank: NO"
    ENVIRONMENT "PYTHONPATH=${MPIML_PY_TEST_PATH};PYTHONDONTWRITEBYTECODE=1;MPIML_TIMEOUT=60")
endif()
