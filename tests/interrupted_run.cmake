# A run stopped part-way leaves the epochs it finished: chapter 05, one process, killed
# (SIGKILL: no handler, no destructor, nothing flushed at exit) in its second epoch, must leave
# in --out a CSV with the header and epoch 1's row, and a JSON that parses, holds the settings
# and that one epoch, and says the run did not finish.
#   cmake -DPROGRAM=<05_multi_process> -DOUT=<dir> -P interrupted_run.cmake
foreach(var PROGRAM OUT)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "interrupted_run.cmake: -D${var}=... is required")
  endif()
endforeach()
file(REMOVE_RECURSE "${OUT}")
# 512 images in batches of 64: 8 steps an epoch, so step 10 is in epoch 2.
execute_process(COMMAND ${PROGRAM} --epochs 3 --limit-train 512 --batch-size 64 --profile-steps 0 --progress off
                        --fail-rank 0 --fail-at-step 10 --fail-how kill --out ${OUT}
                RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 120)
message("--- exit status ${status}\n${out}${err}")
if(status STREQUAL "0")
  message(FATAL_ERROR "the run should have been killed in epoch 2")
endif()

file(GLOB csvs "${OUT}/*.csv")
list(LENGTH csvs n)
if(NOT n EQUAL 1)
  message(FATAL_ERROR "${OUT} should hold one CSV, the run's: ${csvs}")
endif()
file(STRINGS "${csvs}" rows)
list(LENGTH rows n)
if(NOT n EQUAL 2 OR NOT rows MATCHES "^epoch,train_loss,train_acc,test_acc,seconds,in_sec_per_epoch;1,[^;]+,0$")
  message(FATAL_ERROR "the CSV should hold the header and epoch 1's row, got: ${rows}")
endif()

string(REGEX REPLACE "\\.csv$" ".json" json_file "${csvs}")
file(READ "${json_file}" json)
string(JSON finished ERROR_VARIABLE bad GET "${json}" finished)
string(JSON epochs ERROR_VARIABLE bad LENGTH "${json}" epochs)
string(JSON first ERROR_VARIABLE bad GET "${json}" epochs 0 epoch)
string(JSON batch ERROR_VARIABLE bad GET "${json}" settings batch-size)
string(JSON fail_how ERROR_VARIABLE bad GET "${json}" settings fail-how)
if(bad OR NOT finished STREQUAL "OFF" OR NOT epochs EQUAL 1 OR NOT first EQUAL 1 OR NOT batch EQUAL 64
   OR NOT fail_how STREQUAL "kill")
  message(FATAL_ERROR "${json_file} should say: not finished, epoch 1 alone, batch-size 64, fail-how kill "
                      "(${bad}); it holds:\n${json}")
endif()
message("the killed run left ${csvs}: ${rows}")
