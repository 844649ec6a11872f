# Where every rank is (report on a hang, on demand, mismatch call sites):
# launches its own 3-rank jobs, so one rank.
mpiml_add_pytest(NAME pytest_report FILE tests/test_report.py RANKS 1 TIMEOUT 180
  ENV "MPIML_REPORT_TOOL=$<TARGET_FILE:mpiml-report>")
set_tests_properties(pytest_report.np1 PROPERTIES COST 500)  # a minute: started early
