# --- tools/gpu_check.sh, the one command that checks every GPU path.
# Its steps: one test per run of a program, gpu.<step>, labelled "gpu" (tools/gpu_check/
# steps.cmake). They skip unless the script runs them (it sets MGPU_GPU_CHECK): a plain ctest
# never starts ten minutes of training. The script runs them one by one with
#   ctest -L '^gpu$'
include(${CMAKE_SOURCE_DIR}/tools/gpu_check/steps.cmake)

# The script itself. Where no GPU answers it cannot check any, but its own parts can be tested:
# the command line, and (--allow-no-gpu) running the steps, reading their result lines and
# writing the report. On a machine with a GPU the script itself is the check: the tests that
# need "no GPU" then report themselves skipped. Every test below has the label gpu_check, which
# the script leaves out when it runs the test suite (it must never run itself).
set(gpu_check_script ${CMAKE_SOURCE_DIR}/tools/gpu_check.sh)
set(gpu_check_out ${test_results}/gpu_check)
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

# The steps the script runs and tools/README.md's table of them agree, name for name and in order.
add_test(NAME gpu_check_steps_in_readme
         COMMAND ${CMAKE_COMMAND} -DSCRIPT=${gpu_check_script} -DREADME=${CMAKE_SOURCE_DIR}/tools/README.md
                 -P ${CMAKE_CURRENT_LIST_DIR}/gpu_check_steps.cmake)
list(APPEND gpu_check_tests gpu_check_steps_in_readme)

