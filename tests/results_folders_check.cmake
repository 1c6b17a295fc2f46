# Every test that writes results has its --out (or -DOUT=) to itself: ctest -j runs tests side
# by side, and two runs writing one folder under one name are refused (common/report.h's
# RunLock), so two tests sharing a folder fail or pass by the luck of their timing.
#   cmake -DCTEST=<ctest> -DBUILD=<build folder> -P results_folders_check.cmake
#   cmake -DJSON_FILE=<ctest --show-only=json-v1 output> -P results_folders_check.cmake
# fails naming each folder two tests or more write and the tests that write it.
cmake_minimum_required(VERSION 3.25)  # IN_LIST, string(JSON)
if(DEFINED JSON_FILE)
  file(READ ${JSON_FILE} json)
else()
  execute_process(COMMAND ${CTEST} --test-dir ${BUILD} --show-only=json-v1
                  OUTPUT_VARIABLE json RESULT_VARIABLE status)
  if(NOT status EQUAL 0)
    message(FATAL_ERROR "ctest --show-only=json-v1 in ${BUILD} failed (status ${status})")
  endif()
endif()

string(JSON count LENGTH "${json}" tests)
math(EXPR last "${count} - 1")
set(folders "")  # every folder written, once
foreach(i RANGE ${last})
  string(JSON test GET "${json}" tests ${i})
  string(JSON name GET "${test}" name)
  string(JSON words_count ERROR_VARIABLE no_command LENGTH "${test}" command)
  if(no_command)
    continue()
  endif()
  # The command's words in one line (expect_exit's and mpi_test's programs get theirs inside one
  # -DARGS=... word), but for the output a test expects (-DEXPECT=..., which may quote "--out").
  set(line "")
  math(EXPR last_word "${words_count} - 1")
  foreach(w RANGE ${last_word})
    string(JSON word GET "${test}" command ${w})
    if(NOT word MATCHES "^-DEXPECT=")
      string(APPEND line " ${word}")
    endif()
  endforeach()
  string(REGEX MATCHALL "(--out=|--out +|-DOUT=)[^ ]*" outs "${line}")
  set(seen "")
  foreach(out IN LISTS outs)
    string(REGEX REPLACE "^(--out=|--out +|-DOUT=)" "" folder "${out}")
    if(folder STREQUAL "" OR folder IN_LIST seen)  # none ("--out=", refused), or named twice (each rank of an MPI launch)
      continue()
    endif()
    list(APPEND seen "${folder}")
    string(MD5 key "${folder}")
    if(NOT DEFINED writers_${key})
      list(APPEND folders "${folder}")
    endif()
    list(APPEND writers_${key} ${name})
  endforeach()
endforeach()

set(shared "")
foreach(folder IN LISTS folders)
  string(MD5 key "${folder}")
  list(LENGTH writers_${key} n)
  if(n GREATER 1)
    list(JOIN writers_${key} ", " names)
    string(APPEND shared "\n  ${folder}: ${names}")
  endif()
endforeach()
list(LENGTH folders n_folders)
if(shared)
  message(FATAL_ERROR "tests that write the same results folder (give each its own: --out \${test_results} "
                      "in tests/CMakeLists.txt's functions does):${shared}")
endif()
message(STATUS "${count} tests; ${n_folders} results folders, each written by one test")
