# The torch.distributed backend "mpiml" (mpiml._c10d, mpiml.torch).
if(TARGET _c10d)
  mpiml_add_pytest(NAME pytest_c10d FILE tests/test_c10d.py RANKS 2 3 TIMEOUT 240 LABELS c10d)
  mpiml_add_pytest(NAME pytest_c10d_ddp FILE tests/test_c10d_ddp.py RANKS 2 3 TIMEOUT 240 LABELS c10d)
  # DDP comm hooks (allreduce, fp16, PowerSGD) on "mpiml" vs Gloo. PowerSGD's
  # future callbacks issue collectives and wait for them: run on the group's
  # only worker thread, they hung it (ended by TIMEOUT; no op was in flight
  # for the watchdog to see).
  mpiml_add_pytest(NAME pytest_c10d_comm_hooks FILE tests/test_c10d_comm_hooks.py RANKS 2 3
                   TIMEOUT 120 LABELS c10d)

  # torch.profiler: "mpiml:<op>" events with input shapes, a DDP step's trace.
  mpiml_add_pytest(NAME pytest_c10d_profiler FILE tests/test_c10d_profiler.py RANKS 2 3
                   TIMEOUT 120 LABELS c10d)

  # A rank that never arrives: the watchdog must end the job naming the op,
  # after the report of where every rank is (docs/DEBUGGING.md): rank 0 in
  # the operation, rank 1 outside any, at its line of the program.
  # The expected report (the ThreadSanitizer case in tsan.cmake expects it too):
  set(MPIML_C10D_TIMEOUT_REPORT "report: where every rank is \\(2 ranks\\) - watchdog: mpiml c10d all_reduce waited [0-9.]+ s, past the timeout of 2 s.*==== rank 0/2 [^\n]*: in allreduce #[0-9]+ \\(mpiml c10d all_reduce.*==== rank 1/2 [^\n]*: not in a collective.*c10d_timeout.py., line 20 in <module>.*end of report")
  add_test(NAME c10d_timeout.np2
    COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 ${MPIML_MPIEXEC_FLAGS}
            ${Python_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/tests/c10d_timeout.py)
  set_tests_properties(c10d_timeout.np2 PROPERTIES TIMEOUT 60
    FIXTURES_REQUIRED mpiml_python PROCESSORS 1 LABELS "mpi;python;c10d"
    PASS_REGULAR_EXPRESSION "${MPIML_C10D_TIMEOUT_REPORT}"
    ENVIRONMENT "PYTHONPATH=${MPIML_PY_TEST_PATH};PYTHONDONTWRITEBYTECODE=1;MPIML_REPORT_DIR=${CMAKE_CURRENT_BINARY_DIR}/mpiml-reports")

  # MPI initialized (by mpi4py) below MPI_THREAD_MULTIPLE: a clear error.
  add_test(NAME c10d_thread_level.np2
    COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 ${MPIML_MPIEXEC_FLAGS}
            ${Python_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/tests/c10d_thread_level.py)
  set_tests_properties(c10d_thread_level.np2 PROPERTIES TIMEOUT 60
    FIXTURES_REQUIRED mpiml_python PROCESSORS 1 LABELS "mpi;python;c10d"
    PASS_REGULAR_EXPRESSION "clear error: mpiml c10d init on rank 0/2: MPI was initialized with MPI_THREAD_SERIALIZED"
    FAIL_REGULAR_EXPRESSION "Traceback|no error"
    ENVIRONMENT "PYTHONPATH=${MPIML_PY_TEST_PATH};PYTHONDONTWRITEBYTECODE=1;MPIML_TIMEOUT=30")
endif()

# PyTorch's own distributed suite (CPU collectives and DDP) on "mpiml".
if(TARGET _c10d)
  mpiml_add_pytest(NAME pytest_c10d_torch_suite FILE tests/test_c10d_torch_suite.py RANKS 2 3
                   TIMEOUT 300 LABELS c10d ENV BACKEND=mpiml)
endif()

# Large allreduces through MPI: the worker's quiet waits and own allreduce.
if(TARGET _c10d)
  mpiml_add_pytest(NAME pytest_c10d_large FILE tests/test_c10d_large.py RANKS 2 3 TIMEOUT 120
                   LABELS c10d ENV MPIML_SHM=off)
endif()
