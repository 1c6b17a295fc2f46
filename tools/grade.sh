#!/usr/bin/env bash
# The classroom kit's score sheet: every exercise (the ctest cases labelled "exercise", one per
# exercise, named after it), passed or failed, and the score; then the points, case by case, as
# the rubrics (tools/classroom/rubrics/*.rubric) give them, per exercise, per assignment and in
# all, also written for a gradebook as BUILD_DIR/grade/points.csv and points.json.
#
#   tools/grade.sh [BUILD_DIR] [--student ID] [--rubrics DIR] [--timeout SECONDS]
#                  [--runner PROGRAM] [--all-cases]
#
#   BUILD_DIR    a configured and built build folder (default: build)
#   --student    the id written into the CSV and JSON (default: none)
#   --rubrics    the folder of *.rubric files (default: tools/classroom/rubrics beside this script)
#   --timeout    stop each test after this many seconds (default: none): it fails as "timed out"
#   --runner     run each ctest call as PROGRAM ctest ARGS... (grade_all.sh: a sandbox, so that a
#                student's code runs where it can change nothing this script reads or writes)
#   --all-cases  a case the rubrics name that the build lacks FAILS (0 points) instead of being
#                left out as "not in this build" (grade_all.sh: the teacher's copy has every case,
#                so one that is gone was made to go)
#
# Each exercise runs as `ctest -R ^NAME$`, its output kept in BUILD_DIR/grade/NAME.log, and so
# does each graded case that is not the exercise's own test. An exercise that cannot run in this
# build or on this machine (chapter 04's needs the cuda build and two GPUs) is shown as
# "skipped", with ctest's reason, and is not counted; a case the build does not have (a hidden
# case in a student copy) is shown as "not in this build" and is not counted either.
# Exit status: 0 when every exercise and case graded here passed, 1 when one failed, 2 when
# BUILD_DIR is not a configured build (or has no exercise tests), a rubric cannot be read or the
# command line is wrong, 3 when it cannot write in BUILD_DIR (ctest keeps its logs in
# BUILD_DIR/Testing, this script the exercises' in BUILD_DIR/grade): nothing is graded then.
set -uo pipefail

usage="usage: tools/grade.sh [BUILD_DIR] [--student ID] [--rubrics DIR] [--timeout SECONDS] [--runner PROGRAM] [--all-cases]"
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build="" student="" rubrics="$root/tools/classroom/rubrics" timeout="" runner="" all_cases=0
while [ "$#" -gt 0 ]; do
  case "$1" in
    -h|--help) echo "$usage"; exit 0 ;;
    --all-cases) all_cases=1; shift ;;
    --student|--rubrics|--timeout|--runner)
      if [ "$#" -lt 2 ]; then echo "grade.sh: $1 needs a value" >&2; echo "$usage" >&2; exit 2; fi
      case "$1" in
        --student) student=$2 ;;
        --rubrics) rubrics=$2 ;;
        --timeout) timeout=$2 ;;
        --runner) runner=$2 ;;
      esac
      shift 2 ;;
    -*) echo "grade.sh: unknown option '$1'" >&2; echo "$usage" >&2; exit 2 ;;
    *)
      if [ -n "$build" ]; then echo "$usage" >&2; exit 2; fi
      build=$1; shift ;;
  esac
done
build=${build:-build}
if [ -n "$student" ] && ! [[ $student =~ ^[A-Za-z0-9][A-Za-z0-9._@-]*$ ]]; then
  echo "grade.sh: --student '$student': an id is letters, digits and . _ @ - (it names files)" >&2
  exit 2
fi
if [ -n "$timeout" ] && ! [[ $timeout =~ ^[1-9][0-9]*$ ]]; then
  echo "grade.sh: --timeout '$timeout': a whole number of seconds, at least 1" >&2
  exit 2
fi
if [ -n "$runner" ] && [ ! -x "$runner" ]; then
  echo "grade.sh: --runner '$runner': not an executable file" >&2
  exit 2
fi
if ! command -v jq >/dev/null; then
  echo "grade.sh: needs jq, which reads ctest's list of tests and writes points.json: apt-get install jq" >&2
  exit 2
