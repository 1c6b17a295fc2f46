#!/usr/bin/env bash
# Grades a folder of submissions (tools/classroom/submit.sh's .tar.gz files) into one table.
#
#   tools/classroom/grade_all.sh [options] SUBMISSIONS_DIR OUT_DIR
#
#   --build DIR          this repository's build, with build/bin/student_copy (default: build)
#   --from SOURCE        the repository the clean copy is made from (default: this one)
#   --timeout S          the time limit of one submission's grading, in seconds (default 1200)
#   --case-timeout S     the time limit of one test (default 120): a test that runs longer fails
#   --build-timeout S    the time limit of one submission's build (default 900)
#
# A clean student copy is made once (build/bin/student_copy), the teacher's hidden cases
# (tests/hidden/) are put back into it, and it is configured (with the backend and build type of
# --build) and built in OUT_DIR/work/copy, then kept as OUT_DIR/clean. For each submission, in
# the order of the file names: the clean copy is copied back to OUT_DIR/work/copy, the
# submission's files are put in (only the files that hold holes: STUDENT_COPY.tsv; those that
# differ from the clean copy's), the copy is
# rebuilt (only what changed) and graded with tools/grade.sh against the teacher's rubrics, the
# visible and the hidden cases. A submission that is malformed (not a gzipped tar, no manifest,
# a path outside the exercise files, a checksum that does not match, ...), does not build, or
# runs past its time limit gets its row with that status and 0 points; the others go on.
#
# OUT_DIR/grades.csv: one row per submission, student,submission,status,points_earned,
# points_possible, then each exercise's points earned. OUT_DIR/results/<student>/: the score
# sheet, points.csv and points.json, the logs (the sheet names them there). A summary table is
# printed at the end. Every path the script prints, and every path a sheet names, exists when it
# ends: the copy each submission was built in is removed, so a build error names its file by its
# place in the repository.
# OUT_DIR must be new or empty, or one this script made (its clean copy is then used again).
# Exit status: 0 every submission was graded (whatever its points), 1 one or more could not be
# (malformed, no build, timed out), 2 a wrong command line or the clean copy could not be made.
set -uo pipefail

usage="usage: tools/classroom/grade_all.sh [--build DIR] [--from SOURCE] [--timeout S] [--case-timeout S] [--build-timeout S] SUBMISSIONS_DIR OUT_DIR"
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build="$root/build" from="$root" timeout=1200 case_timeout=120 build_timeout=900 args=()
while [ "$#" -gt 0 ]; do
  case "$1" in
    -h|--help) echo "$usage"; exit 0 ;;
    --build|--from|--timeout|--case-timeout|--build-timeout)
      [ "$#" -ge 2 ] || { echo "grade_all.sh: $1 needs a value" >&2; exit 2; }
      case "$1" in
        --build) build=$2 ;;
        --from) from=$2 ;;
        --timeout) timeout=$2 ;;
        --case-timeout) case_timeout=$2 ;;
        --build-timeout) build_timeout=$2 ;;
      esac
      shift 2 ;;
    -*) echo "grade_all.sh: unknown option '$1'" >&2; echo "$usage" >&2; exit 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
[ "${#args[@]}" -eq 2 ] || { echo "$usage" >&2; exit 2; }
for t in "$timeout" "$case_timeout" "$build_timeout"; do
  [[ $t =~ ^[1-9][0-9]*$ ]] || { echo "grade_all.sh: '$t' is not a whole number of seconds" >&2; exit 2; }
done
submissions=${args[0]} out=${args[1]}
[ -d "$submissions" ] || { echo "grade_all.sh: $submissions is not a folder" >&2; exit 2; }
submissions=$(cd "$submissions" && pwd)
student_copy="$build/bin/student_copy"
[ -x "$student_copy" ] || { echo "grade_all.sh: $student_copy not built (build the repository first, or give --build)" >&2; exit 2; }
[ -d "$from/chapters" ] || { echo "grade_all.sh: --from $from: not this repository" >&2; exit 2; }
from=$(cd "$from" && pwd)
rubrics="$from/tools/classroom/rubrics"
grade="$root/tools/grade.sh"
marker_line="grade_all.sh: a folder of graded submissions, format 1"
if [ -e "$out" ] && [ -n "$(ls -A "$out" 2>/dev/null)" ] && [ "$(head -n 1 "$out/.grade_all" 2>/dev/null)" != "$marker_line" ]; then
  echo "grade_all.sh: $out exists and is not empty (nor a folder this script made): nothing in it was touched" >&2
  exit 2
fi
mkdir -p "$out" && echo "$marker_line" >"$out/.grade_all" || { echo "grade_all.sh: cannot write in $out" >&2; exit 2; }
out=$(cd "$out" && pwd)
work="$out/work/copy" clean="$out/clean"

