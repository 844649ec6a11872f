# Checkpoints from Python (numpy, torch state_dicts, RNG states; full disk).
if(TARGET _torch)
  mpiml_add_pytest(NAME pytest_checkpoint FILE tests/test_checkpoint.py RANKS 1 2 3 TIMEOUT 180
                   LABELS checkpoint)
endif()