fi
if [ ! -f "$build/CTestTestfile.cmake" ]; then
  echo "grade.sh: $build is not a configured build folder: run the README's build command first" >&2
  exit 2
fi

# --- The rubrics, read before anything runs: a mistake in one is reported, nothing graded.
# Each case is one line of $cases: assignment|exercise|case|visible or hidden|points|what.
assignments=() cases=()
declare -A title minutes
read_rubric() {  # FILE
  local file=$1 name number=0 line kind a b rest exercise=""
  name=$(basename "$file" .rubric)
  assignments+=("$name")
  title[$name]=$name
  bad() { echo "grade.sh: $file:$number: $1" >&2; exit 2; }
  while IFS= read -r line || [ -n "$line" ]; do
    number=$((number + 1))
    read -r kind a b rest <<<"$line"
    case "$kind" in
      ''|'#'*) ;;
      assignment) title[$name]="$a${b:+ $b}${rest:+ $rest}" ;;
      given) ;;
      exercise)
        [[ $a =~ ^ex[0-9][0-9]\.[a-z0-9_]+$ ]] || bad "'exercise NAME MINUTES': '$a' is not an exercise's name"
        [[ $b =~ ^[0-9]{1,6}$ ]] || bad "'exercise NAME MINUTES': '$b' is not a number of minutes (at most 6 digits)"
        [ -z "$rest" ] || bad "'exercise NAME MINUTES' takes nothing more, got '$rest'"
        exercise=$a
        minutes[$a]=$((10#$b)) ;;  # decimal, whatever its leading zeros (bash reads 010 as octal 8)
      case|hidden)
        [ -n "$exercise" ] || bad "a $kind before any 'exercise' line"
        [[ $a == "$exercise" || $a == "$exercise:"* ]] || bad "the case '$a' is not named after its exercise, $exercise (NAME or NAME:CASE)"
        [[ $a =~ ^[a-z0-9_.:]+$ ]] || bad "the case '$a' has a character other than a-z 0-9 _ . :"
        [[ $b =~ ^[0-9]{1,6}$ ]] || bad "'$kind TEST POINTS WHAT': '$b' is not a whole number of points (at most 6 digits)"
        local visibility=visible
        [ "$kind" = hidden ] && visibility=hidden
        cases+=("$name|$exercise|$a|$visibility|$((10#$b))|$rest") ;;  # decimal, as minutes
      *) bad "unknown statement '$kind' (assignment, given, exercise, case or hidden)" ;;
    esac
  done <"$file"
}
if [ -d "$rubrics" ]; then
  for file in "$rubrics"/*.rubric; do
    [ -f "$file" ] && read_rubric "$file"
  done
elif [ "$rubrics" != "$root/tools/classroom/rubrics" ]; then
  echo "grade.sh: --rubrics $rubrics: no such folder" >&2
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

# The tests, from ctest's own JSON (`--show-only=json-v1`), in the order of the chapters: the
# exercises (labelled "exercise") and every test the build has.
if ! listing=$(ctest --test-dir "$build" --show-only=json-v1 2>"$build/grade/ctest-list.err") ||
  ! jq -e '.tests' >/dev/null 2>&1 <<<"$listing"; then
  cat "$build/grade/ctest-list.err" >&2
  echo "grade.sh: ctest cannot list the tests of $build (its message above): nothing was graded" >&2
  exit 2
fi
mapfile -t exercises < <(jq -r '.tests[] | select(any(.properties[]?; .name == "LABELS" and any(.value[]; . == "exercise"))) | .name' <<<"$listing")
if [ "${#exercises[@]}" -eq 0 ]; then
  echo "grade.sh: $build has no exercise tests: ctest lists none labelled 'exercise' (was it configured without doctest?)" >&2
  exit 2
fi
declare -A in_build
while IFS= read -r name; do in_build[$name]=1; done < <(jq -r '.tests[].name' <<<"$listing")

timeout_args=()
[ -n "$timeout" ] && timeout_args=(--timeout "$timeout")
# run_test NAME: runs one ctest test; sets $outcome (passed, failed, timeout or skipped) and $why.
declare -A outcome_of why_of
run_test() {
  local name=$1 log="$build/grade/$1.log" status hole
  ${runner:+"$runner"} ctest --test-dir "$build" -R "^${name//./\\.}\$" -V "${timeout_args[@]}" >"$log" 2>&1
  status=$?
  # ctest -V always writes; a log that is empty or not a file could not be written (a full disk).
  if [ ! -f "$log" ] || [ ! -s "$log" ]; then
    echo "grade.sh: could not write $log (is the disk full?): $name and those after it were not graded" >&2
    exit 3
  fi
  # The hole's own message, when the program reached one: which exercise stopped it.
  hole=$(grep -o 'exercise ex[0-9][0-9]\.[a-z0-9_]* is not done yet' "$log" | head -n 1)
  if grep -q '\*\*\*Skipped' "$log"; then
    outcome=skipped
    why=$(grep -o 'not run in this build: [^"]*\|no GPU answers\|needs [0-9]* GPUs, [0-9]* answer' "$log" | head -n 1)
    why=${why#not run in this build: }
    why=${why:-see $log}
  elif [ "$status" -eq 0 ]; then
    outcome=passed why=""
  elif [ -z "$hole" ] && grep -q '\*\*\*Timeout' "$log"; then
    outcome=timeout why="timed out after $timeout s; $log"
  else
    outcome=failed why="${hole:-a check failed}; $log"
  fi
  outcome_of[$name]=$outcome why_of[$name]=$why
}

passed=0 failed=0 skipped=0
printf '%-26s %s\n' exercise result
for name in "${exercises[@]}"; do
  run_test "$name"
  case "$outcome" in
    skipped) printf '%-26s %s\n' "$name" "skipped ($why)"; skipped=$((skipped + 1)) ;;
    passed) printf '%-26s %s\n' "$name" passed; passed=$((passed + 1)) ;;
    *) printf '%-26s %s\n' "$name" "FAILED ($why)"; failed=$((failed + 1)) ;;
  esac
done
graded=$((passed + failed))
note=""
if [ "$skipped" -gt 0 ]; then note=" ($skipped skipped: not graded in this build)"; fi
echo "score: $passed of $graded exercises passed$note"

# --- The points. An assignment is graded when the build has one of its exercises.
declare -A exercise_listed
for name in "${exercises[@]}"; do exercise_listed[$name]=1; done
declare -A graded_assignment in_rubric
for row in "${cases[@]}"; do
  IFS='|' read -r assignment exercise _ <<<"$row"
  in_rubric[$exercise]=1
  [ -n "${exercise_listed[$exercise]:-}" ] && graded_assignment[$assignment]=1
done
if [ "${#graded_assignment[@]}" -eq 0 ]; then
  echo "points: no rubric in $rubrics names an exercise of this build"
  [ "$failed" -eq 0 ]
  exit
fi
csv="$build/grade/points.csv" json="$build/grade/points.json" rows="$build/grade/points.jsonl"
echo "student,assignment,exercise,case,visibility,points_earned,points_possible,status" >"$csv" || exit 3
: >"$rows" || exit 3
total_earned=0 total_possible=0 not_graded=0 not_graded_points=0 case_failed=0
echo
printf '%-48s %-26s %s\n' "points" status points
for assignment in "${assignments[@]}"; do
  [ -n "${graded_assignment[$assignment]:-}" ] || continue
  echo "== $assignment: ${title[$assignment]}"
  a_earned=0 a_possible=0 current="" e_earned=0 e_possible=0
  close_exercise() {
    [ -n "$current" ] || return 0
    printf '   %-45s %-26s %3d of %d\n' "$current" "exercise (${minutes[$current]} min)" "$e_earned" "$e_possible"
    a_earned=$((a_earned + e_earned)) a_possible=$((a_possible + e_possible))
  }
  for row in "${cases[@]}"; do
    IFS='|' read -r in_assignment exercise case visibility points what <<<"$row"
    [ "$in_assignment" = "$assignment" ] || continue
    if [ "$exercise" != "$current" ]; then
      close_exercise
      current=$exercise e_earned=0 e_possible=0
    fi
    if [ -z "${in_build[$case]:-}" ] && [ "$all_cases" -eq 1 ]; then
      outcome=failed why="not in this build"
    elif [ -z "${in_build[$case]:-}" ]; then
      outcome=missing why="not in this build"
    elif [ -n "${outcome_of[$case]:-}" ]; then
      outcome=${outcome_of[$case]} why=${why_of[$case]}
    else
      run_test "$case"
    fi
    earned=0 possible=0
    case "$outcome" in
      passed) earned=$points possible=$points shown=passed ;;
      failed) possible=$points shown=FAILED case_failed=1 ;;
      timeout) possible=$points shown="FAILED (timed out)" case_failed=1 ;;
      skipped) shown="skipped" not_graded=$((not_graded + 1)) not_graded_points=$((not_graded_points + points)) ;;
      missing) shown="not in this build" not_graded=$((not_graded + 1)) not_graded_points=$((not_graded_points + points)) ;;
    esac
    [ "$visibility" = hidden ] && shown="$shown, hidden"
    printf '     %-43s %-26s %3d of %d\n' "$case" "$shown" "$earned" "$points"
    e_earned=$((e_earned + earned)) e_possible=$((e_possible + possible))
    printf '%s,%s,%s,%s,%s,%d,%d,%s\n' "$student" "$assignment" "$exercise" "$case" "$visibility" "$earned" "$possible" \
      "$outcome" >>"$csv"
    # The same row for the JSON, one object a line: jq quotes every text (the rubric's "what" may
    # hold anything a line can).
    jq -nc --arg assignment "$assignment" --arg title "${title[$assignment]}" --arg exercise "$exercise" \
      --argjson minutes "${minutes[$exercise]}" --arg case "$case" --arg visibility "$visibility" \
      --argjson earned "$earned" --argjson possible "$possible" --arg status "$outcome" --arg what "$what" \
      '{$assignment, $title, $exercise, $minutes, $case, $visibility, points_earned: $earned,
        points_possible: $possible, $status, $what}' >>"$rows" || exit 3
  done
  close_exercise
  printf '%-48s %-26s %3d of %d\n' "$assignment" assignment "$a_earned" "$a_possible"
  total_earned=$((total_earned + a_earned)) total_possible=$((total_possible + a_possible))
done
# points.json: the rows nested as assignments > exercises > cases, in the rubrics' order (runs of
# equal names, as the rows come), each level with its sums.
jq -s --arg student "$student" '
  def runs(f): reduce .[] as $x ([]; if length > 0 and (.[length - 1][0] | f) == ($x | f)
                                     then .[length - 1] += [$x] else . + [[$x]] end);
  def earned: map(.points_earned) | add // 0;
  def possible: map(.points_possible) | add // 0;
  {student: $student,
   assignments: [runs(.assignment)[] as $a | {
     assignment: $a[0].assignment, title: $a[0].title,
     exercises: [$a | runs(.exercise)[] as $e | {
       exercise: $e[0].exercise, minutes: $e[0].minutes,
       points_earned: ($e | earned), points_possible: ($e | possible),
       cases: [$e[] | {case, visibility, points_earned, points_possible, status, what}]}],
     points_earned: ($a | earned), points_possible: ($a | possible)}],
   points_earned: earned, points_possible: possible}' "$rows" >"$json" || exit 3
rm -f -- "$rows"
for name in "${exercises[@]}"; do
  [ -n "${in_rubric[$name]:-}" ] || echo "$name: no rubric gives it points"
done
note=""
if [ "$not_graded" -eq 1 ]; then note=" (1 case, $not_graded_points points, not graded in this build)"; fi
if [ "$not_graded" -gt 1 ]; then note=" ($not_graded cases, $not_graded_points points, not graded in this build)"; fi
echo "points: $total_earned of $total_possible$note; for a gradebook: $csv, $json"
[ "$failed" -eq 0 ] && [ "$case_failed" -eq 0 ]
