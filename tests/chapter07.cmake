# Chapter 07: model parallelism and pipelines (included at the end of tests/CMakeLists.txt).
mgpu_test(test_model_parallel DEVICE LIBS mgpu_model_parallel)
mgpu_chaos_tests(test_model_parallel)  # the events between stages, under random delays

# The assignment, ex07.pipeline (the schedules, the memory they need, the host's queueing and the
# sends between stages), and its warm-up, ex07.bubble. Their graded cases: tests/CMakeLists.txt.
mgpu_exercise(ex07.pipeline test_model_parallel "schedules:*" "activation memory:*" "split training:*" "pipelines:*"
              "hybrid:*" "evaluation through the pipeline*" "timeline:*")
mgpu_exercise(ex07.bubble   test_model_parallel "bubble:*")

set(mp_short --epochs 1 --limit-train 512 --profile-steps 2 --out ${test_results})
expect_exit(07_model_parallel help             0 stdout "Usage: 07_model_parallel.*--micro-batches" --help)
expect_exit(07_model_parallel split_zero       2 stderr "--split: 0: a cut must name a layer from 1 to 3" --split 0)
expect_exit(07_model_parallel split_four       2 stderr "--split: 4: a cut must name a layer from 1 to 3" --split 4)
expect_exit(07_model_parallel split_word       2 stderr "--split: needs layer numbers separated by commas" --split conv)
expect_exit(07_model_parallel split_order      2 stderr "--split: 3,1: the cuts must increase" --devices 3 --split 3,1)
expect_exit(07_model_parallel split_count      2 stderr "--split names 2 cut.s., but 2 stage.s. need 1" --split 1,2)
expect_exit(07_model_parallel micro_zero       2 stderr "--micro-batches: must be at least 1, got 0" --micro-batches 0)
expect_exit(07_model_parallel micro_word       2 stderr "--micro-batches: needs an integer, got 'many'" --micro-batches many)
expect_exit(07_model_parallel micro_too_many   2 stderr "--micro-batches 300 is more than the 256 examples"
            --micro-batches 300)
expect_exit(07_model_parallel micro_naive      2 stderr "--schedule naive runs the whole batch at once"
            --schedule naive --micro-batches 4)
expect_exit(07_model_parallel schedule_bad     2 stderr "--schedule: zb not in \\{naive,gpipe,1f1b\\}"
            --schedule zb)
expect_exit(07_model_parallel devices_zero     2 stderr "--devices: must be at least 1, got 0" --devices 0)
expect_exit(07_model_parallel devices_five     2 stderr "makes 5 stages; LeNet has 4 layers" --devices 5)
expect_exit(07_model_parallel profile_negative 2 stderr "--profile-steps: must be zero or more, got -1" --profile-steps -1)
expect_exit(07_model_parallel eval_refused     2 stderr "--eval is not an option of 07_model_parallel" --eval device0)
expect_exit(07_model_parallel replicas_zero    2 stderr "--data-parallel: must be at least 1, got 0" --data-parallel 0)
expect_exit(07_model_parallel replicas_uneven  2 stderr "--devices 3 is not a multiple of --data-parallel 2"
            --devices 3 --data-parallel 2)
# Short runs: the bubble lines for both stages, 1F1B's smaller memory, and the hybrid.
expect_exit(07_model_parallel gpipe_run  0 stdout "bubble: schedule=gpipe stages=2 micro_batches=4 replicas=1 stage=1 .*result:"
            ${mp_short})
expect_exit(07_model_parallel 1f1b_run   0 stdout "stage 0 keeps 2 micro-batch.es. of activations.*bubble: schedule=1f1b"
            ${mp_short} --schedule 1f1b)
expect_exit(07_model_parallel hybrid_run 0 stdout "2 stage.s. x 2 replica.s.*result: .*devices=4"
            ${mp_short} --devices 4 --data-parallel 2)

# The figures script, on tiny runs (figures label: not part of the quick test run).
figures_test(07_model_parallel all ${CMAKE_BINARY_DIR}/test-figures-07)
