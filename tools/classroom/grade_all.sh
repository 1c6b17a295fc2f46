#!/usr/bin/env bash
# Grades a folder of submissions (tools/classroom/submit.sh's .tar.gz files) into one table,
# each student's code built and run in a sandbox of its own (tools/classroom/sandbox.sh).
#
#   tools/classroom/grade_all.sh [options] SUBMISSIONS_DIR OUT_DIR
#
#   --build DIR          this repository's build, with build/bin/student_copy (default: build)
#   --from SOURCE        the repository the clean copy is made from (default: this one)
#   --timeout S          the time limit of one submission's grading, in seconds (default 1200)
#   --case-timeout S     the time limit of one test (default 120): a test that runs longer fails
#   --build-timeout S    the time limit of one submission's build (default 900)
#   --only A[,A...]      grade these assignments only (their rubrics' names, as 02_data_parallel):
#                        the clean copy has holes in their exercises alone, the others solved,
#                        and the points are out of theirs
#   --no-sandbox         run the students' code as the teacher's user, unconfined (only where
#                        no sandbox can be made; every row then says so)
#
# 1. Every entry of SUBMISSIONS_DIR gets exactly one row, in the order of the names: a file
#    STUDENT.tar.gz is checked (a gzipped tar listed within 60 s, at most 10 MiB packed and 16
#    MiB unpacked, no member over 4 MiB, only plain files and folders, all of them
#    submission/MANIFEST or under submission/files/, no '..'; a MANIFEST of that format whose
#    student is the STUDENT of the file's name; every file one that holds an exercise, listed,
#    with its checksum). Anything else (another name, a folder, a link, a FIFO) is refused with
#    the reason; nothing in it is read.
# 2. A clean student copy (build/bin/student_copy), with the teacher's hidden cases put back, is
#    configured (the backend and build type of --build) and built once, outside any sandbox and
#    before any student file is near it, then kept as OUT_DIR/clean with a manifest of every
#    file's checksum (OUT_DIR/clean.sha256), checked whenever a run uses it again.
# 3. For each accepted submission: the clean copy is copied to OUT_DIR/work/copy, the sources
#    of the hidden cases in it are blanked (their objects and programs are built already; the
#    blanks keep the sources' times, so nothing rebuilds them), the student's files that differ
#    are put in, and the copy is rebuilt in a sandbox that sees only that copy (read-write), no
#    network, at most --build-timeout. Then tools/grade.sh, outside the sandbox, grades it with
#    the teacher's rubrics: each test runs in a fresh sandbox that sees the copy read-only (a
#    test can change nothing a later test or the grader reads), with a /tmp and the build's
#    Testing/ and test-results/ of its own in memory, at most --case-timeout, its output cut at
#    1 MiB; a case the rubrics name that the copy lacks fails (grade.sh --all-cases). When the
#    grading ends, nothing the student's code started is left running.
#
# OUT_DIR/grades.csv (RFC 4180: fields with a comma, a quote or a line break are quoted):
# student,submission,status,points_earned,points_possible, then each exercise's points, then
# each assignment's as EARNED/POSSIBLE.
# OUT_DIR/results/STUDENT/: what may go back to the student: the score sheet, points.csv,
# points.json, the manifest, the build log and the logs of the visible cases; a hidden case's
# log there says only its name, its points and passed or failed. OUT_DIR/teacher/STUDENT/logs/:
# every log, hidden cases' included. Every path the script prints exists when it ends.
# OUT_DIR must be new or empty, or one this script made (its clean copy is then used again).
# Exit status: 0 every submission was graded (whatever its points), 1 one or more could not be
# (refused, no build, timed out), 2 a wrong command line, no sandbox, or the clean copy could
# not be made.
set -uo pipefail

