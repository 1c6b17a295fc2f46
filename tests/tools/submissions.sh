#!/usr/bin/env bash
# tools/classroom/submit.sh and grade_all.sh, end to end on a small repository made here (a
# chapter with two exercises, a hidden case and a rubric; its "tests" read the code with grep and
# run the shell lines a student wrote after "// RUN: ", so nothing is compiled): a student's work
# is packed with its manifest (each exercise filled or still a hole, each file's checksum); a
# folder of submissions is graded into one table, the hidden case included; every entry of the
# folder gets exactly one row: a malformed submission (not an archive, a file that is not an
# exercise's, a checksum that does not match, an archive named for another student than its
# manifest's, a manifest naming no file, a member too large to unpack, an 8 GiB sparse member),
# a folder, a FIFO, a link to /dev/zero, names with a comma and a line break (quoted as RFC 4180
# says), one that runs past its time limit: each gets its row and stops none of the others.
# Where a sandbox can be made (tools/classroom/sandbox.sh), a hostile submission tries to read
# the hidden case's source, the clean copy and the classmates' archives, to write outside its
# copy and into the grader's files, to outlive its grading with setsid, and to print megabytes:
# none of it works, and the others' rows are the same a while after grade_all.sh ended. Every
# path grade_all.sh prints, and every path a student's sheet names, exists after it ends.
#
#   submissions.sh STUDENT_COPY      (about half a minute: one submission waits for its time limit)
set -euo pipefail
# tools/grade.sh reads ctest's list of tests and writes its JSON with jq: without it, skipped (77).
command -v jq >/dev/null || { echo "SKIPPED: needs jq, which tools/grade.sh uses (apt-get install jq)"; exit 77; }

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
# Each "test" runs the code's "// RUN: " lines (a student's code, run by the tests), then greps
# the code; one that finds an endless loop hangs first.
function(grep_test name labels pattern)
  add_test(NAME ${name} COMMAND sh -c "sed -n 's|^ *// RUN: ||p' '${code}' | sh; if grep -q 'for (;;)' '${code}'; then sleep 60; fi; grep -q '${pattern}' '${code}'")
  set_tests_properties(${name} PROPERTIES LABELS "${labels}")
endfunction()
grep_test(ex01.answer "exercise;ex01.answer" "return 42")
grep_test(ex01.other "exercise;ex01.other" "return 7")
if(EXISTS ${CMAKE_SOURCE_DIR}/tests/hidden/CMakeLists.txt)
  add_subdirectory(tests/hidden)
endif()
CMAKE
cat >"$src/tests/hidden/CMakeLists.txt" <<'CMAKE'
# the hidden source's secret: HIDDEN-7a1c
grep_test(ex01.answer:hidden_again "graded;hidden" "return 42;")
CMAKE
cat >"$src/tools/classroom/rubrics/01_small.rubric" <<'R'
assignment A small chapter
exercise ex01.answer 10
  case ex01.answer 3 the answer
  hidden ex01.answer:hidden_again 2 the answer, again
R
cat >"$src/tools/classroom/rubrics/02_other.rubric" <<'R'
assignment Another assignment in the same file
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