# --- The clean copy, made and built once (kept for the next run while its sources are the same).
cache_value() { sed -n "s/^$1:[A-Z]*=//p" "$build/CMakeCache.txt" 2>/dev/null | head -n 1; }
backend=$(cache_value MGPU_BACKEND) build_type=$(cache_value CMAKE_BUILD_TYPE)
if [ ! -f "$clean/.built" ]; then
  echo "== a clean student copy, with the hidden cases, built once ($out/clean.log)"
  rm -rf "$clean" "$out/work"
  mkdir -p "$out/work"
  {
    "$student_copy" --from "$from" --to "$work" &&
      { [ ! -d "$from/tests/hidden" ] || cp -a "$from/tests/hidden" "$work/tests/hidden"; } &&
      cmake -S "$work" -B "$work/build" ${backend:+-DMGPU_BACKEND=$backend} ${build_type:+-DCMAKE_BUILD_TYPE=$build_type} &&
      cmake --build "$work/build" -j"$(nproc)"
  } >"$out/clean.log" 2>&1 || {
    tail -n 30 "$out/clean.log"
    echo "grade_all.sh: the clean student copy could not be made or built (the log above, $out/clean.log)" >&2
    exit 2
  }
  cp -a "$work" "$clean" && touch "$clean/.built" || { echo "grade_all.sh: cannot keep the clean copy in $clean" >&2; exit 2; }
fi

