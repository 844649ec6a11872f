"""A rank that never joins a collective: the watchdog ends the job within the
timeout given to init_process_group, naming the operation (run by ctest, which
expects the job to fail with that message)."""
import datetime
import time

import numpy as np
import torch
import torch.distributed as dist

import mpiml.mpi_tools as mt
import mpiml.torch

mt.mpi_sum(np.zeros(1))  # no deadline: ranks that import slowly under load line up first
mpiml.torch.init_process_group(timeout=datetime.timedelta(seconds=2))
mt.mpi_sum(np.zeros(1))  # again: init may end seconds apart under a sanitizer
t = torch.ones(8)
dist.all_reduce(t)
if dist.get_rank() == 1:
    time.sleep(60)  # never arrives
dist.all_reduce(t)
print("not reached")
