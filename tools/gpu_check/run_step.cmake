# One step of the GPU check, as ctest runs it (steps.cmake registers one test per step): runs
# the step's command, keeps its whole output in <logs>/<step>.log, judges it, and writes the
# report's rows for it, <step>.row (the Steps table) and <step>.runs (Training runs: one row per
# `result:` line).
#   cmake -DSTEP=<name> -DKIND=<kind> -DTITLE=<words> [-DONE_GPU=TRUE] [-DMISSING=<why>]
#         -P run_step.cmake -- <command>...
# What the check asks for comes from the environment, which tools/gpu_check.sh sets:
#   MGPU_GPU_CHECK         full (d2l's defaults) or quick; unset, the step is not run
#   MGPU_GPU_CHECK_LOGS    the folder for the logs and rows, and each run's --out
#   MGPU_GPU_CHECK_NO_GPU  1 where no GPU answers (--allow-no-gpu): shorter runs
#   MGPU_GPU_CHECK_BACKEND the backend every result line must name (cuda; a twin's torch-cuda);
#                          empty: any
# A step passes, fails (FATAL_ERROR: ctest shows it failed) or is not run: it prints
# "gpu_check step not run: why", which ctest shows as skipped.

# A full run must end above this test accuracy. Chance is 0.10 and d2l's runs end between 0.75
# and 0.84: below 0.5 a run did not learn, whatever its exit status says. Short runs (--quick)
# are not judged: LeNet sits at chance for about two epochs of the full training set.
set(min_test_acc 0.50)
# No step may run longer: a collective that waits forever must fail the step, not hang the check.
set(time_limit 300)

set(mode "$ENV{MGPU_GPU_CHECK}")
set(logs "$ENV{MGPU_GPU_CHECK_LOGS}")
if(NOT mode MATCHES "^(full|quick)$" OR logs STREQUAL "")
  message("gpu_check step not run: tools/gpu_check.sh runs it (MGPU_GPU_CHECK and MGPU_GPU_CHECK_LOGS are not set)")
  return()
endif()
set(no_gpu "$ENV{MGPU_GPU_CHECK_NO_GPU}")
get_filename_component(repo "${CMAKE_CURRENT_LIST_DIR}/../.." ABSOLUTE)

# The command: the words after "--".
set(command "")
set(after_dashes FALSE)
math(EXPR last "${CMAKE_ARGC} - 1")
foreach(i RANGE ${last})
  if(after_dashes)
    list(APPEND command "${CMAKE_ARGV${i}}")
  elseif(CMAKE_ARGV${i} STREQUAL "--")
    set(after_dashes TRUE)
  endif()
endforeach()

# What --quick, or a machine without a GPU, changes: options appended after d2l's (the last of
# a repeated option wins). Without a GPU, ResNet-18 runs at --width 4 (a 256th of the work) and
# short runs are shorter still (a CI runner has 2 cores); the full recipe runs 2 epochs there,
# so that the comparison with PyTorch reads an earlier epoch of it, as on a GPU.
set(more "")
if(KIND STREQUAL "bench")
  if(mode STREQUAL "quick")
    set(more -e 1M -w 1 -n 5)
  endif()
elseif(KIND STREQUAL "kernels")
  if(mode STREQUAL "quick" OR no_gpu)  # without a GPU: chapter 09's kernels only, on the CPU
    set(more -b 8 -w 1 -n 3)
  endif()
elseif(mode STREQUAL "quick" AND no_gpu)
  set(more --epochs 1 --limit-train 1024 --batch-size 64)
elseif(mode STREQUAL "quick")
  set(more --epochs 2 --limit-train 4096)
endif()
if(no_gpu AND KIND MATCHES "^(resnet|resnet3|twin3)$")
  list(APPEND more --width 4)
  if(KIND STREQUAL "resnet" AND mode STREQUAL "quick")
    list(APPEND more --epochs 2)
  endif()
endif()
if(KIND STREQUAL "mpi" AND mode STREQUAL "quick")  # chapter 05 also times some steps after training
  if(no_gpu)
    list(APPEND more --profile-steps 2)
  else()
    list(APPEND more --profile-steps 5)
  endif()
