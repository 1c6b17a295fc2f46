#!/usr/bin/env bash
# tools/grade.sh's points: each graded case of a rubric earns its points when its test passes,
# none when it fails or runs past --timeout; a case the build does not have (a hidden case in a
# student copy) and a skipped one are shown and not counted; the totals per exercise, per
# assignment and in all, the CSV and the JSON agree; a malformed rubric is named with its line
# and nothing is graded; the sheet and exit status of the exercises stay what they were.
#
#   grade_points.sh      (a few seconds)
#
# The build folders are made here: a CTestTestfile.cmake whose tests are `true`, `false` and
# `sleep`, which ctest reads as it reads a configured build's, and rubrics of their own.
set -euo pipefail
# tools/grade.sh reads ctest's list of tests and writes its JSON with jq: without it, skipped (77).
command -v jq >/dev/null || { echo "SKIPPED: needs jq, which tools/grade.sh uses (apt-get install jq)"; exit 77; }

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
grade="$repo_root/tools/grade.sh"
work=$(mktemp -d "${TMPDIR:-/tmp}/mgpu-grade-points.XXXXXX")
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# A build: ex01.a (passes), ex01.b (fails), its cases ex01.b:part1 (passes), ex01.b:part2
# (fails), ex01.b:slow (sleeps), ex01.c (skipped, as chapter 04's is without a GPU).
build="$work/build"
mkdir -p "$build"
{
  t() { printf 'add_test(%s "%s" %s)\nset_tests_properties(%s PROPERTIES LABELS "%s")\n' "$1" "$(command -v "$2")" "${4:-}" "$1" "$3"; }
  t ex01.a true "exercise;ex01.a"
  t ex01.b false "exercise;ex01.b"
  t ex01.c sh "exercise;ex01.c" "-c \"echo ex01.c: not run in this build: needs the cuda build with NCCL\""
  printf 'set_tests_properties(ex01.c PROPERTIES SKIP_REGULAR_EXPRESSION "not run in this build")\n'
  t ex01.b:part1 true graded
  t ex01.b:part2 false graded
  t ex01.b:slow sleep graded 30
} >"$build/CTestTestfile.cmake"
mkdir "$work/rubrics"
cat >"$work/rubrics/01_small.rubric" <<'R'
# a small rubric
assignment A small assignment
given nothing much
exercise ex01.a 10
  case ex01.a 3 it "passes" \ as	it should
exercise ex01.b 0020
  case ex01.b:part1 2 this half passes
  case ex01.b:part2 4 this half fails
  case ex01.b:slow 1 this one runs past the time limit
  hidden ex01.b:hidden_other 05 not in this build (leading zeros: decimal, as the minutes above)
exercise ex01.c 5
  case ex01.c 7 skipped here
R

status=0
"$grade" "$build" --rubrics "$work/rubrics" --student s1 --timeout 2 >"$work/out" 2>&1 || status=$?
cat "$work/out"
[ "$status" -eq 1 ] || fail "status $status, expected 1 (an exercise failed)"
expect_line() { grep -Eq "$1" "$work/out" || fail "no line '$1'"; }
expect_line '^ex01\.c +skipped \(needs the cuda build with NCCL\)$'
grep -Eq '^score: 1 of 2 exercises passed \(1 skipped: not graded in this build\)$' "$work/out" || fail "the exercises' score line"
expect_line '^ +ex01\.a +passed +3 of 3$'
expect_line '^ +ex01\.b:part1 +passed +2 of 2$'
expect_line '^ +ex01\.b:part2 +FAILED +0 of 4$'
expect_line '^ +ex01\.b:slow +FAILED \(timed out\) +0 of 1$'
expect_line '^ +ex01\.b:hidden_other +not in this build, hidden +0 of 5$'
expect_line '^ +ex01\.c +skipped +0 of 7$'
expect_line '^ +ex01\.b +exercise \(20 min\) +2 of 7$'
expect_line '^01_small +assignment +5 of 10$'
expect_line '^points: 5 of 10 \(2 cases, 12 points, not graded in this build\)'
grep -q 'timed out after 2 s' "$build/grade/ex01.b:slow.log" 2>/dev/null || grep -q 'Timeout' "$build/grade/ex01.b:slow.log" ||
  fail "the slow case's log does not say it timed out"

