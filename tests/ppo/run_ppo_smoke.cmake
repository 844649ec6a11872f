# Runs mpiml-ppo for two tiny epochs on NP ranks (through --cpu, i.e.
# mpi_fork), checks every output, then runs --test on the saved policy.
# -DPROG=... -DENV=... -DNP=... -DSTEPS=... -DOUT=... [-DEXPECT_NAN_RETURNS=1]
# [-DTARGET_KL=k: so small that the KL stops the policy updates early]
set(ENV{OMPI_ALLOW_RUN_AS_ROOT} 1)
set(ENV{OMPI_ALLOW_RUN_AS_ROOT_CONFIRM} 1)
file(REMOVE_RECURSE ${OUT})

set(extra)
if(TARGET_KL)
  set(extra --target-kl ${TARGET_KL})
endif()
execute_process(
  COMMAND ${PROG} --env ${ENV} --cpu ${NP} --seed 1 --epochs 2 --steps-per-epoch ${STEPS}
          --train-pi-iters 5 --train-v-iters 5 --out ${OUT} ${extra}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 240)
message("${out}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "mpiml-ppo exited with ${rc}\n${err}")
endif()
foreach(col Epoch AvgEpRet StdEpRet MaxEpRet MinEpRet EpLen VVals TotalEnvInt LossPi LossV
            Entropy KL ClipFrac StopIter Time steps/s)
  if(NOT out MATCHES "${col}")
    message(FATAL_ERROR "the printed table has no column ${col}")
  endif()
endforeach()

foreach(f progress.txt config.json policy.pt learning_curve.svg)
  if(NOT EXISTS ${OUT}/${f})
    message(FATAL_ERROR "missing output ${OUT}/${f}")
  endif()
endforeach()

# progress.txt: Spinning Up's columns, tab-separated, one row per epoch.
file(STRINGS ${OUT}/progress.txt lines)
list(LENGTH lines n)
if(NOT n EQUAL 3)
  message(FATAL_ERROR "progress.txt has ${n} lines, expected a header and 2 rows")
endif()
list(GET lines 0 header)
set(expected "Epoch\tAverageEpRet\tStdEpRet\tMaxEpRet\tMinEpRet\tEpLen\tAverageVVals\tStdVVals\tMaxVVals\tMinVVals\tTotalEnvInteracts\tLossPi\tLossV\tDeltaLossPi\tDeltaLossV\tEntropy\tKL\tClipFrac\tStopIter\tTime")
if(NOT header STREQUAL expected)
  message(FATAL_ERROR "progress.txt header:\n${header}\nexpected:\n${expected}")
endif()
string(REPLACE "\t" ";" cols "${header}")
list(LENGTH cols ncols)
set(early 0)  # rows whose policy updates the KL stopped
foreach(i 1 2)
  list(GET lines ${i} row)
  string(REPLACE "\t" ";" fields "${row}")
  list(LENGTH fields nf)
  if(NOT nf EQUAL ncols)
    message(FATAL_ERROR "progress.txt row ${i} has ${nf} fields, header ${ncols}: ${row}")
  endif()
  foreach(v IN LISTS fields)
    if(NOT v MATCHES "^(-?[0-9]+(\\.[0-9]+)?(e[-+][0-9]+)?|nan)$")
      message(FATAL_ERROR "progress.txt row ${i}: not a number: '${v}'")
    endif()
  endforeach()
  list(GET fields 0 epoch)
  math(EXPR want "${i} - 1")
  if(NOT epoch EQUAL want)
    message(FATAL_ERROR "progress.txt row ${i}: Epoch ${epoch}")
  endif()
  list(GET fields 10 total)
  math(EXPR want "${i} * ${STEPS}")
  if(NOT total EQUAL want)
    message(FATAL_ERROR "progress.txt row ${i}: TotalEnvInteracts ${total}, expected ${want}")
  endif()
  # StopIter below the last iteration (4): the policy updates stopped early,
  # and the console said so, as ppo.py does.
  list(GET fields 18 stop)
  string(REGEX REPLACE "\\.0$" "" stop "${stop}")  # logged as a float
  if(stop LESS 4)
    math(EXPR early "${early} + 1")
    if(NOT out MATCHES "Early stopping at step ${stop} due to reaching max kl.\n")
      message(FATAL_ERROR "StopIter ${stop} in row ${i}, but no \"Early stopping at step ${stop}\" line")
    endif()
  endif()
  list(GET fields 1 avg)
  if(EXPECT_NAN_RETURNS AND NOT avg STREQUAL "nan")
    message(FATAL_ERROR "no episode can end in these epochs, yet AverageEpRet is ${avg}")
  elseif(NOT EXPECT_NAN_RETURNS AND avg STREQUAL "nan")
    message(FATAL_ERROR "AverageEpRet is nan in row ${i}")
  endif()
endforeach()

if(TARGET_KL AND early EQUAL 0)
  message(FATAL_ERROR "no epoch stopped its policy updates early with --target-kl ${TARGET_KL}")
endif()

# config.json
file(READ ${OUT}/config.json cfg)
string(JSON env_name GET "${cfg}" env)
string(JSON num_procs GET "${cfg}" num_procs)
string(JSON hidden GET "${cfg}" ac_kwargs hidden_sizes 1)
string(JSON spe GET "${cfg}" steps_per_epoch)
if(NOT env_name STREQUAL ENV OR NOT num_procs EQUAL NP OR NOT hidden EQUAL 64
   OR NOT spe EQUAL STEPS)
  message(FATAL_ERROR "config.json does not match the run:\n${cfg}")
endif()

file(READ ${OUT}/learning_curve.svg svg)
if(NOT svg MATCHES "^<svg" OR NOT svg MATCHES "</svg>")
  message(FATAL_ERROR "learning_curve.svg is not an SVG document")
endif()

# The saved policy runs.
execute_process(COMMAND ${PROG} --test ${OUT} --episodes 2
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 60)
message("${out}")
if(NOT rc EQUAL 0 OR NOT out MATCHES "Episode 1\t EpRet -?[0-9]")
  message(FATAL_ERROR "--test failed (${rc}):\n${out}\n${err}")
endif()
