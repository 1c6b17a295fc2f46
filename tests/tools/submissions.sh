#!/usr/bin/env bash
# tools/classroom/submit.sh and grade_all.sh, end to end on a small repository made here (a
# chapter with two exercises, a hidden case and a rubric; its "tests" read the code with grep, so
# nothing is compiled): a student's work is packed with its manifest (each exercise filled or
# still a hole, each file's checksum); a folder of submissions is graded into one table, the
# hidden case included; a malformed submission (not an archive, a file that is not an exercise's,
# a checksum that does not match, a second hand-in of the same student), one that runs past its
# time limit, each gets its row and stops none of the others; every path grade_all.sh prints, and
# every path a student's sheet names, exists after it ends.
#
#   submissions.sh STUDENT_COPY      (about half a minute: one submission waits for its time limit)
set -euo pipefail

student_copy=$(realpath "${1:?usage: submissions.sh STUDENT_COPY}")
repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
submit="$repo_root/tools/classroom/submit.sh"
grade_all="$repo_root/tools/classroom/grade_all.sh"
work=$(mktemp -d "${TMPDIR:-/tmp}/mgpu-submissions.XXXXXX")
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# The small repository: ex01.answer (return 42) and ex01.other (return 7), one test each, a
# hidden case for ex01.answer, and a "test" that hangs when the code holds an endless loop.
src="$work/source"
mkdir -p "$src/chapters/01_small" "$src/tests/hidden" "$src/tools/classroom/rubrics" "$src/build/bin"
printf '# chapter 01\n\n| `ex01.answer` | `answer` | return the answer | its test |\n' >"$src/chapters/01_small/README.md"
cat >"$src/chapters/01_small/code.cpp" <<'CPP'
int answer() {
  // BEGIN EXERCISE ex01.answer
  return 42;
  // END EXERCISE ex01.answer
}
int other() {
  // BEGIN EXERCISE ex01.other
  return 7;
  // END EXERCISE ex01.other
}
CPP
cat >"$src/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.16)
project(small NONE)
enable_testing()
set(code ${CMAKE_SOURCE_DIR}/chapters/01_small/code.cpp)
# Each "test" greps the code; one that finds an endless loop hangs first.
function(grep_test name labels pattern)
  add_test(NAME ${name} COMMAND sh -c "if grep -q 'for (;;)' '${code}'; then sleep 60; fi; grep -q '${pattern}' '${code}'")
  set_tests_properties(${name} PROPERTIES LABELS "${labels}")
endfunction()
grep_test(ex01.answer "exercise;ex01.answer" "return 42")
grep_test(ex01.other "exercise;ex01.other" "return 7")
if(EXISTS ${CMAKE_SOURCE_DIR}/tests/hidden/CMakeLists.txt)
  add_subdirectory(tests/hidden)
endif()
CMAKE
cat >"$src/tests/hidden/CMakeLists.txt" <<'CMAKE'
grep_test(ex01.answer:hidden_again "graded;hidden" "return 42;")
CMAKE
cat >"$src/tools/classroom/rubrics/01_small.rubric" <<'R'
assignment A small chapter
exercise ex01.answer 10
  case ex01.answer 3 the answer
  hidden ex01.answer:hidden_again 2 the answer, again
exercise ex01.other 5
  case ex01.other 1 the other
R
ln -s "$student_copy" "$src/build/bin/student_copy"
touch "$src/build/CMakeCache.txt"  # a build folder: the copies leave it out

echo "-- a student copy: the hidden case and its rubric line are left out"
"$student_copy" --from "$src" --to "$work/copy" >/dev/null
[ ! -e "$work/copy/tests/hidden" ] || fail "the copy holds tests/hidden"
grep -q hidden "$work/copy/tools/classroom/rubrics/01_small.rubric" && fail "the copy's rubric names the hidden case"
[ "$(cat "$work/copy/STUDENT_COPY.tsv")" = "$(printf 'ex01.answer\tchapters/01_small/code.cpp\nex01.other\tchapters/01_small/code.cpp')" ] ||
  fail "STUDENT_COPY.tsv: $(cat "$work/copy/STUDENT_COPY.tsv")"
grep -q 'submit.sh --student YOUR_ID' "$work/copy/handouts/01_small.md" || fail "the handout does not say how to hand in"

echo "-- submit.sh: refusals"
expect_refusal() {  # REGEX ARGS...: submit.sh ARGS exits 2 and says REGEX
  local regex=$1 status=0
  shift
  "$submit" "$@" >"$work/refusal.out" 2>&1 || status=$?
  [ "$status" -eq 2 ] || fail "submit.sh $*: status $status, expected 2"
  grep -Eq "$regex" "$work/refusal.out" || { fail "submit.sh $*: does not say '$regex'"; cat "$work/refusal.out"; }
}
expect_refusal "say who you are" "$work/copy" "$work/x.tar.gz"
expect_refusal "an id is" --student "a b" "$work/copy" "$work/x.tar.gz"
expect_refusal "is not a student copy" --student ann "$src" "$work/x.tar.gz"
expect_refusal "must end in .tar.gz" --student ann "$work/copy" "$work/x.zip"

