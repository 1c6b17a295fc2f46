# --- Chapter 05: every rank must run the same training (included by tests/CMakeLists.txt in
# chapter 05's block, whose mpi_test(), ${short}, ${mpi_launch} and ${mpi_env} it uses).
#
# Each rank parses its own command line, and mpiexec's "A : B" form gives rank 0 and rank 1
# different ones. At start-up every rank compares its settings with all the others'
# (chapters/05_multi_process/options.h); on a difference every rank stops at once, status 2,
# and rank 0 names the option, the values and the ranks. Before the check, ranks that differed
# in --epochs hung (rank 0 finished, rank 1 waited forever for the next epoch), and ranks that
# differed in --lr passed, training with rank 0's rate and reporting only rank 0's settings.
mgpu_test(test_rank_settings LIBS mgpu_multi_process)  # the comparison itself, pure
set_tests_properties(test_rank_settings PROPERTIES LABELS needs_no_exercise)  # no exercise's code

# ranks_disagree(<name> <code> <regex> <rank 1's options>...): rank 0 runs ${short}, rank 1 ${short}
# and its own options (the last of a repeated option wins).
function(ranks_disagree name code regex)
  mpi_test(05_multi_process_ranks_${name} 1 ${code} "${regex}" 05_multi_process ${short}
           : ${MPIEXEC_NUMPROC_FLAG} 1 $<TARGET_FILE:05_multi_process> ${short} ${ARGN})
endfunction()
set(same_options "; every rank must be started with the same options")
ranks_disagree(disagree_epochs 2 "ranks disagree on --epochs: rank 0 has 1, rank 1 has 2${same_options}" --epochs 2)
ranks_disagree(disagree_batch_size 2 "ranks disagree on --batch-size: rank 0 has 64, rank 1 has 32" --batch-size 32)
ranks_disagree(disagree_lr 2 "ranks disagree on --lr: rank 0 has 0.2, rank 1 has 0.1${same_options}" --lr 0.1)
ranks_disagree(disagree_seed 2 "ranks disagree on --seed: rank 0 has 42, rank 1 has 7" --seed 7)
# Options a rank may have to itself (only rank 0 writes and draws): the run goes on.
ranks_disagree(agree_per_rank_options 0 "result: chapter=05_multi_process backend=[a-z]+ devices=2 "
               --out ${test_results}/rank1 --progress off)

# The same options, different data: rank 1 reads a folder whose training files are the test
# set's (tests/ranks_data_check.cmake makes it). Both have 512 training images of 28x28; the
# checksums differ, and every rank stops with status 1.
set(short_words ${short})
own_results_folder(short_words 05_multi_process_ranks_disagree_data)
list(JOIN short_words " " short_words)
add_test(NAME 05_multi_process_ranks_disagree_data
         COMMAND ${CMAKE_COMMAND} "-DLAUNCH=${mpi_launch} 1 ${mpi_preflags}" -DPROGRAM=$<TARGET_FILE:05_multi_process>
                 "-DSHORT=${short_words}" -DNUMPROC_FLAG=${MPIEXEC_NUMPROC_FLAG}
                 -DOUT=${test_results}/ranks_data
                 -DSOURCE_DIR=${CMAKE_SOURCE_DIR} -P ${CMAKE_CURRENT_SOURCE_DIR}/ranks_data_check.cmake
         WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
set_tests_properties(05_multi_process_ranks_disagree_data PROPERTIES TIMEOUT 90 ENVIRONMENT "${mpi_env}"
                     SKIP_REGULAR_EXPRESSION "mpiexec not found;no GPU answers;Fashion-MNIST not found")