endif()
list(APPEND command ${more} --out "${logs}/${STEP}")
# "On one GPU": the first of those CUDA_VISIBLE_DEVICES leaves (where set), else GPU 0.
if(ONE_GPU AND NOT no_gpu)
  set(first_gpu 0)
  if("$ENV{CUDA_VISIBLE_DEVICES}" MATCHES "^([^,]+)")
    set(first_gpu "${CMAKE_MATCH_1}")
  endif()
  list(PREPEND command env CUDA_VISIBLE_DEVICES=${first_gpu})
endif()

# The command as a person would type it from the repository root, to paste and run one step alone.
set(text "")
foreach(word IN LISTS command)
  string(REPLACE "${repo}/" "" word "${word}")
  if(NOT word MATCHES "^[A-Za-z0-9_./=:,@%+-]+$")
    set(word "'${word}'")
  endif()
  string(APPEND text " ${word}")
endforeach()
string(STRIP "${text}" text)

set(log "${logs}/${STEP}.log")
file(REMOVE "${logs}/${STEP}.row" "${logs}/${STEP}.runs")
set(runs "")
set(status "")
set(seconds "0.0")
# record(<outcome>): the step's row, the terminal's line, and how ctest sees the step.
macro(record outcome)
  string(REPLACE "|" "/" cell "${outcome}")  # a | would end the table's cell
  file(WRITE "${logs}/${STEP}.row" "| ${STEP} | ${TITLE} | ${cell} | ${status} | ${seconds} | `${text}` |\n")
  file(WRITE "${logs}/${STEP}.runs" "${runs}")
  if(cell MATCHES "^not run: ")
    message("gpu_check step ${cell}")
  elseif(NOT cell STREQUAL "PASS")
    message(FATAL_ERROR "${STEP}: ${cell}")
  endif()
  return()
endmacro()

if(MISSING)
  if(no_gpu)
    record("not run: ${MISSING}")
  endif()
  record("FAIL: ${MISSING}")
endif()
list(FIND command "python3" python_at)
if(python_at EQUAL -1)  # a program of this build: it must have been built
  foreach(word IN LISTS command)
    if(word MATCHES "/bin/[0-9][0-9]_[a-z_]+$" AND NOT EXISTS "${word}")
      string(REPLACE "${repo}/" "" word "${word}")
      set(why "${word} was not built")
      if(word MATCHES "/04_[a-z_]+$")
        string(APPEND why " (a cuda build leaves chapter 04 out where CMake found no NCCL: see the configure report)")
      elseif(word MATCHES "/05_[a-z_]+$")
        string(APPEND why " (chapter 05 is left out where CMake found no MPI: see the configure report)")
      endif()
      record("FAIL: ${why}")
    endif()
  endforeach()
endif()

string(TIMESTAMP started "%s%f")
execute_process(COMMAND ${command} WORKING_DIRECTORY "${repo}" TIMEOUT ${time_limit}
                RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE out)
string(TIMESTAMP ended "%s%f")
math(EXPR tenths "(${ended} - ${started}) / 100000")
math(EXPR whole "${tenths} / 10")
math(EXPR tenth "${tenths} % 10")
set(seconds "${whole}.${tenth}")
file(WRITE "${log}" "$ ${text}\n${out}")

# Every training program ends each training with a line of key=value pairs (chapters 02-04
# train several times in one program, and print one a training):
#   result: chapter=01_lenet backend=cuda devices=1 epochs=10 ... test_acc=0.8140 sec_per_epoch=0.122 ...
# and names its CSV just before ("wrote .../02_data_parallel_k2.csv": the run 02_data_parallel_k2).
set(problems "")
set(results 0)
set(run "")
string(REPLACE ";" "," out_lines "${out}")  # a list of lines: no ";" may split one
string(REPLACE "\n" ";" out_lines "${out_lines}")
set(backend "$ENV{MGPU_GPU_CHECK_BACKEND}")
if(KIND MATCHES "^twin" AND backend)
  set(backend "torch-${backend}")