# The exercises, in the rubrics' order: the table's columns.
mapfile -t columns < <(awk '$1 == "exercise" { print $2 }' "$rubrics"/*.rubric)

# check_submission FILE EXTRACTED: sets $why to "" when FILE is a well-formed submission (then
# unpacked into EXTRACTED, its student in $student), else to why not.
check_submission() {
  local file=$1 into=$2 i kind path sum names types
  student="" why=""
  if ! tar -tzf "$file" >/dev/null 2>&1; then why="not a gzipped tar archive (make it with tools/classroom/submit.sh)"; return; fi
  mapfile -t names < <(tar -tzf "$file")
  mapfile -t types < <(tar -tzvf "$file" | cut -c1)
  [ "${#names[@]}" -gt 0 ] || { why="an empty archive"; return; }
  for i in "${!names[@]}"; do
    case "${types[$i]}" in -|d) ;; *) why="'${names[$i]}' is not a plain file or folder (links and devices are refused)"; return ;; esac
    case "/${names[$i]}/" in */../*|*/./*) why="'${names[$i]}' leaves the submission's folder"; return ;; esac
    case "${names[$i]}" in
      submission/|submission/MANIFEST|submission/files/|submission/files/*) ;;
      *) why="'${names[$i]}' is neither submission/MANIFEST nor under submission/files/ (make it with tools/classroom/submit.sh)"; return ;;
    esac
  done
  [ "$(du -k "$file" | cut -f1)" -le 10240 ] || { why="larger than 10 MiB"; return; }
  mkdir -p "$into"
  tar -xzf "$file" -C "$into" --no-same-owner --no-same-permissions 2>/dev/null || { why="cannot be unpacked"; return; }
  local manifest="$into/submission/MANIFEST"
  [ -f "$manifest" ] || { why="no submission/MANIFEST"; return; }
  [ "$(head -n 1 "$manifest")" = "mgpu submission, format 1" ] ||
    { why="the MANIFEST's first line is not 'mgpu submission, format 1'"; return; }
  student=$(sed -n 's/^student //p' "$manifest" | head -n 1)
  if ! [[ $student =~ ^[A-Za-z0-9][A-Za-z0-9._@-]*$ ]] || [ "${#student}" -gt 64 ]; then
    student="" why="the MANIFEST names no valid student ('student ID')"
    return
  fi
  local -A listed allowed
  while IFS=$'\t' read -r _ path; do allowed[$path]=1; done <"$clean/STUDENT_COPY.tsv"
  while read -r kind path sum; do
    [ "$kind" = file ] || continue
    [ -n "${allowed[$path]:-}" ] || { why="$path is not a file that holds an exercise"; return; }
    [ -f "$into/submission/files/$path" ] || { why="the MANIFEST names $path, which the archive lacks"; return; }
    [ "$(sha256sum "$into/submission/files/$path" | cut -d' ' -f1)" = "$sum" ] ||
      { why="$path does not match its checksum in the MANIFEST"; return; }
    listed[$path]=1
  done <"$manifest"
  [ "${#listed[@]}" -gt 0 ] || { why="the MANIFEST names no file"; return; }
  while IFS= read -r -d '' path; do
    path=${path#"$into/submission/files/"}
    [ -n "${listed[$path]:-}" ] || { why="$path is in the archive but not in the MANIFEST"; return; }
  done < <(find "$into/submission/files" -type f -print0 2>/dev/null)
}

# keep_paths_of_sheet SHEET FROM TO: every FROM in the file SHEET replaced by TO (plain text, not
# a pattern: a path may hold any character sed would read as one).
keep_paths_of_sheet() {
  local sheet=$1 from=$2 to=$3 line
  [ -f "$sheet" ] || return 0
  while IFS= read -r line || [ -n "$line" ]; do printf '%s\n' "${line//"$from"/"$to"}"; done <"$sheet" >"$sheet.tmp" &&
    mv "$sheet.tmp" "$sheet"
}

csv="$out/grades.csv"
{
  printf 'student,submission,status,points_earned,points_possible'
  printf ',%s' "${columns[@]}"
  printf '\n'
} >"$csv"
rows=() not_graded=0
declare -A seen
row() {  # student submission status earned possible [points.csv]
  local status=${3//,/;}
  status=${status//\"/\'}
  local line="$1,$2,$status,$4,$5" c
  for c in "${columns[@]}"; do
    if [ -n "${6:-}" ]; then
      line+=,$(awk -F, -v e="$c" '$3 == e && $8 != "missing" && $8 != "skipped" { s += $6; n++ } END { if (n) print s }' "$6")
    else
      line+=,
    fi
  done
  echo "$line" >>"$csv"
  rows+=("$1|$3|$4|$5|$2")
}

shopt -s nullglob
for file in "$submissions"/*; do
  [ -f "$file" ] || continue
  base=$(basename "$file")
  echo "== $base"
  scratch="$out/work/unpacked"
  rm -rf "$scratch"
  check_submission "$file" "$scratch"
  if [ -n "$why" ]; then
    echo "   malformed: $why"
    row "${student:-?}" "$base" "malformed: $why" 0 0
    not_graded=$((not_graded + 1))
    continue
  fi
  if [ -n "${seen[$student]:-}" ]; then
    echo "   malformed: $student already handed in ${seen[$student]}"
    row "$student" "$base" "malformed: $student already handed in ${seen[$student]}" 0 0
    not_graded=$((not_graded + 1))
    continue
  fi
  seen[$student]=$base
  results="$out/results/$student"
  rm -rf "$results" && mkdir -p "$results"
  cp "$scratch/submission/MANIFEST" "$results/MANIFEST"
  rm -rf "$work" && cp -a "$clean" "$work" && rm -f "$work/.built"
  (cd "$scratch/submission/files" && find . -type f -print0) | while IFS= read -r -d '' path; do
    # Only what differs from the clean copy: the rebuild then compiles those files alone.
    cmp -s "$scratch/submission/files/$path" "$work/$path" || cp "$scratch/submission/files/$path" "$work/$path"
  done
  echo "   $student: building"
  if ! timeout --kill-after=10 "$build_timeout" cmake --build "$work/build" -j"$(nproc)" >"$results/build.log" 2>&1; then
    status=$?
    if [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then why="build timed out after $build_timeout s"; else why="does not build"; fi
    # The copy is gone when this script ends: name the files by their place in the repository.
    grep -m 3 'error' "$results/build.log" | while IFS= read -r line; do printf '   %s\n' "${line//"$work/"/}"; done
    echo "   $student: $why ($results/build.log)"
    row "$student" "$base" "$why" 0 0
    not_graded=$((not_graded + 1))
    continue
  fi
  echo "   $student: grading (at most $timeout s, $case_timeout s a test)"
  timeout --kill-after=10 "$timeout" "$grade" "$work/build" --student "$student" --rubrics "$rubrics" \
    --timeout "$case_timeout" >"$results/sheet.txt" 2>&1
  status=$?
  # The sheet names its logs, points.csv and points.json in the copy's build/grade, which is
  # removed below: they are kept in results/STUDENT/logs, and the sheet is made to say so.
  cp -r "$work/build/grade" "$results/logs" 2>/dev/null
  keep_paths_of_sheet "$results/sheet.txt" "$work/build/grade/" "$results/logs/"
  if [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then
    echo "   $student: timed out after $timeout s ($results/sheet.txt)"
    row "$student" "$base" "timed out after $timeout s" 0 0
    not_graded=$((not_graded + 1))
  elif [ "$status" -gt 1 ] || [ ! -f "$work/build/grade/points.csv" ]; then
    echo "   $student: grade.sh could not grade it (status $status; $results/sheet.txt)"
    row "$student" "$base" "not graded (grade.sh status $status)" 0 0
    not_graded=$((not_graded + 1))
  else
    cp "$work/build/grade/points.csv" "$work/build/grade/points.json" "$results/"
    earned=$(awk -F, 'NR > 1 { s += $6 } END { print s + 0 }' "$results/points.csv")
    possible=$(awk -F, 'NR > 1 { s += $7 } END { print s + 0 }' "$results/points.csv")
    echo "   $student: $earned of $possible points"
    row "$student" "$base" graded "$earned" "$possible" "$results/points.csv"
  fi
done
rm -rf "$work" "$out/work/unpacked"

echo
printf '%-16s %-30s %8s  %s\n' student submission points status
for r in "${rows[@]}"; do
  IFS='|' read -r s st e p b <<<"$r"
  printf '%-16s %-30s %8s  %s\n' "$s" "$b" "$e/$p" "$st"
done
echo "${#rows[@]} submissions, $not_graded not graded; the table for a gradebook: $csv"
[ "$not_graded" -eq 0 ]
