# --- The tools' own safety (scripts in tests/tools/, each a few seconds, none needs the network
# or a GPU): a tool deletes or replaces only what it can prove it made, and says plainly when it
# cannot write where it writes.

# tools/offline_kit.sh: someone else's folder (a MANIFEST of theirs) or DIR.partial is refused
# and left as it was; its own kit is replaced; its unfinished DIR.partial removed, after a
# failure, a SIGTERM, or by the next run. A stand-in apt-get makes the packages: nothing is
# downloaded. Skipped (77) where dpkg-deb is missing.
add_test(NAME offline_kit_ownership COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/tools/offline_kit_ownership.sh)
set_tests_properties(offline_kit_ownership PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 60)

# tools/grade.sh: a build folder it cannot write in (made so with a file where a folder must be:
# root ignores permissions) is named as such, status 3, no exercise marked failed; not
# configured, unreadable by ctest, without exercise tests, or on a machine without jq: status 2,
# each its own message. (This test itself needs jq: skipped without it, as the kit's tests are.)
add_test(NAME grade_messages COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/tools/grade_messages.sh)
set_tests_properties(grade_messages PROPERTIES TIMEOUT 60 SKIP_RETURN_CODE 77)  # 77: no jq

# tools/classroom/student_copy: a copy that fails (under a file size limit: a real write error,
# no hook in the program) removes what it wrote, one that is killed leaves a mark its next run
# recognises, and either way the retry writes the copy; other non-empty folders are refused and
# left as they were.
add_test(NAME student_copy_retry COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/tools/student_copy_retry.sh $<TARGET_FILE:student_copy>)
set_tests_properties(student_copy_retry PROPERTIES TIMEOUT 60)

# tools/figures_common.sh: the figure scripts refuse a tree with uncommitted changes (a modified
# or an untracked file; not the chapters' figures/ folders) before they run or write anything;
# MGPU_FIGURES_ALLOW_DIRTY=1 lets them go on, and tools/machine_stamp.sh's stamp then says so.
# In a small git repository made for the test; skipped (77) where git is missing.
add_test(NAME figures_refuse_dirty_tree COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/tools/figures_refuse_dirty_tree.sh)
set_tests_properties(figures_refuse_dirty_tree PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 60)

# Every test that writes results writes a folder of its own (tests/CMakeLists.txt's
# own_results_folder): the check over this build's tests, and the check seen to fail on a made-up
# list where three tests write one folder (one test naming its folder twice is one writer).
add_test(NAME tests_own_results_folders
         COMMAND ${CMAKE_COMMAND} -DCTEST=${CMAKE_CTEST_COMMAND} -DBUILD=${CMAKE_BINARY_DIR}
                 -P ${CMAKE_CURRENT_SOURCE_DIR}/results_folders_check.cmake)
set_tests_properties(tests_own_results_folders PROPERTIES LABELS needs_no_exercise)
add_test(NAME tests_own_results_folders_seen_failing
         COMMAND ${CMAKE_COMMAND} -DJSON_FILE=${CMAKE_CURRENT_SOURCE_DIR}/fixtures/shared_results.json
                 -P ${CMAKE_CURRENT_SOURCE_DIR}/results_folders_check.cmake)
set_tests_properties(tests_own_results_folders_seen_failing PROPERTIES LABELS needs_no_exercise
                     PASS_REGULAR_EXPRESSION "/tmp/r/one: one_run, same_as_one, killed\n"
                     FAIL_REGULAR_EXPRESSION "/tmp/r/two|each written by one test")

# tools/check_figure_ages.sh: every figure a chapter README shows has a stamp naming a commit of
# this history (a failure otherwise); the figures older than their chapter's code are listed in
# the log (check them with --strict before a release: make_all_figures.sh measures them again).
# Its own check on a small repository made for the test: current, aged, unknown, unstamped.
add_test(NAME figure_ages COMMAND ${CMAKE_SOURCE_DIR}/tools/check_figure_ages.sh)
set_tests_properties(figure_ages PROPERTIES LABELS readme SKIP_RETURN_CODE 77 TIMEOUT 60)
add_test(NAME figure_ages_seen_failing COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/tools/figure_ages.sh)
set_tests_properties(figure_ages_seen_failing PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 60)

# tools/check_readme_commands.sh seen failing: a made-up page with a working run, a refused flag,
# sudo, an unknown command, a cuda program and the reader of what it writes (a few seconds).
add_test(NAME readme_commands_seen_failing
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/tools/readme_commands_seen_failing.sh ${CMAKE_BINARY_DIR})
set_tests_properties(readme_commands_seen_failing PROPERTIES LABELS readme TIMEOUT 120)
# Every integer flag reads its value through mgpu::integer as a transform (common/cli.h): as a
# check, CLI11 would convert the text as typed, in base 0, and "-b 0064" would train with batch 52.
add_test(NAME integer_flags_are_transforms
         COMMAND sh -c "if grep -rnE 'check\\((mgpu::)?integer\\(' --include=*.cpp --include=*.h chapters common tools; then echo 'the integer flags above are checks: make them ->transform(mgpu::integer(...))'; exit 1; fi"
         WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
set_tests_properties(integer_flags_are_transforms PROPERTIES LABELS needs_no_exercise)