echo "-- three students: ann fills both, bob one, cat loops"
mkdir "$work/in"
make_copy() {  # NAME SED-SCRIPT: a copy with code.cpp's holes edited
  "$student_copy" --from "$src" --to "$work/$1" >/dev/null
  sed -i "$2" "$work/$1/chapters/01_small/code.cpp"
}
make_copy ann 's/mgpu::exercise_not_done("ex01.answer".*/return 42;/; s/mgpu::exercise_not_done("ex01.other".*/return 7;/'
make_copy bob 's/mgpu::exercise_not_done("ex01.answer".*/return 42;/'
make_copy cat 's/mgpu::exercise_not_done("ex01.answer".*/for (;;) {}/'
for s in ann bob cat; do "$submit" --student "$s" "$work/$s" "$work/in/$s.tar.gz" >"$work/$s.out"; done
grep -q '^filled (2): ex01.answer ex01.other$' "$work/ann.out" || { fail "ann's summary"; cat "$work/ann.out"; }
grep -q '^still holes (1): ex01.other$' "$work/bob.out" || { fail "bob's summary"; cat "$work/bob.out"; }
tar -xzf "$work/in/bob.tar.gz" -C "$work" submission/MANIFEST
grep -qx 'student bob' "$work/submission/MANIFEST" || fail "bob's manifest names no student"
grep -qx 'exercise ex01.other hole chapters/01_small/code.cpp' "$work/submission/MANIFEST" || fail "bob's manifest: ex01.other"
grep -Eqx 'file chapters/01_small/code.cpp [0-9a-f]{64}' "$work/submission/MANIFEST" || fail "bob's manifest: the file's checksum"
expect_refusal "exists" --student bob "$work/bob" "$work/in/bob.tar.gz"

echo "-- malformed submissions"
echo "not an archive" >"$work/in/dan.tar.gz"
mkdir -p "$work/eve/submission/files/chapters/01_small"
printf 'mgpu submission, format 1\nstudent eve\nfile CMakeLists.txt 0000\n' >"$work/eve/submission/MANIFEST"
tar -czf "$work/in/eve.tar.gz" -C "$work/eve" submission
mkdir -p "$work/fay"
tar -xzf "$work/in/ann.tar.gz" -C "$work/fay"
sed -i 's/^student ann$/student fay/' "$work/fay/submission/MANIFEST"
echo "// changed after packing" >>"$work/fay/submission/files/chapters/01_small/code.cpp"
tar -czf "$work/in/fay.tar.gz" -C "$work/fay" submission
cp "$work/in/ann.tar.gz" "$work/in/ann2.tar.gz"

echo "-- grade_all.sh: every submission gets its row"
status=0
"$grade_all" --build "$src/build" --from "$src" --timeout 8 --case-timeout 5 "$work/in" "$work/out" >"$work/grade_all.out" 2>&1 || status=$?
cat "$work/grade_all.out"
[ "$status" -eq 1 ] || fail "grade_all.sh: status $status, expected 1 (some could not be graded)"
csv="$work/out/grades.csv"
[ "$(head -n 1 "$csv")" = "student,submission,status,points_earned,points_possible,ex01.answer,ex01.other" ] || fail "grades.csv's header"
row() { grep -qx "$1" "$csv" || fail "grades.csv has no row '$1'"; }
row 'ann,ann.tar.gz,graded,6,6,5,1'
row 'ann,ann2.tar.gz,malformed: ann already handed in ann.tar.gz,0,0,,'
row 'bob,bob.tar.gz,graded,5,6,5,0'
row 'cat,cat.tar.gz,timed out after 8 s,0,0,,'
grep -Eq '^\?,dan.tar.gz,malformed: not a gzipped tar archive' "$csv" || fail "dan's row"
grep -Eq '^eve,eve.tar.gz,malformed: CMakeLists.txt is not a file that holds an exercise' "$csv" || fail "eve's row"
grep -Eq '^fay,fay.tar.gz,malformed: chapters/01_small/code.cpp does not match its checksum' "$csv" || fail "fay's row"
grep -q 'ex01.answer:hidden_again' "$work/out/results/ann/points.csv" || fail "the hidden case was not graded"
[ "$(wc -l <"$csv")" -eq 8 ] || fail "grades.csv: $(($(wc -l <"$csv") - 1)) rows, expected 7"

echo "-- grade_all.sh: every path it printed, and every path a sheet names, is there after it ended"
paths=0
while IFS= read -r path; do
  paths=$((paths + 1))
  [ -e "$path" ] || fail "a path printed or named in a sheet does not exist: $path"
done < <(cat "$work/grade_all.out" "$work"/out/results/*/sheet.txt | grep -oE "$work/[^ ;,()']+" | sort -u)
# bob's sheet names the log of his failed exercise; ann's and bob's their points.csv.
[ "$paths" -ge 5 ] || fail "only $paths paths found in grade_all.sh's output and the sheets"
grep -q "$work/out/results/bob/logs/ex01.other.log" "$work/out/results/bob/sheet.txt" ||
  fail "bob's sheet does not name his failed exercise's log where it was kept"

if [ "$failures" -gt 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "PASS: submissions are packed, checked and graded, each on its own"