usage="usage: tools/classroom/grade_all.sh [--build DIR] [--from SOURCE] [--timeout S] [--case-timeout S] [--build-timeout S] [--only ASSIGNMENT[,...]] [--no-sandbox] SUBMISSIONS_DIR OUT_DIR"
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build="$root/build" from="$root" timeout=1200 case_timeout=120 build_timeout=900 sandboxed=1 only="" args=()
while [ "$#" -gt 0 ]; do
  case "$1" in
    -h|--help) echo "$usage"; exit 0 ;;
    --no-sandbox) sandboxed=0; shift ;;
    --build|--from|--timeout|--case-timeout|--build-timeout|--only)
      [ "$#" -ge 2 ] || { echo "grade_all.sh: $1 needs a value" >&2; exit 2; }
      case "$1" in
        --build) build=$2 ;;
        --from) from=$2 ;;
        --timeout) timeout=$2 ;;
        --case-timeout) case_timeout=$2 ;;
        --build-timeout) build_timeout=$2 ;;
        --only) only=$2 ;;
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
# --only: the chosen assignments' rubrics, and their exercises (student_copy --only).
only_exercises=""
if [ -n "$only" ]; then
  IFS=, read -ra chosen <<<"$only"
  for a in "${chosen[@]}"; do
    [ -f "$rubrics/$a.rubric" ] || { echo "grade_all.sh: --only $a: no such assignment (no $rubrics/$a.rubric)" >&2; exit 2; }
  done
  only_exercises=$(for a in "${chosen[@]}"; do awk '$1 == "exercise" { print $2 }' "$rubrics/$a.rubric"; done | paste -sd, -)
  [ -n "$only_exercises" ] || { echo "grade_all.sh: --only $only: those assignments have no exercise" >&2; exit 2; }
fi
grade="$root/tools/grade.sh" sandbox="$root/tools/classroom/sandbox.sh"
if [ "$sandboxed" -eq 1 ]; then
  "$sandbox" -- true >/dev/null 2>&1
  case $? in
    0) ;;
    77) echo "grade_all.sh: no sandbox can be made on this machine ($("$sandbox" -- true 2>&1 | tail -n 1)); --no-sandbox grades unconfined" >&2; exit 2 ;;
    *) echo "grade_all.sh: the sandbox does not work here: $("$sandbox" -- true 2>&1 | tail -n 1)" >&2; exit 2 ;;
  esac
fi
marker_line="grade_all.sh: a folder of graded submissions, format 2"
if [ -e "$out" ] && [ -n "$(ls -A "$out" 2>/dev/null)" ] && [ "$(head -n 1 "$out/.grade_all" 2>/dev/null)" != "$marker_line" ]; then
  echo "grade_all.sh: $out exists and is not empty (nor a folder this script made): nothing in it was touched" >&2
  exit 2
fi
mkdir -p "$out" && echo "$marker_line" >"$out/.grade_all" || { echo "grade_all.sh: cannot write in $out" >&2; exit 2; }
out=$(cd "$out" && pwd)
work="$out/work/copy" clean="$out/clean" sums="$out/clean.sha256"
rm -rf "$out/work" && mkdir -p "$out/work"
# The rubrics grade.sh reads: all of them, or the chosen assignments' only.
if [ -n "$only" ]; then
  mkdir -p "$out/work/rubrics" && for a in "${chosen[@]}"; do cp "$rubrics/$a.rubric" "$out/work/rubrics/"; done
  rubrics="$out/work/rubrics"
fi

# --- The clean copy's sources (the files that hold exercises are needed to check submissions).
# Kept from an earlier run only while every file is what its manifest says.
if [ -f "$clean/.built" ] && ! (cd "$clean" && sha256sum --quiet --strict -c "$sums" >/dev/null 2>&1); then
  echo "== the clean copy in $clean differs from its manifest ($sums): made again"
  rm -f "$clean/.built"
fi
if [ -f "$clean/.built" ] && [ "$(cat "$out/clean.only" 2>/dev/null)" != "$only_exercises" ]; then
  echo "== the clean copy in $clean has holes in other exercises than this run's: made again"
  rm -f "$clean/.built"
fi
if [ ! -f "$clean/.built" ]; then
  rm -rf "$clean" "$sums"
  printf '%s\n' "$only_exercises" >"$out/clean.only"
  "$student_copy" --from "$from" --to "$work" ${only_exercises:+--only "$only_exercises"} >"$out/clean.log" 2>&1 ||
    { cat "$out/clean.log" >&2; echo "grade_all.sh: the student copy could not be made ($out/clean.log)" >&2; exit 2; }
  allowed_list="$work/STUDENT_COPY.tsv"
else
  allowed_list="$clean/STUDENT_COPY.tsv"
fi

