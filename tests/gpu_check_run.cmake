# Runs tools/gpu_check.sh where no GPU answers, and checks how it ended and what it wrote.
#   cmake -DSCRIPT=<gpu_check.sh> -DARGS="<arguments>" -DCODE=<status> [-DEXPECT=<regex>] [-DREJECT=<regex>]
#         [-DREPORT=<its report> [-DPROGRAMS=<program,program,...>] [-DREPORT_MATCHES=<regex>]]
#         -P gpu_check_run.cmake
# EXPECT is matched against stdout and stderr together; REJECT must not match them. With REPORT, the report must exist,
# say that it is no GPU validation and match REPORT_MATCHES; with PROGRAMS too, it must be the
# report of the whole sequence: a training row with a test accuracy for each of PROGRAMS, every
# GPU-only step "not run", ctest's summary, a benchmark's table. Without SCRIPT, only the report
# is checked (to try the checks on a report you changed by hand).
#
# These runs are for machines where no GPU answers. Where one does, the script would check the
# GPUs for real (minutes), so this says so and stops: ctest shows the test skipped.

function(fail what)
  message(FATAL_ERROR "${what}\n${seen}")
endfunction()

set(seen "")
if(DEFINED SCRIPT)
  find_program(nvidia_smi nvidia-smi)
  if(nvidia_smi)
    execute_process(COMMAND ${nvidia_smi} -L RESULT_VARIABLE smi_status OUTPUT_VARIABLE smi_listing ERROR_QUIET)
    if(smi_status EQUAL 0 AND smi_listing MATCHES "GPU [0-9]+:")
      message("gpu_check test skipped: a GPU answers (nvidia-smi -L); there, run tools/gpu_check.sh itself")
      return()
    endif()
  endif()
  if(NOT DEFINED CODE)
    message(FATAL_ERROR "gpu_check_run.cmake: -DCODE=... is required with -DSCRIPT")
  endif()

  separate_arguments(args UNIX_COMMAND "${ARGS}")
  execute_process(COMMAND ${SCRIPT} ${args} RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err)
  set(seen "exit status: ${status}\n--- stdout:\n${out}\n--- stderr:\n${err}")
  if(NOT status STREQUAL "${CODE}")
    fail("`${SCRIPT} ${ARGS}` should exit with status ${CODE}, got '${status}'.")
  endif()
  if(DEFINED EXPECT AND NOT "${out}${err}" MATCHES "${EXPECT}")
    fail("`${SCRIPT} ${ARGS}`: the output should match the regex '${EXPECT}'.")
  endif()
  if(DEFINED REJECT AND "${out}${err}" MATCHES "${REJECT}")
    fail("`${SCRIPT} ${ARGS}`: the output should not match the regex '${REJECT}'.")
  endif()
endif()

if(NOT DEFINED REPORT)
  return()
endif()
if(NOT EXISTS "${REPORT}")
  fail("${REPORT}: the report was not written")
endif()
file(READ "${REPORT}" report)
set(seen "--- ${REPORT}:\n${report}\n${seen}")

# It must say plainly, at the top and in its last line, that it is no GPU validation.
if(NOT report MATCHES "This is NOT a GPU validation")
  fail("${REPORT}: the report does not say that it is not a GPU validation")
endif()
if(NOT report MATCHES "\ngpu_check: NOT A GPU VALIDATION [^\n]*\n$")
  fail("${REPORT}: the last line should be the verdict 'gpu_check: NOT A GPU VALIDATION ...'")
endif()
if(DEFINED REPORT_MATCHES AND NOT report MATCHES "${REPORT_MATCHES}")
  fail("${REPORT}: the report should match the regex '${REPORT_MATCHES}'")
endif()
if(NOT DEFINED PROGRAMS)
  return()
endif()

# A row of the training table: | step | run | backend | devices | epochs | test_acc | ...
# Every training program must have at least one, with a number for test_acc.
string(REPLACE "," ";" programs "${PROGRAMS}")
foreach(program IN LISTS programs)
  if(NOT report MATCHES "\n\\| ${program}_[a-z0-9_]+ \\| [^|\n]+ \\| [a-z]+ \\| [0-9]+ \\| [0-9]+ \\| [0-9]+\\.[0-9]+ \\|")
    fail("${REPORT}: no training row with a test_acc for ${program}")
  endif()
endforeach()

# No step that needs a GPU may count as passed: each is listed as "not run: no GPU".
set(gpu_steps 02_data_parallel_all_gpus 03_ring_allreduce_all_gpus 04_nccl_1gpu 04_nccl_all_gpus 04_allreduce_bench)
if(PROGRAMS MATCHES "05_multi_process")
  list(APPEND gpu_steps 05_multi_process_all_gpus)
endif()
foreach(step IN LISTS gpu_steps)
  if(NOT report MATCHES "\n\\| ${step} \\| [^|\n]+ \\| not run: no GPU \\|")
    fail("${REPORT}: the step ${step} should be listed as 'not run: no GPU'")
  endif()
endforeach()

# What the script read from the other programs' output: ctest's summary, a benchmark's table.
if(NOT report MATCHES "tests passed, 0 tests failed out of [0-9]+")
  fail("${REPORT}: ctest's summary line is missing")
endif()
if(NOT report MATCHES "# allreduce, float32, sum, in place, on 2 devices")
  fail("${REPORT}: 03_allreduce_bench's table is missing")
endif()
