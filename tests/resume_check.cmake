# Chapter 05's checkpoints, end to end: a run of 3 epochs, and the same run stopped after 2 and
# resumed from its checkpoint to 3, must print the same curve; a resume that leaves nothing to
# train (--epochs at or below the checkpoint's), or that changes the computation (another
# --warmup-epochs or --lr), must be refused, every rank exiting with status 1.
#   cmake -DLAUNCH="<mpiexec -n 2 ...>" -DPROGRAM=<05_multi_process> -DOUT=<dir> -P resume_check.cmake
# An empty LAUNCH (no mpiexec) prints "mpiexec not found", which the test reports as skipped.
foreach(var LAUNCH PROGRAM OUT)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "resume_check.cmake: -D${var}=... is required")
  endif()
endforeach()
if(NOT LAUNCH)
  message("mpiexec not found: the tests that launch several processes cannot run")
  return()
endif()
separate_arguments(launch UNIX_COMMAND "${LAUNCH}")
set(recipe --limit-train 600 --batch-size 50 --lr 0.5 --profile-steps 0)
file(REMOVE_RECURSE "${OUT}")

function(run label)
  execute_process(COMMAND ${launch} ${PROGRAM} ${recipe} ${ARGN} RESULT_VARIABLE status OUTPUT_VARIABLE out
                  ERROR_VARIABLE err TIMEOUT 120)
  message("--- ${label}: exit status ${status}\n${out}${err}")
  if(NOT status STREQUAL "0")
    message(FATAL_ERROR "${label} failed")
  endif()
  set(out "${out}" PARENT_SCOPE)  # what the run printed, for the checks after it
endfunction()

run("uninterrupted, 3 epochs" --epochs 3 --out ${OUT}/whole)
run("stopped after 2 epochs" --epochs 2 --checkpoint ${OUT}/run.ckpt --out ${OUT}/parts)
if(EXISTS ${OUT}/run.ckpt.tmp OR NOT EXISTS ${OUT}/run.ckpt)
  message(FATAL_ERROR "the checkpoint should be ${OUT}/run.ckpt, with no .tmp left")
endif()
run("resumed to 3 epochs" --epochs 3 --resume ${OUT}/run.ckpt --out ${OUT}/parts)
# ... from the checkpoint: a run that trained again from the start would give the same curve.
if(NOT "${out}" MATCHES "resumed from [^\n]*run.ckpt after epoch 2")
  message(FATAL_ERROR "the resumed run does not say it resumed after epoch 2")
endif()

# --epochs counts the whole run: resuming the 2 saved epochs with --epochs 2 or 1 has nothing to do.
foreach(epochs 2 1)
  execute_process(COMMAND ${launch} ${PROGRAM} ${recipe} --epochs ${epochs} --resume ${OUT}/run.ckpt
                          --out ${OUT}/refused
                  RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 60)
  message("--- resumed with --epochs ${epochs}: exit status ${status}\n${out}${err}")
  set(says "rank 0: error: [^\n]*run.ckpt: the checkpoint holds 2 finished epoch\\(s\\), and --epochs ${epochs} asks for no more")
  if(NOT status STREQUAL "1" OR NOT "${out}${err}" MATCHES "${says}")
    message(FATAL_ERROR "a resume with --epochs ${epochs} from 2 saved epochs should be refused (status 1, '${says}')")
  endif()
endforeach()

# A resume that would change the computation is refused, naming the flag and both values exactly:
# another warm-up (the learning rate of every step after it), a learning rate one float away.
foreach(case "--warmup-epochs 1|--warmup-epochs 0, this run has --warmup-epochs 1"
             "--lr 0.50000006|--lr 0.5, this run has --lr 0.50000006")
  string(REPLACE "|" ";" parts "${case}")
  list(GET parts 0 flag_text)
  list(GET parts 1 says)
  separate_arguments(flags UNIX_COMMAND "${flag_text}")
  execute_process(COMMAND ${launch} ${PROGRAM} ${recipe} --epochs 3 --resume ${OUT}/run.ckpt ${flags}
                          --out ${OUT}/refused
                  RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 60)
  message("--- resumed with ${flag_text}: exit status ${status}\n${out}${err}")
  string(FIND "${out}${err}" "the checkpoint was written by a run with ${says}" at)
  if(NOT status STREQUAL "1" OR at EQUAL -1)
    message(FATAL_ERROR "a resume with ${flag_text} should be refused (status 1, '...${says}')")
  endif()
endforeach()

# The CSVs' columns epoch, loss, train acc, test acc must agree in every row (the seconds differ).
foreach(part whole parts)
  file(GLOB csv "${OUT}/${part}/*_epochs-3_*.csv")  # the 3-epoch runs (parts/ also holds the 2-epoch one)
  file(STRINGS "${csv}" rows)
  set(curve "")
  foreach(row IN LISTS rows)
    string(REGEX REPLACE "^([^,]*,[^,]*,[^,]*,[^,]*),.*$" "\\1" row "${row}")  # the first four: no timings
    list(APPEND curve "${row}")
  endforeach()
  set(${part} "${curve}")
endforeach()
list(LENGTH whole n)
if(NOT n EQUAL 4)
  message(FATAL_ERROR "the uninterrupted run's CSV should hold a header and 3 epochs: ${whole}")
endif()
if(NOT whole STREQUAL parts)
  message(FATAL_ERROR "the resumed run's curve differs from the uninterrupted one:\n  whole: ${whole}\n  parts: ${parts}")
endif()
message("the same curve: ${whole}")
