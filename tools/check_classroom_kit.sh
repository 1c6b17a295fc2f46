#!/usr/bin/env bash
# Proves the classroom kit honest: in a student copy (tools/classroom/student_copy) the copy
# builds, every exercise fails at its hole and earns no point, the tests that use no exercise's
# code (ctest label needs_no_exercise, readme_links among them) still pass, the teacher's hidden
# cases are left out and each assignment has its handout, no other file of the copy holds a
# hole's answer (a similarity search, student_copy --find-answers), and a solution tuned to the
# visible tests (ex07.bubble's, for two stages only) earns the visible points and loses the hidden ones.
# (In the repository itself the exercises' ctest cases run with every test run, and pass;
# tools/grade.sh BUILD_DIR shows them as a score sheet.)
#
#   tools/check_classroom_kit.sh BUILD_DIR          # BUILD_DIR: this repository's cpu build, built
#   tools/check_classroom_kit.sh BUILD_DIR --each   # also: each exercise made the only hole in
#                                                   # turn must fail its own checks, naming itself
#
# The student copy is built (cpu backend) in a scratch folder, removed afterwards: about two
# minutes on two cores, and --each about ten seconds more per exercise whose checks stopped at
# another exercise's hole (its copy is rebuilt with only its own hole).
# ctest runs this as classroom_kit (label "classroom"). Exit status 0 when all holds, 1 when not,
# 77 (skipped) where jq is missing.
set -euo pipefail
# tools/grade.sh reads ctest's list of tests and writes its JSON with jq: without it, skipped (77).
command -v jq >/dev/null || { echo "SKIPPED: needs jq, which tools/grade.sh uses (apt-get install jq)"; exit 77; }