# The exercises, in the rubrics' order, then each assignment's total: the table's columns.
mapfile -t columns < <(awk '$1 == "exercise" { print $2 }' "$rubrics"/*.rubric)
mapfile -t assignment_columns < <(for f in "$rubrics"/*.rubric; do basename "$f" .rubric; done)

# check_submission FILE EXTRACTED: sets $why to "" when FILE is a well-formed submission (then
# unpacked into EXTRACTED, its student in $student), else to why not. Every step is bounded:
# the listing in time, the unpacking by the listed sizes.
check_submission() {
  local file=$1 into=$2 name=${1##*/} line type size path kind sum total=0 listing
  student="" why=""
  if [[ ! $name =~ ^([A-Za-z0-9][A-Za-z0-9._@-]*)\.tar\.gz$ ]] || [ "${#BASH_REMATCH[1]}" -gt 64 ]; then
    why="not named STUDENT.tar.gz (the student's id, as submit.sh takes it)"
    return
  fi
  local named=${BASH_REMATCH[1]}
  [ "$(du -k "$file" | cut -f1)" -le 10240 ] || { why="larger than 10 MiB"; return; }
  # One listing, names escaped (a line break in a name is then \n), sizes in bytes.
  if ! listing=$(timeout 60 tar --quoting-style=escape --numeric-owner -tzvf "$file" 2>/dev/null); then
    why="not a gzipped tar archive that can be listed within 60 s (make it with tools/classroom/submit.sh)"
    return
  fi
  [ -n "$listing" ] || { why="an empty archive"; return; }
  while IFS= read -r line; do
    type=${line:0:1}
    read -r _ _ size _ _ path <<<"$line"
    case "$type" in -|d) ;; *) why="'$path' is not a plain file or folder (links and devices are refused)"; return ;; esac
    case "$path" in *\\*) why="a member's name holds a character that needs escaping: '$path'"; return ;; esac
    case "/$path/" in */../*|*/./*) why="'$path' leaves the submission's folder"; return ;; esac
    case "$path" in
      submission/|submission/MANIFEST|submission/files/|submission/files/*) ;;
      *) why="'$path' is neither submission/MANIFEST nor under submission/files/ (make it with tools/classroom/submit.sh)"; return ;;
    esac
    [[ $size =~ ^[0-9]+$ ]] || { why="cannot read the size of '$path' in the listing"; return; }
    [ "$size" -le $((4 * 1024 * 1024)) ] || { why="'$path' unpacks to $size bytes (at most 4 MiB a file)"; return; }
    total=$((total + size))
    [ "$total" -le $((16 * 1024 * 1024)) ] || { why="unpacks to more than 16 MiB"; return; }
  done <<<"$listing"
  mkdir -p "$into"
  timeout 60 tar -xzf "$file" -C "$into" --no-same-owner --no-same-permissions 2>/dev/null || { why="cannot be unpacked"; return; }
  local manifest="$into/submission/MANIFEST"
  [ -f "$manifest" ] || { why="no submission/MANIFEST"; return; }
  [ "$(head -n 1 "$manifest")" = "mgpu submission, format 1" ] ||
    { why="the MANIFEST's first line is not 'mgpu submission, format 1'"; return; }
  student=$(sed -n 's/^student //p' "$manifest" | head -n 1)
  if ! [[ $student =~ ^[A-Za-z0-9][A-Za-z0-9._@-]*$ ]] || [ "${#student}" -gt 64 ]; then
    student="" why="the MANIFEST names no valid student ('student ID')"
    return
  fi
  if [ "$student" != "$named" ]; then
    why="the file is named for $named, its MANIFEST for $student"
    student=$named
    return
  fi
  local -A listed=() allowed=()
  while IFS=$'\t' read -r _ path; do allowed[$path]=1; done <"$allowed_list"
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

# A field of grades.csv as RFC 4180 writes it: quoted, quotes doubled, when it holds a comma,
# a quote or a line break.
csv_field() {
  local v=$1
  if [[ $v == *[,\"$'\n\r']* ]]; then v=${v//\"/\"\"}; printf '"%s"' "$v"; else printf '%s' "$v"; fi
}
# A name as the printed table shows it: control characters as '?'.
printable() { local v=$1; printf '%s' "${v//[[:cntrl:]]/?}"; }

csv="$out/grades.csv"
{
  printf 'student,submission,status,points_earned,points_possible'
  printf ',%s' "${columns[@]}"
  printf ',%s' "${assignment_columns[@]}"
  printf '\n'
} >"$csv"
rows=() not_graded=0
row() {  # student submission status earned possible [points.csv]
  local line c
  line="$(csv_field "$1"),$(csv_field "$2"),$(csv_field "$3"),$4,$5"
  for c in "${columns[@]}"; do
    if [ -n "${6:-}" ]; then
      line+=,$(awk -F, -v e="$c" '$3 == e && $8 != "missing" && $8 != "skipped" { s += $6; n++ } END { if (n) print s }' "$6")
    else
      line+=,
    fi
  done
  for c in "${assignment_columns[@]}"; do  # earned of possible, as "5/6"
    if [ -n "${6:-}" ]; then
      line+=,$(awk -F, -v a="$c" '$2 == a { e += $6; p += $7; n++ } END { if (n) print e "/" p }' "$6")
    else
      line+=,
    fi
  done
  printf '%s\n' "$line" >>"$csv"
  rows+=("$(printable "$1")|$(printable "$3")|$4|$5|$(printable "$2")")
}

# --- 1. Every entry checked, before anything is built.
shopt -s nullglob dotglob
accepted=() n=0
for file in "$submissions"/*; do
  base=${file##*/}
  n=$((n + 1))
  echo "== $(printable "$base")"
  if [ -L "$file" ] || [ ! -f "$file" ]; then
    if [ -L "$file" ]; then kind="a symbolic link"; elif [ -d "$file" ]; then kind="a folder"
    elif [ -p "$file" ]; then kind="a FIFO"; else kind="not a plain file"; fi
    echo "   refused: $kind"
    row "?" "$base" "refused: $kind" 0 0
    not_graded=$((not_graded + 1))
    continue
  fi
  unpacked="$out/work/unpacked/$n"
  check_submission "$file" "$unpacked"
  if [ -n "$why" ]; then
    echo "   refused: $why"
    row "${student:-?}" "$base" "refused: $why" 0 0
    not_graded=$((not_graded + 1))
    continue
  fi
  accepted+=("$student|$base|$unpacked")
