#!/usr/bin/env bash
# Packs a student's work for grading: the files of a student copy that hold its exercises' holes
# (listed in the copy's STUDENT_COPY.tsv), as they are now, with a manifest naming the student,
# each exercise (filled, or still a hole) and each file with its SHA-256.
#
#   tools/classroom/submit.sh --student ID STUDENT_COPY OUT.tar.gz
#
#   ID             your id: letters, digits and . _ @ - (the grader names your results after it)
#   STUDENT_COPY   the top folder of your copy (. when you run it from there)
#   OUT.tar.gz     the file to hand in; it must not exist yet
#
# The archive holds submission/MANIFEST and submission/files/<path> for each file; the teacher's
# tools/classroom/grade_all.sh puts those files into a clean student copy and grades it. Nothing
# else of the copy is handed in: changes outside those files are not graded.
# Exit status: 0 packed, 1 it could not write OUT.tar.gz, 2 a wrong command line or not a student copy.
set -euo pipefail

usage="usage: tools/classroom/submit.sh --student ID STUDENT_COPY OUT.tar.gz"
student="" args=()
while [ "$#" -gt 0 ]; do
  case "$1" in
    -h|--help) echo "$usage"; exit 0 ;;
    --student) [ "$#" -ge 2 ] || { echo "submit.sh: --student needs your id" >&2; exit 2; }; student=$2; shift 2 ;;
    -*) echo "submit.sh: unknown option '$1'" >&2; echo "$usage" >&2; exit 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
if [ "${#args[@]}" -ne 2 ]; then echo "$usage" >&2; exit 2; fi
copy=${args[0]} out=${args[1]}
if [ -z "$student" ]; then echo "submit.sh: say who you are: --student ID" >&2; echo "$usage" >&2; exit 2; fi
if ! [[ $student =~ ^[A-Za-z0-9][A-Za-z0-9._@-]*$ ]] || [ "${#student}" -gt 64 ]; then
  echo "submit.sh: --student '$student': an id is up to 64 letters, digits and . _ @ -, starting with a letter or digit" >&2
  exit 2
fi
if [ ! -f "$copy/STUDENT_COPY.tsv" ]; then
  echo "submit.sh: $copy is not a student copy (it has no STUDENT_COPY.tsv; build/bin/student_copy writes one)" >&2
  exit 2
fi
case "$out" in *.tar.gz) ;; *) echo "submit.sh: $out: the archive's name must end in .tar.gz" >&2; exit 2 ;; esac
if [ -e "$out" ]; then echo "submit.sh: $out exists: choose another name, or remove it first" >&2; exit 2; fi

stage=$(mktemp -d "${TMPDIR:-/tmp}/submission.XXXXXX")
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/submission/files"
manifest="$stage/submission/MANIFEST"
{
  echo "mgpu submission, format 1"
  echo "student $student"
  echo "made $(date -u +%Y-%m-%dT%H:%M:%SZ)"
} >"$manifest"

declare -A packed
filled=() holes=()
while IFS=$'\t' read -r exercise file; do
  [ -n "$exercise" ] || continue
  if [ ! -f "$copy/$file" ]; then
    echo "submit.sh: $copy/$file (of $exercise) is missing: restore it from a fresh student copy" >&2
    exit 2
  fi
  if [ -z "${packed[$file]:-}" ]; then
    mkdir -p "$stage/submission/files/$(dirname "$file")"
    cp "$copy/$file" "$stage/submission/files/$file"
    packed[$file]=1
  fi
done <"$copy/STUDENT_COPY.tsv"
# Each exercise once, filled when none of its files still calls its hole.
while read -r exercise; do
  files=$(awk -F'\t' -v e="$exercise" '$1 == e { printf "%s ", $2 }' "$copy/STUDENT_COPY.tsv")
  state=filled
  for file in $files; do
    grep -q "exercise_not_done(\"$exercise\"" "$copy/$file" && state=hole
  done
  echo "exercise $exercise $state ${files% }" >>"$manifest"
  if [ "$state" = filled ]; then filled+=("$exercise"); else holes+=("$exercise"); fi
done < <(cut -f1 "$copy/STUDENT_COPY.tsv" | awk '!seen[$0]++')
for file in "${!packed[@]}"; do
  echo "file $file $(sha256sum "$stage/submission/files/$file" | cut -d' ' -f1)"
done | sort >>"$manifest"

if ! tar -czf "$out" -C "$stage" submission 2>"$stage/tar.err"; then
  cat "$stage/tar.err" >&2
  rm -f "$out"
  echo "submit.sh: could not write $out" >&2
  exit 1
fi
echo "packed ${#packed[@]} files for $student into $out"
echo "filled (${#filled[@]}): ${filled[*]:-none}"
echo "still holes (${#holes[@]}): ${holes[*]:-none}"
