#!/usr/bin/python3
"""Runs a Spinning Up program, unmodified, with its two MPI modules
(spinup.utils.mpi_tools, spinup.utils.mpi_pytorch) replaced by mpiml's:

    /usr/bin/python3 bench/spinup_shim/mpiml_spinup.py PROGRAM.py [ARGS...]

The shim is the two sys.modules lines below. mpiml's mpi_fork relaunches
this same command line, so every rank runs with the shim too.
"""
import runpy
import sys

import mpiml.mpi_pytorch
import mpiml.mpi_tools

sys.modules["spinup.utils.mpi_tools"] = mpiml.mpi_tools
sys.modules["spinup.utils.mpi_pytorch"] = mpiml.mpi_pytorch

if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")
