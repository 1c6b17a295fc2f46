# The PyTorch twin of chapters 02 and 05: chapters/02_data_parallel/ddp_torch.py, DDP with one
# process per device, started by torchrun (chapter 02) or mpirun (chapter 05), and each
# chapter's compare.sh. Label "torch": they need Debian's python3-torch and show as skipped where
# /usr/bin/python3 cannot import torch, as on CI's machines. DDP's processes take both cores of a
# small machine, so each test claims 2 processors. The compare scripts run the C++ programs too,
# which in a cuda build where no GPU answers stop there: skipped as well.
set(ddp_twin ${CMAKE_SOURCE_DIR}/chapters/02_data_parallel/ddp_torch.py)
set(ddp_tiny --epochs 1 --limit-train 512 --batch-size 64)  # 8 steps of 32 examples per process
list(JOIN ddp_tiny " " ddp_tiny_words)  # the same, inside one quoted -DARGS=...
set(ddp_results ${test_results})

# Its command line, refused before any process group is joined (a world of one, no launcher).
function(ddp_twin_refuses name regex)
  list(JOIN ARGN " " args)
  add_test(NAME ddp_torch_${name}
           COMMAND ${CMAKE_COMMAND} -DCMD=/usr/bin/python3 "-DARGS=${ddp_twin} ${args}" -DCODE=2 -DSTREAM=stderr
                   "-DEXPECT=${regex}" -P ${CMAKE_CURRENT_SOURCE_DIR}/expect_exit.cmake)
  set_tests_properties(ddp_torch_${name} PROPERTIES LABELS torch SKIP_REGULAR_EXPRESSION "No module named 'torch'")
endfunction()
ddp_twin_refuses(devices_mismatch "--devices 2, but no launcher started this process .a world of one.: start 2"
                 --devices 2)
ddp_twin_refuses(epochs_zero "--epochs: expected a positive integer, got '0'" --epochs 0)
# An empty folder or name (chapter 01's given_text, which every twin uses for them), as the C++
# programs refuse it.
ddp_twin_refuses(out_empty "argument --out: expected a value, got an empty one" --out=)

# Chapter 02's launch: torchrun, 2 processes.
add_test(NAME 02_ddp_torch_twin
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/ddp_twin.sh torchrun 2 ${ddp_results}/02_ddp_torch --devices 2 ${ddp_tiny})
set_tests_properties(02_ddp_torch_twin PROPERTIES LABELS torch SKIP_RETURN_CODE 77 TIMEOUT 300 PROCESSORS 2)

# A chapter's compare.sh: its C++ program on 2 devices beside the twin on 2 processes, the table
# and the ratio (and the plot, where gnuplot is), with `environment` (a list) set for it.
function(ddp_compare_test chapter program environment)
  add_test(NAME ${program}_compare_torch
           COMMAND ${CMAKE_COMMAND} -DCMD=${CMAKE_SOURCE_DIR}/chapters/${chapter}/compare.sh
                   "-DARGS=${CMAKE_BINARY_DIR} -- --devices 2 ${ddp_tiny_words} --out ${ddp_results}/${program}_compare_torch"
                   -DCODE=0 -DSTREAM=stdout
                   "-DEXPECT=${chapter} +[a-z]+ +0\\.[0-9]+ +[0-9.]+\npytorch twin +torch-[a-z]+ +0\\.[0-9]+ +[0-9.]+\nPyTorch / C\\+\\+ time per epoch: [0-9.]+x"
                   -P ${CMAKE_CURRENT_SOURCE_DIR}/expect_exit.cmake
           WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
  set_tests_properties(${program}_compare_torch PROPERTIES LABELS torch
                       SKIP_REGULAR_EXPRESSION "cannot import torch;no GPU answers" TIMEOUT 300 PROCESSORS 2
                       ENVIRONMENT "${environment}")
endfunction()
ddp_compare_test(02_data_parallel 02 "")

# Chapter 05's launch: mpirun, 2 processes, as its C++ program's tests start it (mpi_env,
# mpi_preflags: tests/CMakeLists.txt).
if(TARGET 05_multi_process AND MPIEXEC_EXECUTABLE)
  add_test(NAME 05_ddp_torch_twin
           COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/ddp_twin.sh mpirun 2 ${ddp_results}/05_ddp_torch --devices 2 ${ddp_tiny})
  set_tests_properties(05_ddp_torch_twin PROPERTIES LABELS torch SKIP_RETURN_CODE 77 TIMEOUT 300 PROCESSORS 2
                       ENVIRONMENT "${mpi_env};MGPU_MPIRUN_FLAGS=${mpi_preflags}")
  ddp_compare_test(05_multi_process 05 "${mpi_env};MGPU_MPIRUN_FLAGS=${mpi_preflags}")
endif()
