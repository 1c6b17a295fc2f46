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
