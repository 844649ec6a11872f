# The resumable examples (examples/ppo_resume.py under mpi_fork's restarts,
# examples/ddp_resume.py under mpiml-run): restarted after a fault injected
# mid-run, they end bit for bit as uninterrupted runs. Launches its own jobs:
# one rank.
if(TARGET _torch AND TARGET _c10d)
  mpiml_add_pytest(NAME pytest_examples_resume FILE tests/test_examples_resume.py RANKS 1
                   TIMEOUT 600 LABELS examples checkpoint fault
                   ENV MPIML_RUN=$<TARGET_FILE:mpiml-run>)
  set_tests_properties(pytest_examples_resume.np1 PROPERTIES COST 500)  # a minute: started early
endif()