echo "-- malformed submissions, and entries that are no submission at all"
echo "not an archive" >"$work/in/dan.tar.gz"
mkdir -p "$work/eve/submission/files/chapters/01_small"
printf 'mgpu submission, format 1\nstudent eve\nfile CMakeLists.txt 0000\n' >"$work/eve/submission/MANIFEST"
tar -czf "$work/in/eve.tar.gz" -C "$work/eve" submission
mkdir -p "$work/fay"
tar -xzf "$work/in/ann.tar.gz" -C "$work/fay"
sed -i 's/^student ann$/student fay/' "$work/fay/submission/MANIFEST"
echo "// changed after packing" >>"$work/fay/submission/files/chapters/01_small/code.cpp"
tar -czf "$work/in/fay.tar.gz" -C "$work/fay" submission
cp "$work/in/ann.tar.gz" "$work/in/ann2.tar.gz"  # ann's archive, named for "ann2"
mkdir -p "$work/gus/submission/files"
printf 'mgpu submission, format 1\nstudent gus\n' >"$work/gus/submission/MANIFEST"  # names no file
tar -czf "$work/in/gus.tar.gz" -C "$work/gus" submission
mkdir -p "$work/hal/submission/files/chapters/01_small"  # a member of 5 MiB
printf 'mgpu submission, format 1\nstudent hal\n' >"$work/hal/submission/MANIFEST"
head -c $((5 * 1024 * 1024)) /dev/zero >"$work/hal/submission/files/chapters/01_small/code.cpp"
tar -czf "$work/in/hal.tar.gz" -C "$work/hal" submission
mkdir -p "$work/ida/submission/files/chapters/01_small"  # 8 GiB of a sparse file, 10 KB packed
printf 'mgpu submission, format 1\nstudent ida\n' >"$work/ida/submission/MANIFEST"
truncate -s 8G "$work/ida/submission/files/chapters/01_small/code.cpp"
tar --sparse -czf "$work/in/ida.tar.gz" -C "$work/ida" submission
rm -f "$work/ida/submission/files/chapters/01_small/code.cpp"
mkdir "$work/in/folder.tar.gz"
mkfifo "$work/in/fifo.tar.gz"
ln -s /dev/zero "$work/in/zero.tar.gz"
cp "$work/in/dan.tar.gz" "$work/in/a,b.tar.gz"
cp "$work/in/dan.tar.gz" "$work/in/line"$'\n'"break.tar.gz"

echo "-- a hostile submission: mal's code, run by the tests, tries to break out"
# What mal's tests will try, as the grader's user: read what it must not, write outside its
# copy, outlive its grading, and print 2 MB.
make_copy mal 's/mgpu::exercise_not_done("ex01.other".*/return 7;/'
{
  echo "// RUN: cat '$src/tests/hidden/CMakeLists.txt' '$work/out/clean/tests/hidden/CMakeLists.txt' 2>&1"
  echo "// RUN: cat '$work/out/work/copy/tests/hidden/CMakeLists.txt' 2>&1; ls '$work/in' 2>&1"
  echo "// RUN: echo forged >'$work/outside' 2>&1; echo forged >>'$work/out/work/copy/build/grade/points.csv' 2>&1"
  echo "// RUN: setsid sh -c 'sleep 30; echo late >$work/late' >/dev/null 2>&1 &"
  echo "// RUN: head -c 2000000 /dev/zero | tr '\\0' x"
} >>"$work/mal/chapters/01_small/code.cpp"
sandbox_ok=1
"$repo_root/tools/classroom/sandbox.sh" -- true >/dev/null 2>&1 || sandbox_ok=0
if [ "$sandbox_ok" -eq 1 ]; then
  "$submit" --student mal "$work/mal" "$work/in/mal.tar.gz" >/dev/null
else
  echo "   (no sandbox can be made on this machine: $("$repo_root/tools/classroom/sandbox.sh" -- true 2>&1 | tail -n 1);"
  echo "    grade_all.sh runs with --no-sandbox, and the hostile submission is left out)"
fi

echo "-- grade_all.sh: every entry gets its row"
status=0
no_sandbox=()
[ "$sandbox_ok" -eq 1 ] || no_sandbox=(--no-sandbox)
"$grade_all" --build "$src/build" --from "$src" --timeout 8 --case-timeout 5 "${no_sandbox[@]}" "$work/in" "$work/out" \
  >"$work/grade_all.out" 2>&1 || status=$?
cat "$work/grade_all.out"
[ "$status" -eq 1 ] || fail "grade_all.sh: status $status, expected 1 (some could not be graded)"
csv="$work/out/grades.csv"
[ "$(head -n 1 "$csv")" = "student,submission,status,points_earned,points_possible,ex01.answer,ex01.other,01_small,02_other" ] ||
  fail "grades.csv's header: $(head -n 1 "$csv")"
