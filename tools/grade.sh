#!/usr/bin/env bash
# The classroom kit's score sheet: every exercise (the ctest cases labelled "exercise", one per
# exercise, named after it), passed or failed, and the score.
#
#   tools/grade.sh [BUILD_DIR]     (default: build; configure and build it first)
#
# Each exercise runs as `ctest -R ^NAME$`, its output kept in BUILD_DIR/grade/NAME.log. An
# exercise that cannot run in this build or on this machine (chapter 04's needs the cuda build
# and two GPUs) is shown as "skipped", with ctest's reason, and is not counted.
# Exit status: 0 when every exercise graded here passed, 1 when one failed, 2 when BUILD_DIR is
# not a configured build (or has no exercise tests), 3 when it cannot write in BUILD_DIR (ctest
# keeps its logs in BUILD_DIR/Testing, this script the exercises' in BUILD_DIR/grade): nothing
# is graded then.
set -uo pipefail

case "${1:-}" in
  -h|--help) echo "usage: tools/grade.sh [BUILD_DIR]"; exit 0 ;;
esac
if [ "$#" -gt 1 ]; then
  echo "usage: tools/grade.sh [BUILD_DIR]" >&2
  exit 2
fi
build=${1:-build}
if [ ! -f "$build/CTestTestfile.cmake" ]; then
  echo "grade.sh: $build is not a configured build folder: run the README's build command first" >&2
  exit 2
fi

# Where it writes, checked by writing there (a permission test would not do: root may write
# anywhere the file system lets it). Without this every exercise would look failed.
can_write_in() {  # folder: made if missing; status 0 when a file can be made in it
  local probe
  mkdir -p -- "$1" 2>/dev/null || return 1
  probe=$(mktemp -p "$1" .grade-probe.XXXXXX 2>/dev/null) || return 1
  rm -f -- "$probe"
}
for folder in "$build/Testing/Temporary" "$build/grade"; do
  if ! can_write_in "$folder"; then
    echo "grade.sh: cannot write in $folder (ctest keeps its logs in $build/Testing, this script the exercises' in $build/grade): nothing was graded; make $build writable (or grade a copy of it)" >&2
    exit 3
  fi
done

# "  Test  #12: ex01.softmax_gradient" -> ex01.softmax_gradient, in the order of the chapters
if ! listing=$(ctest --test-dir "$build" -N -L '^exercise$' 2>&1); then
  printf '%s\n' "$listing" >&2
  echo "grade.sh: ctest cannot list the tests of $build (its message above): nothing was graded" >&2
  exit 2
fi
mapfile -t exercises < <(sed -n 's/^ *Test *#[0-9]*: *//p' <<<"$listing")
if [ "${#exercises[@]}" -eq 0 ]; then
  echo "grade.sh: $build has no exercise tests: ctest lists none labelled 'exercise' (was it configured without doctest?)" >&2
  exit 2
fi

passed=0 failed=0 skipped=0
printf '%-26s %s\n' exercise result
for name in "${exercises[@]}"; do
  log="$build/grade/$name.log"
  ctest --test-dir "$build" -R "^${name//./\\.}\$" -V >"$log" 2>&1
  status=$?
  # ctest -V always writes; a log that is empty or not a file could not be written (a full disk).
  if [ ! -f "$log" ] || [ ! -s "$log" ]; then
    echo "grade.sh: could not write $log (is the disk full?): $name and those after it were not graded" >&2
    exit 3
  fi
  if grep -q '\*\*\*Skipped' "$log"; then
    reason=$(grep -o 'needs the cuda build with NCCL\|no GPU answers\|needs [0-9]* GPUs, [0-9]* answer' "$log" | head -n 1)
    printf '%-26s %s\n' "$name" "skipped (${reason:-see $log})"
    skipped=$((skipped + 1))
  elif [ "$status" -eq 0 ]; then
    printf '%-26s %s\n' "$name" passed
    passed=$((passed + 1))
  else
    # The hole's own message, when the program reached one: which exercise stopped it.
    hole=$(grep -o 'exercise ex[0-9][0-9]\.[a-z0-9_]* is not done yet' "$log" | head -n 1)
    printf '%-26s %s\n' "$name" "FAILED (${hole:-a check failed}; $log)"
    failed=$((failed + 1))
  fi
done
graded=$((passed + failed))
note=""
if [ "$skipped" -gt 0 ]; then note=" ($skipped skipped: not graded in this build)"; fi
echo "score: $passed of $graded exercises passed$note"
[ "$failed" -eq 0 ]