endif()
foreach(line IN LISTS out_lines)
  if(line MATCHES "^wrote (.*)\\.csv$")
    get_filename_component(run "${CMAKE_MATCH_1}" NAME)
    continue()
  endif()
  if(NOT line MATCHES "^result: (.*)$" OR KIND STREQUAL "kernels")  # chapter 10's is no training's
    continue()
  endif()
  math(EXPR results "${results} + 1")
  string(REGEX MATCHALL "[^ =]+=[^ ]*" pairs "${CMAKE_MATCH_1}")
  set(other "")
  foreach(key chapter backend devices epochs test_acc sec_per_epoch samples_per_sec)
    set(value_${key} "?")
  endforeach()
  foreach(pair IN LISTS pairs)
    string(REGEX MATCH "^([^=]+)=(.*)$" _ "${pair}")
    set(value_${CMAKE_MATCH_1} "${CMAKE_MATCH_2}")
    if(NOT CMAKE_MATCH_1 MATCHES "^(chapter|backend|devices|epochs|test_acc|sec_per_epoch|samples_per_sec|batch|lr)$")
      string(APPEND other " ${pair}")  # keys added later still show, in the last column
    endif()
  endforeach()
  if(run STREQUAL "")
    set(run "${value_chapter}")
  endif()
  string(STRIP "${other}" other)
  string(APPEND runs "| ${STEP} | ${run} | ${value_backend} | ${value_devices} | ${value_epochs} | ${value_test_acc}"
                     " | ${value_sec_per_epoch} | ${value_samples_per_sec} | ${other} |\n")
  if(NOT value_test_acc MATCHES "^[0-9]+(\\.[0-9]+)?$")
    string(APPEND problems "${run}: test_acc '${value_test_acc}' is not a number; ")
  elseif(mode STREQUAL "full" AND value_test_acc LESS min_test_acc)
    string(APPEND problems "${run}: test_acc ${value_test_acc} is below ${min_test_acc} (did not learn); ")
  endif()
  if(backend AND NOT value_backend STREQUAL backend)
    string(APPEND problems "${run}: ran on the '${value_backend}' backend, not ${backend}; ")
  endif()
  set(run "")
endforeach()
string(REGEX REPLACE "; $" "" problems "${problems}")

# Why a run that did not exit with 0 failed: its status, and the line of its log that says
# why: the last one a program of this repository printed about itself ("05_multi_process:
# rank 1: error: ..."), or else the last that speaks of an error (a twin's, mpirun's).
set(why "")
foreach(line IN LISTS out_lines)
  if(line MATCHES "^[0-9][0-9]_[a-z_]+: ")
    set(why "${line}")
  endif()
endforeach()
if(why STREQUAL "")
  foreach(line IN LISTS out_lines)
    if(line MATCHES "[Ee][Rr][Rr][Oo][Rr]|[Ff][Aa][Ii][Ll]|[Aa][Bb][Oo][Rr][Tt]")
      set(why "${line}")
    endif()
  endforeach()
endif()
string(SUBSTRING "${why}" 0 200 why)
if(status MATCHES "timeout")
  set(status 124)
  set(exit_words "timed out after ${time_limit} s")
else()
  set(exit_words "exit ${status}")
endif()
if(NOT why STREQUAL "")
  string(APPEND exit_words ": ${why}")
endif()

# Where no GPU answers, a step that needs one could not happen: chapter 04 in a cpu build says
# "not applicable" (77), every program of a cuda build "no GPU answers".
if(no_gpu AND (status EQUAL 77 OR out MATCHES "no GPU answers"))
  record("not run: no GPU")
elseif(NOT status EQUAL 0)
  record("FAIL: ${exit_words} (see the log)")
elseif(KIND MATCHES "^(bench|kernels)$")  # no training: the exit status says it all
  record(PASS)
elseif(results EQUAL 0)
  record("FAIL: no result line")
elseif(problems)
  record("FAIL: ${problems}")
endif()
record(PASS)