usage="usage: tools/check_classroom_kit.sh BUILD_DIR [--each]"
if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then echo "$usage"; exit 0; fi
if [ $# -lt 1 ] || [ $# -gt 2 ] || { [ $# -eq 2 ] && [ "$2" != --each ]; }; then echo "$usage" >&2; exit 2; fi
build=$(cd "$1" && pwd)
each=${2:-}
root=$(cd "$(dirname "$0")/.." && pwd)
student_copy="$build/bin/student_copy"
[ -x "$student_copy" ] || { echo "check_classroom_kit.sh: $student_copy not built" >&2; exit 2; }

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

echo "== the student copy: it builds"
"$student_copy" --from "$root" --to "$scratch/copy"
copy="$scratch/copy"
cmake -S "$copy" -B "$copy/build" -DMGPU_BACKEND=cpu >"$scratch/configure.log" 2>&1 ||
  { cat "$scratch/configure.log"; fail "the student copy does not configure"; }
cmake --build "$copy/build" -j"$(nproc)" >"$scratch/build.log" 2>&1 ||
  { grep -B2 -A8 'error' "$scratch/build.log" | head -60; fail "the student copy does not build"; }

echo "== the student copy: every exercise fails, at a hole"
set +e
(cd "$copy" && tools/grade.sh build) | tee "$scratch/sheet.txt"
set -e
cp -a "$copy/build/grade" "$scratch/every_hole_logs"  # each exercise's log, for --each below
grep -q '^score: 0 of [1-9]' "$scratch/sheet.txt" || fail "an exercise passes in the student copy (or none was graded)"
# Every exercise line is a failure that a hole caused (or a skip this build cannot grade).
if grep -E '^ex[0-9]{2}\.' "$scratch/sheet.txt" | grep -v 'is not done yet' | grep -v ' skipped ('; then
  fail "the exercises above did not stop at a hole"
fi

echo "== the student copy: what uses no exercise still passes, readme_links among it"
ctest --test-dir "$copy/build" -L '^needs_no_exercise$' -j"$(nproc)" >"$scratch/independent.log" 2>&1 ||
  { grep -E 'Failed|tests passed' "$scratch/independent.log"; fail "a test that uses no exercise fails in the student copy"; }
grep -E 'tests passed' "$scratch/independent.log"
# Every README's links hold in the copy, which has no INSTRUCTOR.md: the test must have run.
grep -Eq 'readme_links +\.+ +Passed' "$scratch/independent.log" ||
  fail "readme_links did not run in the student copy (is it labelled needs_no_exercise?)"

echo "== the student copy: the teacher's hidden cases are left out, a handout per assignment is in"
[ ! -e "$copy/tests/hidden" ] || fail "the student copy holds tests/hidden/"
if grep -Eq '^[[:space:]]*hidden[[:space:]]' "$copy"/tools/classroom/rubrics/*.rubric; then
  fail "a rubric in the student copy names a hidden case"
fi
hidden_cases=$(ctest --test-dir "$copy/build" --show-only=json-v1 -L '^hidden$' | jq '.tests | length')
[ "$hidden_cases" = 0 ] || fail "the student copy registers $hidden_cases hidden case(s)"
for rubric in "$root"/tools/classroom/rubrics/*.rubric; do
  handout="$copy/handouts/$(basename "$rubric" .rubric).md"
  [ -s "$handout" ] || fail "no handout $handout for $(basename "$rubric")"
done
echo "$(ls "$copy/handouts" | wc -l) handouts; no hidden case"
# The README passages marked as answers (classroom/holes.h, hide_answers) are gone: neither a
# marker nor what stood between two is left.
if grep -rlE --include='*.md' '^<!-- (BEGIN|END) ANSWER ' "$copy"; then
  fail "the files above still hold an answer passage's marker"
fi
answers=$(cd "$root" && { grep -rlE --include='*.md' '^<!-- BEGIN ANSWER ' README.md chapters data tools || true; } | wc -l)
left_out=$(cd "$copy" && { grep -rl --include='*.md' 'is left out of the student copy.)\*$' README.md chapters data tools || true; } | wc -l)
[ "$left_out" -eq "$answers" ] || fail "$answers README(s) mark answer passages, but $left_out in the copy say one was left out"
echo "answer passages left out of the copy's READMEs: $answers file(s)"

echo "== the student copy: no other file holds a hole's answer (a similarity search)"
# student_copy --find-answers: every hole's answer (its region here) against every text file of
# the copy, as runs of 8 tokens, leaving out the code around the hole and idioms common to many
# files (tools/classroom/near_copies.h). A file holding a quarter of what only the answer says fails.
"$student_copy" --from "$root" --find-answers "$copy" >"$scratch/answers.txt" ||
  { cat "$scratch/answers.txt"; fail "a file of the student copy holds a hole's answer"; }
tail -1 "$scratch/answers.txt"
# ...and it can fail: an answer pasted, re-indented and with its comments dropped, into a note is found.
sed -n '/BEGIN EXERCISE ex02.allreduce/,/END EXERCISE ex02.allreduce/p' "$root/chapters/02_data_parallel/data_parallel.cpp" |
  sed -e 's/^ *//' -e 's|//.*||' >"$copy/chapters/03_ring_allreduce/notes.txt"
if "$student_copy" --from "$root" --find-answers "$copy" >"$scratch/planted.txt"; then
  fail "an answer pasted into chapters/03_ring_allreduce/notes.txt was not found"
fi
grep -q 'HOLDS THE ANSWER: chapters/03_ring_allreduce/notes.txt holds 100% of ex02.allreduce' "$scratch/planted.txt" ||
  { cat "$scratch/planted.txt"; fail "the pasted answer was not named"; }
rm "$copy/chapters/03_ring_allreduce/notes.txt"
echo "an answer pasted into a note is found"

echo "== the student copy: points for every graded case, none earned"
grep -Eq '^points: 0 of [1-9]' "$scratch/sheet.txt" || fail "the score sheet gives points in the student copy (or none at all)"
grep -E '^points: ' "$scratch/sheet.txt"

echo "== hidden cases catch a solution tuned to the visible tests"
# ex07.bubble filled with an answer that fits the visible cases (equal stages, and two unequal
# ones) and no other: its step takes the slowest of the first two stages, not of all. In the
# copy with the teacher's hidden cases put back, as grade_all.sh grades it, it must earn the
# visible case's points and lose the hidden case's.
pipeline="$copy/chapters/07_model_parallel/pipeline.cpp"
cp "$pipeline" "$scratch/pipeline.cpp.hole"
# (The tuned answer is the teacher's: it lives with the hidden cases, out of the student copy,
# since it is most of the real answer.)
tuned=$(cat "$root/tests/hidden/tuned_ex07_bubble.txt")
grep -q 'mgpu::exercise_not_done("ex07.bubble"' "$pipeline" || fail "no ex07.bubble hole in $pipeline"
awk -v tuned="$tuned" '/mgpu::exercise_not_done\("ex07.bubble"/ { sub(/mgpu::exercise_not_done.*/, tuned) } { print }' \
  "$scratch/pipeline.cpp.hole" >"$pipeline"
cp -a "$root/tests/hidden" "$copy/tests/hidden"
{ cmake "$copy/build" && cmake --build "$copy/build" -j"$(nproc)" --target test_model_parallel test_hidden_ch07_08; } \
  >"$scratch/tuned.log" 2>&1 || { tail -30 "$scratch/tuned.log"; fail "the copy with a tuned ex07.bubble does not build"; }
set +e
(cd "$copy" && tools/grade.sh build --rubrics "$root/tools/classroom/rubrics") >"$scratch/tuned_sheet.txt" 2>&1
set -e
grep -E '^ex07\.bubble |^ +ex07\.bubble' "$scratch/tuned_sheet.txt"
grep -Eq '^ex07\.bubble +passed$' "$scratch/tuned_sheet.txt" || fail "the tuned ex07.bubble does not pass its visible tests"
grep -Eq '^ +ex07\.bubble +passed +3 of 3$' "$scratch/tuned_sheet.txt" || fail "the tuned ex07.bubble does not earn its visible points"
grep -Eq '^ +ex07\.bubble:hidden_unequal_stages +FAILED, hidden +0 of 2$' "$scratch/tuned_sheet.txt" ||
  fail "the hidden case did not take the tuned ex07.bubble's points"
grep -Eq '^ +ex07\.bubble +exercise \([0-9]+ min\) +3 of 5$' "$scratch/tuned_sheet.txt" || fail "ex07.bubble's sum is not 3 of 5"
# The copy as it was: every exercise a hole, no hidden case.
cp "$scratch/pipeline.cpp.hole" "$pipeline"
rm -rf "$copy/tests/hidden"
{ cmake "$copy/build" && cmake --build "$copy/build" -j"$(nproc)" --target test_model_parallel; } >"$scratch/tuned.log" 2>&1 ||
  fail "the copy does not build again after the tuned solution"

if [ "$each" = --each ]; then
  echo "== each exercise alone: its own checks fail, naming it"
  mapfile -t exercises < <(sed -n 's/^\(ex[0-9][0-9]\.[a-z0-9_]*\) .*FAILED.*/\1/p' "$scratch/sheet.txt")
  rebuilt=0
  for name in "${exercises[@]}"; do
    # Its checks already stopped at its own hole in the copy with every hole: up to that point
    # they ran no other exercise's code (that would have stopped them first), so with the other
    # holes filled they run the same way and stop there again. Only an exercise whose checks
    # stopped at another's hole (ex02.train_batch at ex02.get_params) needs the copy rebuilt.
    if grep -q "exercise $name is not done yet" "$scratch/every_hole_logs/$name.log"; then
      echo "$name alone: fails at its hole (its checks stopped there with every hole in)"
      continue
    fi
    rebuilt=$((rebuilt + 1))
    rm -rf "$scratch/one"
    "$student_copy" --from "$root" --to "$scratch/one" --only "$name" >/dev/null
    # Bring the built copy to "only $name is a hole", touching only the files that differ, so
    # that the rebuild recompiles those alone.
    (cd "$scratch/one" && find . -type f \( -name '*.cu' -o -name '*.cpp' -o -name '*.h' \)) | while read -r f; do
      cmp -s "$scratch/one/$f" "$copy/$f" || cp "$scratch/one/$f" "$copy/$f"
    done
    # Only the suites its checks run are rebuilt (the copy's programs its ctest case names), not the chapters.
    mapfile -t suites < <(ctest --test-dir "$copy/build" --show-only=json-v1 -R "^${name//./\\.}\$" |
                          jq -r '.tests[].command[0]' | grep "^$copy/build/" | xargs -r -n 1 basename | sort -u)
    [ "${#suites[@]}" -gt 0 ] || fail "$name alone: its ctest case names no program of the copy"
    targets=()
    for suite in "${suites[@]}"; do targets+=(--target "$suite"); done
    cmake --build "$copy/build" -j"$(nproc)" "${targets[@]}" >"$scratch/build.log" 2>&1 ||
      fail "$name alone: the copy does not build"
    if ctest --test-dir "$copy/build" -R "^${name//./\\.}\$" --output-on-failure >"$scratch/one.log" 2>&1; then
      fail "$name alone: its checks pass with its hole"
    fi
    grep -q "exercise $name is not done yet" "$scratch/one.log" || { tail -20 "$scratch/one.log"; fail "$name alone: its checks failed, but not at its hole"; }
    echo "$name alone: fails at its hole (rebuilt with only that hole)"
  done
  echo "$rebuilt exercise(s) checked in a copy rebuilt with only their hole"
fi
echo "the classroom kit is honest"
