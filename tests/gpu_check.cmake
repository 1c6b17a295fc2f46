# --- tools/gpu_check.sh, the one command that checks every GPU path. Where no GPU answers it
# cannot check any, but its own parts can be tested: the command line, and (--allow-no-gpu)
# running the programs, reading their result lines and writing the report. On a machine with
# a GPU the script itself is the check: the tests that need "no GPU" then report themselves
# skipped. Every test here has the label gpu_check, which the script leaves out when it runs
# the test suite (it must never run itself).
set(gpu_check_script ${CMAKE_SOURCE_DIR}/tools/gpu_check.sh)
set(gpu_check_out ${CMAKE_BINARY_DIR}/test-results/gpu_check)
set(gpu_check_tests)

# gpu_check_expect(<name> <code> <stdout|stderr> <regex> [args...]): the script's command line,
# checked by expect_exit.cmake like the programs' (a status of 2 must also print the usage).
function(gpu_check_expect name code stream regex)
  list(JOIN ARGN " " args)
  add_test(NAME gpu_check_${name}
           COMMAND ${CMAKE_COMMAND} -DCMD=${gpu_check_script} "-DARGS=${args}" -DCODE=${code}
                   -DSTREAM=${stream} "-DEXPECT=${regex}" -P ${CMAKE_CURRENT_LIST_DIR}/expect_exit.cmake
           WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
  set(gpu_check_tests ${gpu_check_tests} gpu_check_${name} PARENT_SCOPE)
endfunction()

gpu_check_expect(help            0 stdout "^usage: gpu_check.sh"                       --help)
gpu_check_expect(unknown_option  2 stderr "unknown option '--bogus'"                  --bogus)
gpu_check_expect(missing_value   2 stderr "--build-dir needs a value"                  --quick --build-dir)
gpu_check_expect(option_as_value 2 stderr "--out needs a value, got the option '--quick'" --out --quick)
gpu_check_expect(only_unknown    2 stderr "--only: 'ten' is neither 'tests' nor a chapter number" --only 01,ten)

# The whole sequence in the cpu build, short (--quick) and without building (--skip-build):
# it must end with status 0, and its report must hold a row with a test accuracy for every
# training program, mark every GPU-only step "not run: no GPU", and say plainly that it is not
# a GPU validation (gpu_check_run.cmake checks it). In a cuda build without a GPU the programs
# cannot train at all, so this test is only made for the cpu build.
if(MGPU_BACKEND_RESOLVED STREQUAL "cpu")
  set(gpu_check_programs 01_lenet,02_data_parallel,03_ring_allreduce,06_mixed_precision,07_model_parallel,08_parameter_server,09_resnet)
  if(TARGET 05_multi_process AND MPIEXEC_EXECUTABLE)
    string(APPEND gpu_check_programs ",05_multi_process")
  endif()
  add_test(NAME gpu_check_report_without_gpu
           COMMAND ${CMAKE_COMMAND} -DSCRIPT=${gpu_check_script}
                   "-DARGS=--allow-no-gpu --skip-build --quick --build-dir ${CMAKE_BINARY_DIR} --out ${gpu_check_out}/report"
                   -DCODE=0 -DREPORT=${gpu_check_out}/report/gpu_check.md -DPROGRAMS=${gpu_check_programs}
                   -P ${CMAKE_CURRENT_LIST_DIR}/gpu_check_run.cmake
           WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
  # About a minute on 2 cores. It runs alone: it runs programs and a part of the suite itself,
  # and would slow the tests that have time limits of their own.
  set_tests_properties(gpu_check_report_without_gpu PROPERTIES TIMEOUT 300 RUN_SERIAL TRUE)
  list(APPEND gpu_check_tests gpu_check_report_without_gpu)

  # --only: the chosen chapter's steps run, no other chapter's, and the verdict still comes.
  add_test(NAME gpu_check_only_one_chapter
           COMMAND ${CMAKE_COMMAND} -DSCRIPT=${gpu_check_script}
                   "-DARGS=--allow-no-gpu --skip-build --quick --only 07 --build-dir ${CMAKE_BINARY_DIR} --out ${gpu_check_out}/only"
                   -DCODE=0 "-DEXPECT=07_model_parallel_2dev_1gpu_gpipe +PASS.*gpu_check: NOT A GPU VALIDATION"
                   "-DREJECT=(0[1-689]_[a-z_0-9]+|ctest) +(PASS|FAIL|not run)"
                   -P ${CMAKE_CURRENT_LIST_DIR}/gpu_check_run.cmake
           WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
  set_tests_properties(gpu_check_only_one_chapter PROPERTIES TIMEOUT 120 RUN_SERIAL TRUE)
  list(APPEND gpu_check_tests gpu_check_only_one_chapter)
endif()

# Without --allow-no-gpu, on a machine where no GPU answers: status 77 and the reason. The
# status is checked by gpu_check_run.cmake, so ctest counts this test passed only when 77 came
# back (77 is not made a "skipped" code here). Made only where no GPU answered at configure time.
if(MGPU_GPU_COUNT EQUAL 0)
  add_test(NAME gpu_check_no_gpu_exits_77
           COMMAND ${CMAKE_COMMAND} -DSCRIPT=${gpu_check_script}
                   "-DARGS=--skip-build --quick --build-dir ${CMAKE_BINARY_DIR} --out ${gpu_check_out}/no_gpu"
                   -DCODE=77 "-DEXPECT=no NVIDIA GPU answers \\(.+\\); nothing to check"
                   -P ${CMAKE_CURRENT_LIST_DIR}/gpu_check_run.cmake
           WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
  list(APPEND gpu_check_tests gpu_check_no_gpu_exits_77)
endif()

# A test that needs "no GPU" prints this where a GPU answers at test time: ctest shows it skipped.
set_tests_properties(${gpu_check_tests} PROPERTIES LABELS gpu_check
                     SKIP_REGULAR_EXPRESSION "gpu_check test skipped: a GPU answers")
