# mpiml-ppo --algo vpg: two tiny epochs on 1 rank; progress.txt has Spinning
# Up's VPG columns (no ClipFrac, no StopIter), the policy replays with --test.
# -DPROG=... -DOUT=...
file(REMOVE_RECURSE ${OUT})
execute_process(
  COMMAND ${PROG} --algo vpg --env CartPole-v1 --seed 1 --epochs 2 --steps-per-epoch 400
          --train-v-iters 5 --out ${OUT}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 120)
message("${out}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "mpiml-ppo --algo vpg exited with ${rc}\n${err}")
endif()
file(STRINGS ${OUT}/progress.txt lines)
list(LENGTH lines n)
if(NOT n EQUAL 3)
  message(FATAL_ERROR "progress.txt has ${n} lines, expected a header and 2 rows")
endif()
list(GET lines 0 header)
set(expected "Epoch\tAverageEpRet\tStdEpRet\tMaxEpRet\tMinEpRet\tEpLen\tAverageVVals\tStdVVals\tMaxVVals\tMinVVals\tTotalEnvInteracts\tLossPi\tLossV\tDeltaLossPi\tDeltaLossV\tEntropy\tKL\tTime")
if(NOT header STREQUAL expected)
  message(FATAL_ERROR "progress.txt header:\n${header}\nexpected:\n${expected}")
endif()
file(READ ${OUT}/config.json cfg)
if(NOT cfg MATCHES "\"algo\": \"vpg\"")
  message(FATAL_ERROR "config.json does not record algo vpg")
endif()
execute_process(COMMAND ${PROG} --test ${OUT} --episodes 2
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 60)
if(NOT rc EQUAL 0 OR NOT out MATCHES "AverageEpRet")
  message(FATAL_ERROR "--test on the VPG policy failed (${rc}):\n${out}\n${err}")
endif()