done
shopt -u dotglob

# --- 2. The clean copy, built once, before any student file is near it.
if [ "${#accepted[@]}" -gt 0 ] && [ ! -f "$clean/.built" ]; then
  cache_value() { sed -n "s/^$1:[A-Z]*=//p" "$build/CMakeCache.txt" 2>/dev/null | head -n 1; }
  backend=$(cache_value MGPU_BACKEND) build_type=$(cache_value CMAKE_BUILD_TYPE)
  echo "== a clean student copy, with the hidden cases, built once ($out/clean.log)"
  {
    { [ ! -d "$from/tests/hidden" ] || cp -a "$from/tests/hidden" "$work/tests/hidden"; } &&
      cmake -S "$work" -B "$work/build" ${backend:+-DMGPU_BACKEND=$backend} ${build_type:+-DCMAKE_BUILD_TYPE=$build_type} &&
      cmake --build "$work/build" -j"$(nproc)"
  } >>"$out/clean.log" 2>&1 || {
    tail -n 30 "$out/clean.log"
    echo "grade_all.sh: the clean student copy could not be made or built (the log above, $out/clean.log)" >&2
    exit 2
  }
  cp -a "$work" "$clean" && (cd "$clean" && find . -type f -print0 | sort -z | xargs -0 sha256sum) >"$sums" &&
    touch "$clean/.built" || { echo "grade_all.sh: cannot keep the clean copy in $clean" >&2; exit 2; }
fi

# The hidden cases' sources (tests/hidden/, its CMakeLists.txt included), blanked in the copy a
# student's code is built and run in. Their objects are built and the build is configured; each
# blank keeps its source's time, so neither is done again (if a student's header makes one
# object be rebuilt, its case is gone, and grade.sh --all-cases fails it).
blank_hidden_sources() {
  local f
  [ -d "$work/tests/hidden" ] || return 0
  while IFS= read -r -d '' f; do
    printf '// (a hidden case: its source is not in the copy a submission is graded in)\n' >"$f.blank" &&
      touch -r "$f" "$f.blank" && mv "$f.blank" "$f"
  done < <(find "$work/tests/hidden" -type f -print0)
}

# The runner grade.sh calls each ctest through: a fresh sandbox a test, the copy read-only.
runner="$out/work/run_in_sandbox.sh"
cat >"$runner" <<EOF
#!/bin/sh
# grade.sh --runner: one ctest call in a sandbox of its own (tools/classroom/sandbox.sh).
exec "$sandbox" --ro "$work" --tmpfs "$work/build/Testing" --tmpfs "$work/build/test-results" \\
  --chdir "$work" --time $((case_timeout + 30)) --memory 8192 --tmp-size 256 --output 1048576 -- "\$@"
EOF
chmod +x "$runner"
runner_args=()
[ "$sandboxed" -eq 1 ] && runner_args=(--runner "$runner")