csv="$build/grade/points.csv"
[ "$(head -n 1 "$csv")" = "student,assignment,exercise,case,visibility,points_earned,points_possible,status" ] || fail "the CSV's header"
grep -qx 's1,01_small,ex01.b,ex01.b:part1,visible,2,2,passed' "$csv" || fail "the CSV's row of ex01.b:part1"
grep -qx 's1,01_small,ex01.b,ex01.b:slow,visible,0,1,timeout' "$csv" || fail "the CSV's row of ex01.b:slow"
grep -qx 's1,01_small,ex01.b,ex01.b:hidden_other,hidden,0,0,missing' "$csv" || fail "the CSV's row of the hidden case"
[ "$(awk -F, 'NR > 1 { e += $6; p += $7 } END { print e "/" p }' "$csv")" = "5/10" ] || fail "the CSV's sums are not the total"
# The JSON, read back by jq (which grade.sh needs): the sums at each level, the order of the
# rubric, and a "what" with quotes, a backslash and a tab kept as written.
json="$build/grade/points.json"
check_json() {  # JQ_EXPRESSION WHAT: the expression must be true of the JSON
  jq -e "$1" "$json" >/dev/null || fail "the JSON: $2 ($1)"
}
check_json '.student == "s1" and .points_earned == 5 and .points_possible == 10' "the student and the totals"
check_json '.assignments[0] | .assignment == "01_small" and .title == "A small assignment"' "the assignment"
check_json '[.assignments[0].exercises[] | .exercise] == ["ex01.a", "ex01.b", "ex01.c"]' "the exercises in the rubric's order"
check_json '[.assignments[0].exercises[] | .points_earned] == [3, 2, 0]' "the exercises' points"
check_json '[.assignments[0].exercises[1].cases[] | .status] == ["passed", "failed", "timeout", "missing"]' "the cases' statuses"
check_json '.assignments[0].exercises[0].cases[0].what == "it \"passes\" \\ as\tit should"' "a what with quotes, a backslash and a tab"
check_json '.assignments[0].exercises[1].minutes == 20' "the minutes"
[ ! -e "$build/grade/points.jsonl" ] || fail "the JSON's rows were left behind"

echo "-- a rubric with a mistake: named with its line, nothing graded (status 2)"
mkdir "$work/bad"
printf 'assignment Bad\nexercise ex01.a 10\n  case ex01.a three points\n' >"$work/bad/01_bad.rubric"
status=0
"$grade" "$build" --rubrics "$work/bad" >"$work/bad.out" 2>&1 || status=$?
[ "$status" -eq 2 ] || fail "bad rubric: status $status, expected 2"
grep -q "01_bad.rubric:3: 'case TEST POINTS WHAT': 'three' is not a whole number of points" "$work/bad.out" || { fail "bad rubric: the message"; cat "$work/bad.out"; }
grep -q '^score:' "$work/bad.out" && fail "bad rubric: something was graded"
printf 'assignment Bad\n  case ex01.a 3 before its exercise\n' >"$work/bad/01_bad.rubric"
"$grade" "$build" --rubrics "$work/bad" >"$work/bad.out" 2>&1 || true
grep -q "01_bad.rubric:2: a case before any 'exercise' line" "$work/bad.out" || fail "bad rubric: a case before its exercise"
printf 'exercise ex01.a 10\n  case ex01.b 3 another exercise'"'"'s\n' >"$work/bad/01_bad.rubric"
"$grade" "$build" --rubrics "$work/bad" >"$work/bad.out" 2>&1 || true
grep -q "the case 'ex01.b' is not named after its exercise, ex01.a" "$work/bad.out" || fail "bad rubric: a case of another exercise"

echo "-- --all-cases: a case the rubrics name and the build lacks fails; --runner runs each ctest call"
# The runner writes a line per call, then runs it: grade.sh must call ctest through it.
printf '#!/bin/sh\necho "ran: $*" >>"%s"\nexec "$@"\n' "$work/runner.log" >"$work/runner.sh"
chmod +x "$work/runner.sh"
status=0
"$grade" "$build" --rubrics "$work/rubrics" --student s1 --timeout 2 --all-cases --runner "$work/runner.sh" \
  >"$work/all.out" 2>&1 || status=$?
[ "$status" -eq 1 ] || fail "--all-cases: status $status, expected 1"
grep -Eq '^ +ex01\.b:hidden_other +FAILED, hidden +0 of 5$' "$work/all.out" || fail "--all-cases: the missing case is not FAILED"
grep -Eq '^points: 5 of 15 \(1 case, 7 points, not graded in this build\)' "$work/all.out" ||
  fail "--all-cases: the missing case's 5 points are not among those possible"
grep -qx 's1,01_small,ex01.b,ex01.b:hidden_other,hidden,0,5,failed' "$build/grade/points.csv" || fail "--all-cases: the CSV's row"
grep -q '^ran: ctest --test-dir .* -R \^ex01\\.a\$ -V' "$work/runner.log" || fail "--runner: ex01.a's ctest call did not go through it"
[ "$(grep -c '^ran: ctest' "$work/runner.log")" -ge 5 ] || fail "--runner: only $(grep -c '^ran: ctest' "$work/runner.log") calls went through it"
status=0
"$grade" "$build" --rubrics "$work/rubrics" --runner "$work/none.sh" >"$work/cli.out" 2>&1 || status=$?
[ "$status" -eq 2 ] && grep -q "not an executable file" "$work/cli.out" || fail "--runner of a file that is not there: status $status"

echo "-- the command line"
for args in "--student" "--timeout 0" "--student a/b" "--bogus" "$build $build" "--runner"; do
  status=0
  # shellcheck disable=SC2086 # split on purpose
  "$grade" $args >"$work/cli.out" 2>&1 || status=$?
  [ "$status" -eq 2 ] || fail "grade.sh $args: status $status, expected 2"
done

if [ "$failures" -gt 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "PASS: grade.sh's points, CSV and JSON add up, case by case"
