# --- Chapter 10: raw CUDA kernels against chapter 09's (included by tests/CMakeLists.txt).
# On every build: each kernel's per-thread function, called for every index on the host, against
# chapter 09's kernel on a device (the index arithmetic, also under the asan and gpu-mapping
# presets), and the launchers ("raw kernels: *") against chapter 09's kernels: on the CPU in the
# cpu build, on the GPU in the cuda build. The cuda build also runs the launchers' cases alone as
# fast_kernels_on_gpu: skipped where no GPU answers (and, in the cpu build, listed as skipped,
# saying why), never counted as passed.
mgpu_test(test_fast_kernels DEVICE LIBS mgpu_fast_kernels)
# The tensor-core convolution (implicit_gemm.h): the mma fragments' layout and the instruction's
# host model, then the convolution against chapter 09's on bf16-rounded inputs (the host model on
# a CPU, the mma.sync kernels on a GPU of compute capability 8.0 or later).
mgpu_test(test_implicit_gemm DEVICE LIBS mgpu_fast_kernels)
# The classroom kit's exercises of this chapter: two element functions, graded on any build.
mgpu_exercise(ex10.im2col_element test_fast_kernels "element bodies: im2col_element*")
mgpu_exercise(ex10.col2im_element test_fast_kernels "element bodies: col2im_element*"
              "raw kernels: im2col_raw and col2im_raw*")
mgpu_exercise(ex10.apply_vec4 test_fast_kernels "element bodies: apply_element and apply_vec4*"
              "raw kernels: batch_norm_apply_raw*")
if(MGPU_BACKEND_RESOLVED STREQUAL "cuda")
  add_test(NAME fast_kernels_on_gpu COMMAND test_fast_kernels "--test-case=raw kernels:*"
           WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
  set_tests_properties(fast_kernels_on_gpu PROPERTIES SKIP_RETURN_CODE 77 FAIL_REGULAR_EXPRESSION "test cases: +0 +[|]")
else()
  add_test(NAME fast_kernels_on_gpu COMMAND ${CMAKE_COMMAND} -E echo "the raw CUDA kernels need the cuda build on a GPU")
  set_tests_properties(fast_kernels_on_gpu PROPERTIES SKIP_REGULAR_EXPRESSION "need the cuda build on a GPU")
endif()

# The benchmark's command line: each refusal says why and exits 2; a tiny run ends with its
# result line (the cpu build: the references only).
expect_exit(10_fast_kernels help          0 stdout "Usage: 10_fast_kernels.*--batch-size.*--kernels" --help)
expect_exit(10_fast_kernels batch_zero    2 stderr "--batch-size: must be at least 1, got 0" --batch-size 0)
expect_exit(10_fast_kernels batch_big     2 stderr "--batch-size: must be at most 1024, got 4096" -b 4096)
expect_exit(10_fast_kernels batch_text    2 stderr "--batch-size: needs an integer, got 'many'" -b many)
expect_exit(10_fast_kernels iters_negative 2 stderr "--iters: must be zero or more, got -1" --iters -1)
expect_exit(10_fast_kernels kernels_bad   2 stderr "--kernels: needs a comma-separated list of im2col, col2im, sums, backward, apply; got 'im2col,gemm'"
            --kernels im2col,gemm)
expect_exit(10_fast_kernels no_timing     2 stderr "--iters 0 .* give --warmup 1 or more, or --iters N" --warmup 0)
expect_exit(10_fast_kernels unknown_flag  2 stderr "unknown option '--bogus'" --bogus)
expect_exit(10_fast_kernels run_small     0 stdout "im2col +64ch 28x28 k3 s1 p1 +reference.*result: chapter=10_fast_kernels .*batch=2 .*wrong=0"
            -b 2 -w 1 -n 2 --out ${test_results}/10_fast_kernels)

# The chapter's results script in its quick form (batch 8), checked as every chapter's is.
figures_test(10_fast_kernels kernels ${test_results}/10_figures)
