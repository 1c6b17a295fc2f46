# --- Chapter 09: ResNet-18 from a layer library (included by tests/CMakeLists.txt).
# Both suites link chapter 10's tables of layer kernels (mgpu_fast_kernels, which carries chapter
# 09's library): their cases that hold every registered table against the reference then have
# tables to check. Chapter 09's program and library themselves never name chapter 10.
mgpu_test(test_resnet_layers DEVICE LIBS mgpu_fast_kernels)  # each layer against plain loops and finite differences
mgpu_test(test_resnet DEVICE LIBS mgpu_fast_kernels)  # the network: gradients, SyncBN, evaluation mode
# Chaos mode (see tests/CMakeLists.txt) for the cases where devices wait for each other: the
# SyncBN allreduces between layers and the gradient allreduce. (The finite-difference case
# queues thousands of operations on one device: under random delays it would take minutes and
# order nothing.)
if(MGPU_BACKEND_RESOLVED STREQUAL "cpu")
  foreach(seed ${mgpu_chaos_seeds})
    add_test(NAME test_resnet_chaos${seed} COMMAND test_resnet "--test-case=SyncBN*,per-device*,training*"
             WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
    set_tests_properties(test_resnet_chaos${seed} PROPERTIES ENVIRONMENT MGPU_CHAOS=${seed} LABELS chaos
                         FAIL_REGULAR_EXPRESSION "test cases: +0 +[|]")
  endforeach()
endif()

mgpu_exercise(ex09.batch_norm_backward test_resnet_layers "BatchNorm training*" "SyncBN's arithmetic*")
mgpu_exercise(ex09.sync_batch_norm     test_resnet "SyncBN:*" "training: three SGD steps*")

# The program's command line: each refusal says why and exits 2.
set(resnet_short --width 2 --epochs 1 --limit-train 512 --out ${test_results})
expect_exit(09_resnet help          0 stdout "Usage: 09_resnet.*--lr FLOAT:positive=0.1 .*--width INT:.1, 1024.=64 .*--bn TEXT:.device,sync.=device" --help)
expect_exit(09_resnet width_zero    2 stderr "--width: must be at least 1, got 0" --width 0)
expect_exit(09_resnet width_text    2 stderr "--width: needs an integer, got 'wide'" --width wide)
expect_exit(09_resnet width_big     2 stderr "--width: must be at most 1024, got 2048" --width 2048)
expect_exit(09_resnet bn_bad        2 stderr "--bn: global not in \\{device,sync\\}" --bn global)
expect_exit(09_resnet allreduce_bad 2 stderr "--allreduce: tree not in \\{ring,naive,nccl\\}" --allreduce tree)
expect_exit(09_resnet precision_bad 2 stderr "--precision: fp16 not in \\{fp32,tf32,bf16\\}" --precision fp16)
expect_exit(09_resnet profile_bad   2 stderr "--profile: 1 not in \\{on,off\\}" --profile 1)
expect_exit(09_resnet kernels_bad   2 stderr "--kernels: fast not in \\{reference,raw,tiled,tensor\\}" --kernels fast)
expect_exit(09_resnet graph_bad     2 stderr "--graph: yes not in \\{on,off\\}" --graph yes)
expect_exit(09_resnet graph_devices 2 stderr "--graph on records one device's step: it runs with --devices 1 \\(got 2\\)" --graph on --devices 2)
expect_exit(09_resnet kernels_precision 2 stderr "--kernels tensor multiplies its convolutions in bf16: add --precision bf16" --kernels tensor)
# Chapter 10's tensor-core table end to end, one step (the host model on a CPU): no evaluation,
# which the host model would take minutes over. The cpu build only: on a GPU it needs bf16 tensor
# cores (compute capability 8.0), and tools/resnet_speed_check.sh runs it there.
if(NOT MGPU_BACKEND_RESOLVED STREQUAL "cuda")
  expect_exit(09_resnet tensor_one_step 0 stdout "layer kernels: tensor \\(bf16 in the convolutions it takes\\).*wrote one training step of 8 images"
              --kernels tensor --precision bf16 --width 16 -b 8 --dump-step ${test_results}/09_tensor_step)
endif()
expect_exit(09_resnet dump_empty    2 stderr "--dump-step needs a value" --dump-step=)
expect_exit(09_resnet batch_small   2 stderr "--batch-size 1 is smaller than --devices 2" --batch-size 1 --devices 2)
if(NOT MGPU_HAVE_NCCL)
  expect_exit(09_resnet nccl_here   2 stderr "--allreduce nccl needs the cuda build with NCCL" --allreduce nccl)
endif()
expect_exit(09_resnet no_data       1 stderr "--data-dir /nonexistent: no such directory" ${resnet_short} --data-dir /nonexistent)
expect_exit(09_resnet last_batch_small 1 stderr "leave a last batch of 1 example.s. in every epoch"
            --width 2 --limit-train 1001 --batch-size 250 --devices 4)
# Short runs: one device; two devices with SyncBN through chapter 02's naive collective; the
# one-step profile; a dump for crosscheck.py.
# The table of layer kernels a run takes when none is named: chapter 10's fastest for this build
# (raw on a GPU, tiled on a CPU), which the program names in its banner.
if(MGPU_BACKEND_RESOLVED STREQUAL "cuda")
  set(resnet_default_kernels raw)
else()
  set(resnet_default_kernels tiled)
endif()
expect_exit(09_resnet run_k1        0 stdout "kernels: ${resnet_default_kernels}.*result: chapter=09_resnet .*devices=1 .*test_acc="
            ${resnet_short})
# --precision bf16: the GEMMs' inputs on tensor cores on a GPU; the cpu build says it multiplies fp32.
expect_exit(09_resnet run_bf16      0 stdout "GEMMs: (fp32 .--precision chooses for GPUs only.|bf16 inputs on tensor cores).*result: chapter=09_resnet"
            ${resnet_short} --precision bf16)
expect_exit(09_resnet run_k2_sync   0 stdout "SyncBN.*naive.*result: chapter=09_resnet .*devices=2 "
            ${resnet_short} --devices 2 --bn sync --allreduce naive --batch-size 64)
expect_exit(09_resnet profile       0 stdout "device 0's kernels.*Im2col.*without the profile's timers"
            ${resnet_short} --profile on --epochs 1 --limit-train 64)
# --kernels raw: chapter 10's kernels do the layout and BatchNorm work (on a CPU, their per-thread
# code, slowly: one profiled step and one dumped step, no epoch and no evaluation).
expect_exit(09_resnet run_raw       0 stdout "kernels: raw.*Im2colKernel.*without the profile's timers.*wrote one training step of 8 images"
            --width 2 --limit-train 64 --batch-size 8 --kernels raw --profile on
            --dump-step ${test_results}/09_dump_raw)
# --kernels reference: chapter 09's own functors (one profiled step and one dumped step).
expect_exit(09_resnet run_reference 0 stdout "kernels: reference.*Im2col .*without the profile's timers.*wrote one training step of 8 images"
            --width 2 --limit-train 64 --batch-size 8 --kernels reference --profile on
            --dump-step ${test_results}/09_dump_reference)
expect_exit(09_resnet dump          0 stdout "wrote one training step of 8 images on 2 device"
            --width 2 --limit-train 64 --batch-size 8 --devices 2 --bn sync
            --dump-step ${test_results}/09_dump)

# One training step against PyTorch's (crosscheck.py): skipped where python3-torch is missing,
# as on CI's machines.
add_test(NAME 09_resnet_crosscheck_torch
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/resnet_crosscheck.sh ${CMAKE_BINARY_DIR}
                 ${test_results}/09_crosscheck)
set_tests_properties(09_resnet_crosscheck_torch PROPERTIES LABELS torch SKIP_RETURN_CODE 77
                     SKIP_REGULAR_EXPRESSION "no GPU answers")

# The results script's machinery on tiny runs (the twin target needs python3-torch, and is left
# out here so that the test runs everywhere).
figures_test(09_resnet d2l ${CMAKE_BINARY_DIR}/test-figures-09)
