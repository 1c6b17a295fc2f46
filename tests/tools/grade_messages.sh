#!/usr/bin/env bash
# tools/grade.sh says what went wrong: a build folder it cannot write in is named as such
# (status 3) and no exercise is marked failed, since none ran; so is a log it cannot write
# midway; a folder that is not configured, that ctest cannot read, or that has no exercise
# tests is told apart from it (status 2), and so is a machine without jq; a writable one is
# graded as before.
#
#   grade_messages.sh      (a second or two)
#
# The build folders are made here: a CTestTestfile.cmake with two exercise tests (`true` and
# `false`) and one other, which ctest reads as it reads a configured build's.
#
# "Cannot write" is made without chmod: the tests may run as root, and root writes into a
# read-only folder all the same. Instead, the folder grade.sh must write in is a path whose
# parent is a regular file (BUILD_DIR/grade, or BUILD_DIR/Testing, made a file), where no one,
# root included, can make a file. Exit status 0 passed, 1 failed.
set -euo pipefail
# tools/grade.sh reads ctest's list of tests and writes its JSON with jq: without it, skipped (77).
command -v jq >/dev/null || { echo "SKIPPED: needs jq, which tools/grade.sh uses (apt-get install jq)"; exit 77; }

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
grade="$repo_root/tools/grade.sh"
work=$(mktemp -d "${TMPDIR:-/tmp}/mgpu-grade.XXXXXX")
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# fake_build FOLDER [exercises|none]: a build folder as ctest sees one
fake_build() {
  mkdir -p "$1"
  {
    if [ "${2:-exercises}" = exercises ]; then
      printf 'add_test(ex01.passes "%s")\n' "$(command -v true)"
      printf 'set_tests_properties(ex01.passes PROPERTIES LABELS "exercise;ex01.passes")\n'
      printf 'add_test(ex01.fails "%s")\n' "$(command -v false)"
      printf 'set_tests_properties(ex01.fails PROPERTIES LABELS "exercise;ex01.fails")\n'
    fi
    printf 'add_test(not_an_exercise "%s")\n' "$(command -v true)"
  } >"$1/CTestTestfile.cmake"
}
# run NAME BUILD: grade.sh on BUILD, its output in $work/NAME.out, its status in $status
run() {
  status=0
  "$grade" "$2" >"$work/$1.out" 2>&1 || status=$?
}
expect() {  # NAME STATUS REGEX [REJECT]: the last run ended with STATUS, said REGEX, not REJECT
  if [ "$status" -ne "$2" ]; then fail "$1: status $status, expected $2"; cat "$work/$1.out"; return; fi
  grep -Eq "$3" "$work/$1.out" || { fail "$1: the output does not say '$3'"; cat "$work/$1.out"; }
  if [ -n "${4:-}" ] && grep -Eq "$4" "$work/$1.out"; then fail "$1: the output says '$4'"; cat "$work/$1.out"; fi
}

echo "-- a writable build: graded (one passes, one fails)"
fake_build "$work/ok"
run graded "$work/ok"
expect graded 1 "^score: 1 of 2 exercises passed$"
grep -Eq "^ex01\.fails +FAILED \(a check failed; $work/ok/grade/ex01\.fails\.log\)$" "$work/graded.out" ||
  fail "graded: ex01.fails is not shown failed with its log"
[ -s "$work/ok/grade/ex01.passes.log" ] || fail "graded: no log for ex01.passes"

echo "-- the log folder cannot be written (BUILD_DIR/grade is a file): said so, nothing graded"
fake_build "$work/no_logs"
echo "not a folder" >"$work/no_logs/grade"
run no_logs "$work/no_logs"
expect no_logs 3 "grade.sh: cannot write in $work/no_logs/grade .*nothing was graded" "FAILED|score:|doctest"

echo "-- ctest cannot write its own logs (BUILD_DIR/Testing is a file): said so, not 'without doctest'"
fake_build "$work/no_testing"
echo "not a folder" >"$work/no_testing/Testing"
run no_testing "$work/no_testing"
expect no_testing 3 "grade.sh: cannot write in $work/no_testing/Testing/Temporary .*make $work/no_testing writable" \
  "FAILED|score:|doctest"

echo "-- one exercise's log cannot be written (it is a folder): said so, the rest not graded"
fake_build "$work/one_log"
mkdir -p "$work/one_log/grade/ex01.fails.log"
run one_log "$work/one_log"
expect one_log 3 "grade.sh: could not write $work/one_log/grade/ex01\.fails\.log .*: ex01\.fails and those after it were not graded" \
  "FAILED|score:"

echo "-- a CTestTestfile.cmake ctest cannot read: ctest's message (status 2), not 'without doctest'"
mkdir "$work/unreadable"
echo 'add_test(' >"$work/unreadable/CTestTestfile.cmake"
run unreadable "$work/unreadable"
expect unreadable 2 "grade\.sh: ctest cannot list the tests of $work/unreadable" "doctest|cannot write"
grep -q "Parse error" "$work/unreadable.out" || fail "unreadable: ctest's own message is not shown"

echo "-- configured without exercise tests: said so (status 2)"
fake_build "$work/no_exercises" none
run no_exercises "$work/no_exercises"
expect no_exercises 2 "has no exercise tests: ctest lists none labelled 'exercise' \(was it configured without doctest\?\)" \
  "cannot write"

echo "-- not a configured build folder: said so (status 2)"
mkdir "$work/empty"
run not_configured "$work/empty"
expect not_configured 2 "is not a configured build folder" "cannot write|doctest"

echo "-- no jq on the PATH: said so, with the package to install (status 2), nothing graded"
fake_build "$work/no_jq"
mkdir "$work/bin_without_jq"
for tool in dirname ctest mktemp rm mkdir grep sed cat; do  # what grade.sh calls, jq left out
  ln -s "$(command -v "$tool")" "$work/bin_without_jq/$tool"
done
status=0
PATH="$work/bin_without_jq" "$BASH" "$grade" "$work/no_jq" >"$work/no_jq.out" 2>&1 || status=$?
expect no_jq 2 "grade\.sh: needs jq, .*apt-get install jq" "score:|FAILED"

if [ "$failures" -gt 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "PASS: grade.sh tells each case apart"
