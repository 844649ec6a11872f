# pytest suites of the core Python modules (one file per suite).
mpiml_add_pytest(NAME pytest_smoke FILE tests/test_smoke.py RANKS 1 2)