graded=graded
[ "$sandbox_ok" -eq 1 ] || graded="graded without a sandbox"
row() { grep -qxF "$1" "$csv" || fail "grades.csv has no row '$1'"; }
row "ann,ann.tar.gz,$graded,6,6,5,1,5/5,1/1"
row 'ann2,ann2.tar.gz,"refused: the file is named for ann2, its MANIFEST for ann",0,0,,,,'
row "bob,bob.tar.gz,$graded,5,6,5,0,5/5,0/1"
row 'cat,cat.tar.gz,timed out after 8 s,0,0,,,,'
grep -Eq '^\?,dan.tar.gz,refused: not a gzipped tar archive' "$csv" || fail "dan's row"
grep -Eq '^eve,eve.tar.gz,refused: CMakeLists.txt is not a file that holds an exercise' "$csv" || fail "eve's row"
grep -Eq '^fay,fay.tar.gz,refused: chapters/01_small/code.cpp does not match its checksum' "$csv" || fail "fay's row"
row 'gus,gus.tar.gz,refused: the MANIFEST names no file,0,0,,,,'
grep -Eq "^\?,hal.tar.gz,refused: 'submission/files/chapters/01_small/code.cpp' unpacks to 5242880 bytes" "$csv" || fail "hal's row"
grep -Eq "^\?,ida.tar.gz,refused: 'submission/files/chapters/01_small/code.cpp' unpacks to 8589934592 bytes" "$csv" || fail "ida's row"
row '?,folder.tar.gz,refused: a folder,0,0,,,,'
row '?,fifo.tar.gz,refused: a FIFO,0,0,,,,'
row '?,zero.tar.gz,refused: a symbolic link,0,0,,,,'
row '?,"a,b.tar.gz","refused: not named STUDENT.tar.gz (the student'"'"'s id, as submit.sh takes it)",0,0,,,,'
grep -q '^?,"line$' "$csv" || fail "the name with a line break is not quoted"
grep -q 'ex01.answer:hidden_again' "$work/out/results/ann/points.csv" || fail "the hidden case was not graded"
entries=$(find "$work/in" -mindepth 1 -maxdepth 1 -printf . | wc -c)
# One row per entry: a quoted field may hold a line break, so count the rows as a CSV reader does.
rows=$(tail -n +2 "$csv" | awk '{ q += gsub(/"/, "&") } q % 2 == 0 { n++ } END { print n }')
[ "$rows" -eq "$entries" ] || fail "grades.csv: $rows rows for $entries entries"

echo "-- grade_all.sh: a hidden case's log goes back as one line; the teacher keeps the whole"
grep -qx 'hidden case ex01.answer:hidden_again (2 points): passed; its log stays with the teacher' \
  "$work/out/results/ann/logs/ex01.answer:hidden_again.log" || fail "ann's hidden log is not the one line"
grep -q 'return 42;' "$work/out/teacher/ann/logs/ex01.answer:hidden_again.log" || fail "the teacher lacks ann's hidden log"

