#!/usr/bin/env bash
# tools/classroom/student_copy: a copy that stops part way never blocks the next try, and the
# program never empties a folder it cannot prove its own.
#   - a copy that fails (a file too big to write) removes what it wrote: the --to folder (and
#     the folders it made above it) is gone again, or empty again when it was an empty folder
#     before; the next run writes the copy;
#   - a copy that is killed leaves UNFINISHED_STUDENT_COPY in the folder: the next run empties
#     it and writes the copy (also where the folder is inside the source);
#   - a folder that is not empty and not such a leftover (a finished copy, a file of that name
#     with another first line) is refused and left as it was.
#
#   student_copy_retry.sh STUDENT_COPY      (a second)
#
# The failure is a real one, without a hook in the program: the copy runs under a file size
# limit (ulimit -f, which binds root too), below the size of one file of a small source made
# here. With SIGXFSZ ignored, the write fails (EFBIG) and the program sees an error, as on a
# full disk; with SIGXFSZ at its default, the kernel kills the program there, as a power cut or
# kill -9 would. Exit status 0 passed, 1 failed.
set -euo pipefail

student_copy=$(realpath "${1:?usage: student_copy_retry.sh STUDENT_COPY}")
work=$(mktemp -d "${TMPDIR:-/tmp}/mgpu-student-copy.XXXXXX")
trap 'rm -rf "$work"' EXIT
cd "$work"  # a killed program's core file, if any, goes here
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# A small source: an exercise region (made a hole), and a file of 8 KiB (too big for the limit).
src="$work/source"
mkdir -p "$src/chapters/01_small"
printf '# chapter 01\n' >"$src/chapters/01_small/README.md"
cat >"$src/chapters/01_small/code.cpp" <<'CPP'
int answer() {
  // BEGIN EXERCISE ex01.answer
  return 42;
  // END EXERCISE ex01.answer
}
CPP
head -c 8192 /dev/zero | tr '\0' 'x' >"$src/chapters/01_small/large.txt"

# copy NAME [--limited|--killed] DEST: student_copy --from the source --to DEST; its output in
# $work/NAME.out, its status in $status. --limited: under the size limit, the write failing;
# --killed: under the size limit, the program killed when it passes it.
copy() {
  local name=$1 mode=plain
  shift
  case "$1" in --limited | --killed) mode=$1; shift ;; esac
  status=0
  case "$mode" in
    plain) "$student_copy" --from "$src" --to "$1" ;;
    --limited) bash -c 'ulimit -f 2; trap "" XFSZ; exec "$0" "$@"' "$student_copy" --from "$src" --to "$1" ;;
    --killed) bash -c 'ulimit -f 2; trap - XFSZ; exec "$0" "$@"' "$student_copy" --from "$src" --to "$1" ;;
  esac >"$work/$name.out" 2>&1 || status=$?
}
expect() {  # NAME STATUS REGEX
  if [ "$status" -ne "$2" ]; then fail "$1: status $status, expected $2"; cat "$work/$1.out"; return; fi
  grep -Eq -- "$3" "$work/$1.out" || { fail "$1: the output does not say '$3'"; cat "$work/$1.out"; }
}
complete() {  # NAME DEST: DEST is a finished copy
  [ -f "$2/STUDENT_COPY.md" ] || fail "$1: $2 has no STUDENT_COPY.md"
  [ ! -e "$2/UNFINISHED_STUDENT_COPY" ] || fail "$1: $2 still holds UNFINISHED_STUDENT_COPY"
  cmp -s "$src/chapters/01_small/large.txt" "$2/chapters/01_small/large.txt" || fail "$1: large.txt is not copied whole"
  grep -q 'exercise_not_done("ex01.answer"' "$2/chapters/01_small/code.cpp" || fail "$1: the exercise is not a hole"
}
snapshot() { (cd "$1" && find . -printf '%p %y %s\n' | sort && find . -type f -print0 | sort -z | xargs -0 -r sha256sum); }

echo "-- a copy that fails removes what it wrote; the next run writes it"
copy failed --limited "$work/made/new"
expect failed 1 "large\.txt.*; the unfinished copy was removed"
[ ! -e "$work/made" ] || { fail "failed: $work/made (made by the run) is left"; ls -laR "$work/made"; }
copy retry "$work/made/new"
expect retry 0 "written to $work/made/new"
complete retry "$work/made/new"

echo "-- into an empty folder: after the failure it is empty again; the next run writes the copy"
mkdir "$work/empty"
copy failed_empty --limited "$work/empty"
expect failed_empty 1 "the unfinished copy was removed"
if [ ! -d "$work/empty" ] || [ -n "$(ls -A "$work/empty")" ]; then fail "failed_empty: $work/empty is not an empty folder"; fi
copy retry_empty "$work/empty"
expect retry_empty 0 "written to $work/empty"
complete retry_empty "$work/empty"

echo "-- a killed copy leaves its mark; the next run empties it and writes the copy"
copy killed --killed "$work/killed"
if [ "$status" -ne 153 ]; then  # 128 + SIGXFSZ (25)
  fail "killed: status $status, expected 153 (killed by SIGXFSZ; is SIGXFSZ ignored where this test runs?)"
  cat "$work/killed.out"
fi
[ "$(head -n 1 "$work/killed/UNFINISHED_STUDENT_COPY" 2>/dev/null)" = "student_copy: an unfinished student copy, format 1" ] ||
  fail "killed: the unfinished copy is not marked"
copy retry_killed "$work/killed"
expect retry_killed 0 "is a copy an earlier run left unfinished: it is written anew"
complete retry_killed "$work/killed"

echo "-- the same inside the source: the leftover is neither read nor copied"
copy killed_inside --killed "$src/student"
[ -f "$src/student/UNFINISHED_STUDENT_COPY" ] || fail "killed_inside: the unfinished copy is not marked"
copy retry_inside "$src/student"
expect retry_inside 0 "written to $src/student"
complete retry_inside "$src/student"
[ ! -e "$src/student/student" ] || fail "retry_inside: the copy holds itself"
rm -rf "$src/student"

echo "-- a finished copy is refused and left as it was"
before=$(snapshot "$work/made/new")
copy finished "$work/made/new"
expect finished 1 "--to $work/made/new: exists and is not an empty folder \(nor a copy this program left unfinished\): nothing in it was touched"
[ "$(snapshot "$work/made/new")" = "$before" ] || fail "finished: $work/made/new was changed"

echo "-- a folder with a file named UNFINISHED_STUDENT_COPY of someone else's: refused, left as it was"
mkdir "$work/theirs"
echo "my own notes" >"$work/theirs/UNFINISHED_STUDENT_COPY"
echo "keep" >"$work/theirs/work.txt"
before=$(snapshot "$work/theirs")
copy theirs "$work/theirs"
expect theirs 1 "exists and is not an empty folder"
[ "$(snapshot "$work/theirs")" = "$before" ] || fail "theirs: $work/theirs was changed"

if [ "$failures" -gt 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "PASS: student_copy: a stopped copy never blocks the next, and nothing else is emptied"
