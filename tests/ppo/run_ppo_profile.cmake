# mpiml-ppo --profile: two tiny epochs on 2 ranks, then the profile's files
# and regions, with the collectives inside them, checked by check_profile.
# -DPROG=... -DCHECK=... -DOUT=...
set(ENV{OMPI_ALLOW_RUN_AS_ROOT} 1)
set(ENV{OMPI_ALLOW_RUN_AS_ROOT_CONFIRM} 1)
file(REMOVE_RECURSE ${OUT})
execute_process(
  COMMAND ${PROG} --env CartPole-v1 --cpu 2 --seed 1 --epochs 2 --steps-per-epoch 400
          --train-pi-iters 5 --train-v-iters 5 --out ${OUT} --profile ${OUT}/profile
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 240)
message("${out}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "mpiml-ppo exited with ${rc}\n${err}")
endif()
if(NOT out MATCHES "mpiml profile: 2 ranks")
  message(FATAL_ERROR "rank 0 printed no profile summary")
endif()
execute_process(
  COMMAND ${CHECK} ${OUT}/profile 2 epoch rollout advantage update policy_update value_update
          logging sync_params
          --inside rollout:advantage --inside advantage:allgather
          --inside policy_update:allreduce --inside value_update:allreduce
  RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "check_profile failed")
endif()