# The whole sequence in the cpu build, short (--quick) and without building (--skip-build): the
# suite's *_help tests, then the gpu.* tests, which the script runs with ctest and reads back;
# it must end with status 0, and its report must hold a row with a test accuracy for every
# training program, mark every GPU-only step "not run: no GPU", and say plainly that it is not
# a GPU validation (gpu_check_run.cmake checks it). In a cuda build without a GPU the programs
# cannot train at all, so this test is only made for the cpu build.
if(MGPU_BACKEND_RESOLVED STREQUAL "cpu")
  set(gpu_check_programs 01_lenet,02_data_parallel,03_ring_allreduce,06_mixed_precision,07_model_parallel,08_parameter_server,09_resnet)
  if(TARGET 05_multi_process AND MPIEXEC_EXECUTABLE)
    string(APPEND gpu_check_programs ",05_multi_process")
  endif()
  # The machine table reads the build after configuring it: a cpu build, without NCCL. No python3
  # has PyTorch with CUDA where no GPU is, so the comparison with PyTorch says in one line that it
  # did not run, and why.
  set(facts "\n\\| NCCL \\| not used by a cpu build \\|\n\\| build \\| [^|\n]+: backend cpu \\(asked for: [a-z]+\\) \\|")
  set(no_twins "\n## This repository against PyTorch\n\nNot run: [^\n]+\\. \\(Where `python3` imports torch")
  add_test(NAME gpu_check_report_without_gpu
           COMMAND ${CMAKE_COMMAND} -DSCRIPT=${gpu_check_script}
                   "-DARGS=--allow-no-gpu --skip-build --quick --build-dir ${CMAKE_BINARY_DIR} --out ${gpu_check_out}/report"
                   -DCODE=0 -DREPORT=${gpu_check_out}/report/gpu_check.md -DPROGRAMS=${gpu_check_programs}
                   "-DREPORT_MATCHES=${facts}.*${no_twins}"
                   -P ${CMAKE_CURRENT_LIST_DIR}/gpu_check_run.cmake
           WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
  # About two minutes on 2 cores. It runs alone: it runs programs and a part of the suite
  # itself, and would slow the tests that have time limits of their own.
  set_tests_properties(gpu_check_report_without_gpu PROPERTIES TIMEOUT 600 RUN_SERIAL TRUE)
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

  # A TERM (as Ctrl-C) during a step: the whole report is still written, ending in FAIL, exit 130.
  add_test(NAME gpu_check_interrupted
           COMMAND ${CMAKE_CURRENT_LIST_DIR}/gpu_check_interrupted.sh ${gpu_check_script} ${CMAKE_BINARY_DIR}
                   ${gpu_check_out}/interrupted
           WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
  set_tests_properties(gpu_check_interrupted PROPERTIES TIMEOUT 400 RUN_SERIAL TRUE)
  list(APPEND gpu_check_tests gpu_check_interrupted)

  # The PyTorch twins and the report's comparison table, with tests/stand_in_python/python3
  # first on the PATH: a python3 that says it has PyTorch with CUDA and prints the result line a
  # twin would (0.250 s per epoch, test accuracy 0.5000). Chapters 01 and 09 only (~15 s). Each
  # twin runs with its precision on the GPU, and each row of the table sets it beside the C++
  # run of the same model and precision: the fp32 ResNet-18, which ran longer, at the twin's epoch.
  set(num "[0-9]+\\.[0-9]+")
  set(twin_cells "${num} \\| 0\\.250 \\| 0\\.5000 \\| [0-9]+\\.[0-9][0-9] \\|")
  set(twin_table "\n\\| LeNet \\| fp32 \\(PyTorch: TF32 off\\)[^|\n]+ \\| ${num} \\| ${twin_cells} 01_lenet_1dev, 01_lenet_torch \\|")
  string(APPEND twin_table "\n\\| ResNet-18 \\| fp32 \\(PyTorch: TF32 off\\)[^|\n]+ \\| ${num} \\| [0-9]\\.[0-9][0-9][0-9][0-9] \\(epoch 1 of 2\\) \\| 0\\.250 \\| 0\\.5000 \\| [0-9]+\\.[0-9][0-9] \\| 09_resnet_1dev, 09_resnet_torch_fp32 \\|")
  foreach(precision tf32 bf16)
    string(APPEND twin_table "\n\\| ResNet-18 \\| ${precision} \\(PyTorch: [^|\n]+ \\| ${num} \\| ${twin_cells} 09_resnet_1dev_${precision}, 09_resnet_torch_${precision} \\|")
  endforeach()
  add_test(NAME gpu_check_torch_twins
           COMMAND ${CMAKE_COMMAND} -DSCRIPT=${gpu_check_script}
                   "-DARGS=--allow-no-gpu --skip-build --quick --only 01,09 --build-dir ${CMAKE_BINARY_DIR} --out ${gpu_check_out}/twins"
                   -DCODE=0 "-DEXPECT=01_lenet_torch +PASS.*09_resnet_torch_fp32 +PASS.*09_resnet_torch_tf32 +PASS.*09_resnet_torch_bf16 +PASS"
                   -DREPORT=${gpu_check_out}/twins/gpu_check.md
                   "-DREPORT_MATCHES=PyTorch \\(the twins\\) \\| 2\\.11\\.0\\+stand-in with CUDA 13\\.0 .*--device cuda --precision bf16.*${twin_table}"
                   -P ${CMAKE_CURRENT_LIST_DIR}/gpu_check_run.cmake
           WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
  set_tests_properties(gpu_check_torch_twins PROPERTIES TIMEOUT 300 RUN_SERIAL TRUE
                       ENVIRONMENT_MODIFICATION "PATH=path_list_prepend:${CMAKE_CURRENT_LIST_DIR}/stand_in_python")
  list(APPEND gpu_check_tests gpu_check_torch_twins)
  # A twin that fails is a failed step like any other (the verdict FAIL, exit 1), named with its
  # error, and the report is still written to the end (its row of the table is left out).
  add_test(NAME gpu_check_torch_twin_fails
           COMMAND ${CMAKE_COMMAND} -DSCRIPT=${gpu_check_script}
                   "-DARGS=--allow-no-gpu --skip-build --quick --only 09 --build-dir ${CMAKE_BINARY_DIR} --out ${gpu_check_out}/twin_fails"
                   -DCODE=1 "-DEXPECT=09_resnet_torch_bf16 +FAIL: exit 1: RuntimeError: the stand-in fails.*report: .*gpu_check: FAIL \\(1 of [0-9]+ steps failed\\)"
                   -P ${CMAKE_CURRENT_LIST_DIR}/gpu_check_run.cmake
           WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
  set_tests_properties(gpu_check_torch_twin_fails PROPERTIES TIMEOUT 300 RUN_SERIAL TRUE
                       ENVIRONMENT STAND_IN_PYTHON_FAILS=bf16
                       ENVIRONMENT_MODIFICATION "PATH=path_list_prepend:${CMAKE_CURRENT_LIST_DIR}/stand_in_python")
  list(APPEND gpu_check_tests gpu_check_torch_twin_fails)
endif()

# In a cuda build with NCCL the machine table's NCCL row is the loaded library's version and file
# (tools/nccl_version), and the build row says cuda with its architectures: read without a GPU
# too, with only chapter 04's steps (each "not run: no GPU") around them.
if(MGPU_BACKEND_RESOLVED STREQUAL "cuda" AND TARGET nccl_version)
  add_test(NAME gpu_check_machine_facts_cuda
           COMMAND ${CMAKE_COMMAND} -DSCRIPT=${gpu_check_script}
                   "-DARGS=--allow-no-gpu --skip-build --quick --only 04 --build-dir ${CMAKE_BINARY_DIR} --out ${gpu_check_out}/cuda_facts"
                   -DCODE=0 -DREPORT=${gpu_check_out}/cuda_facts/gpu_check.md
                   "-DREPORT_MATCHES=\n\\| NCCL \\| [0-9]+\\.[0-9]+\\.[0-9]+ \\(/[^|\n]*libnccl[^|\n]*\\)[^|\n]* \\|\n\\| build \\| [^|\n]+: backend cuda \\(asked for: [a-z]+\\), CUDA architectures [^|\n]+ \\|"
                   -P ${CMAKE_CURRENT_LIST_DIR}/gpu_check_run.cmake
           WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
  set_tests_properties(gpu_check_machine_facts_cuda PROPERTIES TIMEOUT 120)
  list(APPEND gpu_check_tests gpu_check_machine_facts_cuda)
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

# tools/resnet_speed_check.sh, the prepared run for ResNet-18's speed on one GPU: its command line
# here (the run itself needs a GPU, and says so with status 77, which ctest shows as skipped).
function(speed_check_expect name code stream regex)
  list(JOIN ARGN " " args)
  add_test(NAME resnet_speed_check_${name}
           COMMAND ${CMAKE_COMMAND} -DCMD=${CMAKE_SOURCE_DIR}/tools/resnet_speed_check.sh "-DARGS=${args}"
                   -DCODE=${code} -DSTREAM=${stream} "-DEXPECT=${regex}" -P ${CMAKE_CURRENT_LIST_DIR}/expect_exit.cmake
           WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
  set_tests_properties(resnet_speed_check_${name} PROPERTIES LABELS "gpu_check;needs_no_exercise")
endfunction()
speed_check_expect(help         0 stdout "^usage: resnet_speed_check.sh"                 --help)
speed_check_expect(bad_epochs   2 stderr "--epochs needs a positive integer, got '0'"     --epochs 0)
speed_check_expect(unknown      2 stderr "unknown option '--bogus'"                       --bogus)
speed_check_expect(missing_out  2 stderr "--out needs a value"                            --out)
