# Python profiles (cProfile per rank): launches its own 3-rank jobs, so one rank.
mpiml_add_pytest(NAME pytest_pyprofile FILE tests/test_pyprofile.py RANKS 1 TIMEOUT 240)
