# pytest suites of the core Python modules (one file per suite).
mpiml_add_pytest(NAME pytest_smoke FILE tests/test_smoke.py RANKS 1 2)
mpiml_add_pytest(NAME pytest_mpi_tools FILE tests/test_mpi_tools.py RANKS 1 2 3 TIMEOUT 120)
mpiml_add_pytest(NAME pytest_mpi_pytorch FILE tests/test_mpi_pytorch.py RANKS 1 2 3 TIMEOUT 120)
# Launches its own jobs with the build's launcher (failures, signals, import
# orders, mpi_fork), Hydra too: one rank. The cases with mpi4py skip where it
# uses another MPI (Debian's is built for Open MPI).
set(_jobs_env MPIML_RUN=$<TARGET_FILE:mpiml-run>)
if(TARGET mpiml-ppo)
  list(APPEND _jobs_env MPIML_PPO=$<TARGET_FILE:mpiml-ppo>)
endif()
mpiml_add_pytest(NAME pytest_jobs FILE tests/test_jobs.py RANKS 1 TIMEOUT 600 ENV ${_jobs_env})
# The longest case (minutes): ctest, which has no timings on a fresh build,
# starts the cases of highest COST first, so that this one does not end the run alone.
set_tests_properties(pytest_jobs.np1 PROPERTIES COST 1000)
# GradAverager(overlap=True): equivalence and bit-identity (communication thread).
mpiml_add_pytest(NAME pytest_overlap FILE tests/test_overlap.py RANKS 2 3 TIMEOUT 120)
# Two MPI libraries in one process (an mpi4py built for another MPI): refused.
mpiml_add_pytest(NAME pytest_one_mpi FILE tests/test_one_mpi.py RANKS 1 TIMEOUT 120)
