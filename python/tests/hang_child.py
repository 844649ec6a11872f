"""Rank 2 of 3 is late in a function of its own while the others wait in a
collective: the report (tests/run_report_test.sh, run by test_report.py)
names both places.
    hang_child.py hang [L]  the others wait past MPIML_TIMEOUT: report, abort (L late)
    hang_child.py demand S  rank 2 is late S seconds; the job ends with 0
    hang_child.py mismatch  rank 1 passes another count (MPIML_CHECK=1)
"""
import os
import sys
import time

import numpy as np

import mpiml
import mpiml.mpi_tools as mt


def fault_mark():
    """The moment the late rank starts to be late, for the harness's time
    limit (as tests/fault_mark.hpp)."""
    path = os.environ.get("MPIML_FAULT_MARK")
    if path:
        with open(path, "a") as f:
            f.write(f"{time.clock_gettime(time.CLOCK_REALTIME):.9f}\n")


def sleepy_rank_work(s):
    time.sleep(s)  # LATE-LINE


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "hang"
    rank = mt.proc_id()
    mt.mpi_avg(float(rank))  # FIRST-LINE
    if rank == 0:
        print("hang_child: ready", flush=True)  # every rank is set up
    if mode == "mismatch":
        try:
            if rank == 1:
                mt.mpi_sum(np.ones(3))  # MISMATCH-ONE
            else:
                mt.mpi_sum(np.ones(4))  # MISMATCH-OTHERS
        except mpiml.Error as e:
            print(f"rank {rank} caught: {e}", flush=True)
        return
    late = float(sys.argv[2]) if mode == "demand" else 60.0
    if rank == (int(sys.argv[2]) if mode == "hang" and len(sys.argv) > 2 else 2):
        fault_mark()
        sleepy_rank_work(late)
    mt.barrier()  # WAIT-LINE
    if rank == 0:
        print(f"hang_child: {mode} done", flush=True)


main()
