# --- Chapter 11: sharded data parallelism (included by tests/CMakeLists.txt).
# The optimizers with state it teaches (common/optimizer.h), against PyTorch's numbers in
# tests/fixtures/optimizers_torch.txt: on every build, no PyTorch needed.
mgpu_test(test_optimizer DEVICE)
set_tests_properties(test_optimizer PROPERTIES LABELS needs_no_exercise)
# The fixture is what this machine's PyTorch computes: chapters/11_sharded_data_parallel/
# optimizers_torch.py runs torch.optim and compares (label "torch"; skipped without PyTorch).
add_test(NAME optimizers_torch_fixture
         COMMAND /usr/bin/python3 ${CMAKE_SOURCE_DIR}/chapters/11_sharded_data_parallel/optimizers_torch.py
                 --check ${CMAKE_SOURCE_DIR}/tests/fixtures/optimizers_torch.txt)
set_tests_properties(optimizers_torch_fixture PROPERTIES LABELS torch SKIP_RETURN_CODE 77)
# The chapter's trainer: layout, collectives, bytes held and sent, ZeRO-1 against DDP.
mgpu_test(test_sharded DEVICE LIBS mgpu_sharded)

# The program's own flags: each bad value refused by name before anything runs, and short runs.
set(zero_short --epochs 1 --limit-train 512 --out ${test_results})
expect_exit(11_sharded_data_parallel help          0 stdout "Usage: 11_sharded_data_parallel.*--zero.*--clip-norm" --help)
expect_exit(11_sharded_data_parallel zero_bad      2 stderr "--zero: must be at most 1, got 2" --zero 2)
expect_exit(11_sharded_data_parallel zero_neg      2 stderr "--zero: must be zero or more, got -1" --zero -1)
expect_exit(11_sharded_data_parallel zero_one_device 2 stderr "--zero 1 shards the optimizer state over the devices: with --devices 1"
            --zero 1 --devices 1)
expect_exit(11_sharded_data_parallel optimizer_bad 2 stderr "--optimizer: adam not in \\{adamw,sgd\\}" --optimizer adam)
expect_exit(11_sharded_data_parallel momentum_adamw 2 stderr "--momentum is SGD's" --momentum 0.5)
expect_exit(11_sharded_data_parallel momentum_high 2 stderr "--momentum: must be at most 0.999, got 1" --optimizer sgd --momentum 1)
expect_exit(11_sharded_data_parallel decay_neg     2 stderr "--weight-decay: must be zero or more, got -0.1" --weight-decay -0.1)
expect_exit(11_sharded_data_parallel clip_neg      2 stderr "--clip-norm: must be zero or more, got -1" --clip-norm -1)
expect_exit(11_sharded_data_parallel clip_nan      2 stderr "--clip-norm" --clip-norm nan)
# A short run of each stage: the model state each device held, by the allocator's count, equals
# the formula (2 devices, AdamW: 2,067,456 bytes for DDP, 1,550,592 for ZeRO-1), and the bytes sent.
expect_exit(11_sharded_data_parallel zero0_run 0 stdout
            "sharding: zero=0 optimizer=adamw devices=2 model_state_bytes=2067456 formula_bytes=2067456 bytes_sent_per_step=516864"
            ${zero_short} --zero 0)
expect_exit(11_sharded_data_parallel zero1_run 0 stdout
            "sharding: zero=1 optimizer=adamw devices=2 model_state_bytes=1550592 formula_bytes=1550592 bytes_sent_per_step=516864"
            ${zero_short} --zero 1)
expect_exit(11_sharded_data_parallel zero1_sgd_k3 0 stdout
            "sharding: zero=1 optimizer=sgd devices=3 model_state_bytes=1206016 formula_bytes=1206016 bytes_sent_per_step=689152"
            ${zero_short} --zero 1 --devices 3 --optimizer sgd --lr 0.05 --clip-norm 1)
