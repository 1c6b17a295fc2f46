# Runs one command (usually mpiexec and a program) and checks how it ended, within a time limit.
#   cmake -DCMD=<program> -DARGS="<arguments>" -DCODE=<status>|nonzero -DEXPECT=<regex>
#         [-DSECONDS=<limit>] [-DCLEAN_LOG=1] -P mpi_run.cmake
# EXPECT is matched against stdout and stderr together. The whole output is printed, so that
# ctest's SKIP_REGULAR_EXPRESSION can see it. A run that does not end within SECONDS (default
# 60) fails: a fault must stop every process, never leave one waiting.
foreach(var CMD CODE EXPECT)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "mpi_run.cmake: -D${var}=... is required")
  endif()
endforeach()
if(NOT CMD)
  message("mpiexec not found: the tests that launch several processes cannot run")
  return()
endif()
if(NOT DEFINED SECONDS)
  set(SECONDS 60)
endif()

separate_arguments(args UNIX_COMMAND "${ARGS}")
string(TIMESTAMP start "%s")
execute_process(COMMAND ${CMD} ${args} RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err
                TIMEOUT ${SECONDS})
string(TIMESTAMP end "%s")
math(EXPR took "${end} - ${start}")
set(seen "exit status: ${status} after ${took} s\n--- stdout:\n${out}\n--- stderr:\n${err}")
message("${seen}")

if(status MATCHES "timeout|Process terminated due to timeout")
  message(FATAL_ERROR "`${CMD} ${ARGS}` did not end within ${SECONDS} s")
endif()
if(CODE STREQUAL "nonzero")
  if(status STREQUAL "0" OR NOT status MATCHES "^[0-9]+$")
    message(FATAL_ERROR "`${CMD} ${ARGS}` should exit with a non-zero status, got '${status}'")
  endif()
elseif(NOT status STREQUAL "${CODE}")
  message(FATAL_ERROR "`${CMD} ${ARGS}` should exit with status ${CODE}, got '${status}'")
endif()
if(NOT "${out}${err}" MATCHES "${EXPECT}")
  message(FATAL_ERROR "`${CMD} ${ARGS}`: the output should match the regex '${EXPECT}'")
endif()
# -DCLEAN_LOG=1: the output must hold no carriage return and no escape code (a log, not a screen).
if(CLEAN_LOG)
  string(ASCII 13 carriage_return)
  string(ASCII 27 escape)
  foreach(code carriage_return escape)
    string(FIND "${out}${err}" "${${code}}" at)
    if(NOT at EQUAL -1)
      message(FATAL_ERROR "`${CMD} ${ARGS}`: the output holds a ${code} (at character ${at}): it is not a clean log")
    endif()
  endforeach()
endif()