# The logs a student gets back: a hidden case's log says only what the sheet says of it.
redact_hidden_logs() {  # RESULTS_DIR POINTS_CSV
  local _s _a _e case visibility _earned points status
  while IFS=, read -r _s _a _e case visibility _earned points status; do
    [ "$visibility" = hidden ] && [ -f "$1/logs/$case.log" ] || continue
    printf 'hidden case %s (%s points): %s; its log stays with the teacher\n' "$case" "$points" "$status" \
      >"$1/logs/$case.log"
  done < <(tail -n +2 "$2")
}
# replace_in_file FILE FROM TO: every FROM in FILE replaced by TO (plain text, not a pattern: a
# path may hold any character sed would read as one).
replace_in_file() {
  local line
  while IFS= read -r line || [ -n "$line" ]; do printf '%s\n' "${line//"$2"/"$3"}"; done <"$1" >"$1.tmp" && mv "$1.tmp" "$1"
}

# --- 3. Each accepted submission, in a sandbox.
for entry in "${accepted[@]}"; do
  IFS='|' read -r student base unpacked <<<"$entry"
  echo "== $student ($base)"
  results="$out/results/$student" teacher="$out/teacher/$student"
  rm -rf "$results" "$teacher" && mkdir -p "$results" "$teacher"
  cp "$unpacked/submission/MANIFEST" "$results/MANIFEST"
  rm -rf "$work" && cp -a "$clean" "$work" && rm -f "$work/.built"
  blank_hidden_sources
  (cd "$unpacked/submission/files" && find . -type f -print0) | while IFS= read -r -d '' path; do
    # Only what differs from the clean copy: the rebuild then compiles those files alone.
    cmp -s "$unpacked/submission/files/$path" "$work/$path" || cp "$unpacked/submission/files/$path" "$work/$path"
  done
  echo "   $student: building"
  if [ "$sandboxed" -eq 1 ]; then
    "$sandbox" --rw "$work" --chdir "$work" --time "$build_timeout" --output 4194304 --memory 16384 --tmp-size 1024 \
      -- cmake --build "$work/build" -j"$(nproc)" >"$results/build.log" 2>&1
  else
    timeout --kill-after=10 "$build_timeout" cmake --build "$work/build" -j"$(nproc)" >"$results/build.log" 2>&1
  fi
  status=$?
  replace_in_file "$results/build.log" "$work/" ""  # a file named by its place in the repository
  if [ "$status" -ne 0 ]; then
    if [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then why="build timed out after $build_timeout s"; else why="does not build"; fi
    grep -m 3 'error' "$results/build.log" | while IFS= read -r line; do printf '   %s\n' "$line"; done
    echo "   $student: $why ($results/build.log)"
    row "$student" "$base" "$why" 0 0
    not_graded=$((not_graded + 1))
    continue
  fi
  echo "   $student: grading (at most $timeout s, $case_timeout s a test)"
  mkdir -p "$work/build/Testing" "$work/build/test-results"  # the tests' own, in memory, in the sandbox
  timeout --kill-after=10 "$timeout" "$grade" "$work/build" --student "$student" --rubrics "$rubrics" \
    --timeout "$case_timeout" --all-cases "${runner_args[@]}" >"$results/sheet.txt" 2>&1
  status=$?
  # The sheet names its logs in the copy's build/grade, which is removed below: every log is
  # kept for the teacher, the visible ones (and a line for each hidden one) for the student.
  cp -r "$work/build/grade" "$teacher/logs" 2>/dev/null
  cp -r "$work/build/grade" "$results/logs" 2>/dev/null
  [ -f "$work/build/grade/points.csv" ] && redact_hidden_logs "$results" "$work/build/grade/points.csv"
  replace_in_file "$results/sheet.txt" "$work/build/grade/" "$results/logs/"
  [ "$sandboxed" -eq 1 ] || echo "graded without a sandbox (--no-sandbox)" >>"$results/sheet.txt"
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
    label=graded
    [ "$sandboxed" -eq 1 ] || label="graded without a sandbox"
    row "$student" "$base" "$label" "$earned" "$possible" "$results/points.csv"
  fi
done
rm -rf "$out/work"

echo
printf '%-16s %-30s %8s  %s\n' student submission points status
for r in "${rows[@]}"; do
  IFS='|' read -r s st e p b <<<"$r"
  printf '%-16s %-30s %8s  %s\n' "$s" "$b" "$e/$p" "$st"
done
echo "$n entries in $(printable "$submissions"), $not_graded not graded; the table for a gradebook: $csv"
[ "$not_graded" -eq 0 ]
