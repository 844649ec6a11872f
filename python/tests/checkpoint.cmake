# Checkpoints from Python (numpy, torch state_dicts, RNG states; full disk).
if(TARGET _torch)
  mpiml_add_pytest(NAME pytest_checkpoint FILE tests/test_checkpoint.py RANKS 1 2 3 TIMEOUT 180
                   LABELS checkpoint)
endif()
# A DistributedDataParallel model and a ZeroRedundancyOptimizer on "mpiml".
if(TARGET _c10d)
  mpiml_add_pytest(NAME pytest_checkpoint_ddp FILE tests/test_checkpoint_ddp.py RANKS 2 3 TIMEOUT 180
                   LABELS checkpoint c10d)
endif()
