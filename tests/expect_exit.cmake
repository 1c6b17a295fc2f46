# Runs one program and checks how it ended: its exit status and what it printed.
#   cmake -DCMD=<program> -DARGS="<arguments>" -DCODE=<status> -DSTREAM=stdout|stderr
#         -DEXPECT=<regex> [-DREFUSAL=one_line|usage] -P expect_exit.cmake
# A status of 2 (a refused command line) must say how to get the usage. REFUSAL=one_line (the
# chapters' programs): stderr is the reason in one line, "<program>: <why>", then "run with --help
# for the usage", and nothing else. REFUSAL=usage (the default; the tools' own parsers): the
# usage follows the reason.
foreach(var CMD CODE STREAM EXPECT)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "expect_exit.cmake: -D${var}=... is required")
  endif()
endforeach()

separate_arguments(args UNIX_COMMAND "${ARGS}")
execute_process(COMMAND ${CMD} ${args}
                RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(STREAM STREQUAL "stdout")
  set(text "${out}")
else()
  set(text "${err}")
endif()

set(seen "exit status: ${status}\n--- stdout:\n${out}\n--- stderr:\n${err}")
if(NOT status STREQUAL "${CODE}")
  message(FATAL_ERROR "`${CMD} ${ARGS}` should exit with status ${CODE}.\n${seen}")
endif()
if(NOT text MATCHES "${EXPECT}")
  message(FATAL_ERROR "`${CMD} ${ARGS}`: ${STREAM} should match the regex '${EXPECT}'.\n${seen}")
endif()
if(CODE EQUAL 2 AND REFUSAL STREQUAL "one_line")
  if(NOT err MATCHES "^[^\n]+\nrun with --help for the usage\n$")
    message(FATAL_ERROR "`${CMD} ${ARGS}`: a refused command line should print one line, then "
                        "'run with --help for the usage', and nothing else on stderr.\n${seen}")
  endif()
elseif(CODE EQUAL 2 AND NOT err MATCHES "usage: ")
  message(FATAL_ERROR "`${CMD} ${ARGS}`: a refused command line should print the usage on stderr.\n${seen}")
endif()