if [ "$sandbox_ok" -eq 1 ]; then
  echo "-- the hostile submission: nothing it tried worked"
  # The moment grade_all.sh has ended: none of mal's processes may be left.
  if pgrep -f "sleep 30; echo late" >/dev/null; then fail "mal's setsid process outlived its grading"; fi
  row "mal,mal.tar.gz,graded,0,6,0,0,0/5,0/1"  # every test printed 2 MB: every test failed
  if grep -rq 'HIDDEN-7a1c' "$work/out/results/mal" "$work/out/teacher/mal"; then
    fail "mal read the hidden case's source"
  fi
  if grep -rqE 'ann.tar.gz|bob.tar.gz' "$work/out/results/mal"; then fail "mal listed the classmates' archives"; fi
  [ ! -e "$work/outside" ] || fail "mal wrote outside its copy"
  [ ! -e "$work/late" ] || fail "a process mal started wrote outside its copy"
  ! grep -q forged "$work/out/results/mal/points.csv" || fail "mal wrote into its points"
  for log in "$work"/out/results/mal/logs/*.log; do
    [ "$(wc -c <"$log")" -le $((1024 * 1024 + 1024)) ] || fail "$log: $(wc -c <"$log") bytes, more than the 1 MiB cut"
  done
  grep -q 'sandbox.sh: the output went past 1048576 bytes' "$work/out/results/mal/logs/ex01.answer.log" ||
    fail "mal's 2 MB of output were not cut"
  row "ann,ann.tar.gz,graded,6,6,5,1,5/5,1/1"  # the others' rows are as they were
  row "bob,bob.tar.gz,graded,5,6,5,0,5/5,0/1"
fi

echo "-- grade_all.sh: every path it printed, and every path a sheet names, is there after it ended"
paths=0
while IFS= read -r path; do
  paths=$((paths + 1))
  [ -e "$path" ] || fail "a path printed or named in a sheet does not exist: $path"
done < <(cat "$work/grade_all.out" "$work"/out/results/*/sheet.txt | grep -oE "$work/out/[^ ;,()']+" | sort -u)
# bob's sheet names the log of his failed exercise; ann's and bob's their points.csv.
[ "$paths" -ge 5 ] || fail "only $paths paths found in grade_all.sh's output and the sheets"
grep -q "$work/out/results/bob/logs/ex01.other.log" "$work/out/results/bob/sheet.txt" ||
  fail "bob's sheet does not name his failed exercise's log where it was kept"

echo "-- grade_all.sh --only: one assignment, the others solved in the copy, the points out of its own"
mkdir "$work/in2"
"$student_copy" --from "$src" --to "$work/only" --only ex01.other >/dev/null  # the student's copy for 02_other
grep -q 'return 42;' "$work/only/chapters/01_small/code.cpp" || fail "student_copy --only left ex01.answer a hole"
sed -i 's/mgpu::exercise_not_done("ex01.other".*/return 7;/' "$work/only/chapters/01_small/code.cpp"
"$submit" --student ann "$work/only" "$work/in2/ann.tar.gz" >/dev/null
"$submit" --student bob "$work/bob" "$work/in2/bob.tar.gz" >/dev/null 2>&1 || cp "$work/in/bob.tar.gz" "$work/in2/"
status=0
"$grade_all" --build "$src/build" --from "$src" --timeout 8 --case-timeout 5 --only 02_other "${no_sandbox[@]}" \
  "$work/in2" "$work/out2" >"$work/grade_all2.out" 2>&1 || status=$?
[ "$status" -eq 0 ] || { fail "grade_all.sh --only: status $status"; cat "$work/grade_all2.out"; }
csv2="$work/out2/grades.csv"
[ "$(head -n 1 "$csv2")" = "student,submission,status,points_earned,points_possible,ex01.other,02_other" ] ||
  fail "--only: the header $(head -n 1 "$csv2")"
grep -qxF "ann,ann.tar.gz,$graded,1,1,1,1/1" "$csv2" || fail "--only: ann's row: $(grep ^ann "$csv2")"
grep -qxF "bob,bob.tar.gz,$graded,0,1,0,0/1" "$csv2" || fail "--only: bob's row: $(grep ^bob "$csv2")"
status=0
"$grade_all" --build "$src/build" --from "$src" --only 09_none "$work/in2" "$work/out3" >"$work/only.out" 2>&1 || status=$?
[ "$status" -eq 2 ] && grep -q -- '--only 09_none: no such assignment' "$work/only.out" || fail "--only of no assignment: status $status"

if [ "$failures" -gt 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "PASS: submissions are packed, checked and graded, each on its own"
