# --- Chapter 06: mixed precision and gradient accumulation (included by tests/CMakeLists.txt).
if(TARGET 06_mixed_precision)
  # The suite skips its real-data case (doctest::skip); it runs on its own (~15 s on two cores).
  mgpu_test(test_mixed_precision DEVICE LIBS mgpu_mixed_precision)
  add_test(NAME test_mixed_precision_real_data COMMAND test_mixed_precision "--test-case=real data*" --no-skip
           WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
  set_tests_properties(test_mixed_precision_real_data PROPERTIES SKIP_RETURN_CODE 77)
  mgpu_chaos_tests(test_mixed_precision)

  # ex06.to_bf16 holds the three roundings of formats.h: bf16's, tf32's and fp16's helper.
  mgpu_exercise(ex06.to_bf16             test_mixed_precision "bf16:*" "tf32:*" "fp16:*")
  mgpu_exercise(ex06.loss_scaler_update  test_mixed_precision "unscale_and_check:*" "LossScaler: an overflow*"
                "LossScaler: the scale*" "a skipped step*" "an inf on one device*")
  mgpu_exercise(ex06.ring16              test_mixed_precision "Ring16Allreduce:*")
  mgpu_exercise(ex06.accumulate          test_mixed_precision "accumulation:*")

  # The program's command line: each refusal says why and exits 2.
  expect_exit(06_mixed_precision help              0 stdout "Usage: 06_mixed_precision"  --help)
  expect_exit(06_mixed_precision precision_bad     2 stderr "--precision: fp8 not in \\{fp32,tf32,bf16,fp16\\}"
              --precision fp8)
  expect_exit(06_mixed_precision loss_scale_bad    2 stderr "--loss-scale: static not in \\{dynamic,none\\}"
              --loss-scale static)
  expect_exit(06_mixed_precision grad_bits_bad     2 stderr "--grad-bits: 8 not in \\{32,16\\}" --grad-bits 8)
  expect_exit(06_mixed_precision grad_bits_fp32    2 stderr "--grad-bits 16 needs --precision bf16 or fp16"
              --precision fp32 --grad-bits 16)
  expect_exit(06_mixed_precision accumulate_zero   2 stderr "--accumulate: must be at least 1, got 0" --accumulate 0)
  expect_exit(06_mixed_precision accumulate_text   2 stderr "--accumulate: needs an integer, got 'two'" --accumulate two)
  expect_exit(06_mixed_precision growth_zero       2 stderr "--scale-growth-interval: must be at least 1, got 0"
              --scale-growth-interval 0)
  expect_exit(06_mixed_precision initial_scale_neg 2 stderr "--initial-scale" --initial-scale -1)
  expect_exit(06_mixed_precision loss_bad          2 stderr "--loss: avg not in \\{sum,mean\\}" --loss avg)
  expect_exit(06_mixed_precision devices_zero      2 stderr "--devices: must be at least 1, got 0" --devices 0)
  expect_exit(06_mixed_precision allreduce_bad     2 stderr "--allreduce: mpi not in \\{ring,nccl\\}"
              --allreduce mpi)
  if(NOT TARGET mgpu_nccl_allreduce)
    expect_exit(06_mixed_precision nccl_without_nccl 2 stderr "--allreduce nccl needs a cuda build with NCCL"
                --allreduce nccl)
  endif()
  # A short run in fp16 on 2 devices with 2 micro-batches a step: the two result lines.
  expect_exit(06_mixed_precision short_run 0 stdout
              "result: chapter=06_mixed_precision backend=[a-z]+ devices=2 .*\nmixed: precision=fp16 loss_scaling=dynamic grad_bits=16 accumulate=2"
              --precision fp16 --accumulate 2 --epochs 1 --limit-train 512 --batch-size 32
              --out ${test_results})
endif()
