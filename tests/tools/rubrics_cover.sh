#!/usr/bin/env bash
# The rubrics (tools/classroom/rubrics/) and the build agree: every exercise (a ctest test
# labelled "exercise", one per marked exercise: test_holes checks that) has its rubric entry
# with at least one visible case, every exercise named in a rubric is one, and every graded case
# is a ctest test of the build (a hidden one only where tests/hidden/ is there: not in a student
# copy), so that no point is given for a test that does not exist. Runs in a second, in the
# repository and in a student copy alike.
#
#   rubrics_cover.sh BUILD_DIR
set -euo pipefail
build=${1:?usage: rubrics_cover.sh BUILD_DIR}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
rubrics="$root/tools/classroom/rubrics"
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# The build's tests from ctest's own JSON (as tools/grade.sh reads them).
command -v jq >/dev/null || { echo "SKIPPED: needs jq, which tools/grade.sh uses (apt-get install jq)"; exit 77; }
listing=$(ctest --test-dir "$build" --show-only=json-v1)
mapfile -t marked < <(jq -r '.tests[] | select(any(.properties[]?; .name == "LABELS" and any(.value[]; . == "exercise"))) | .name' <<<"$listing")
[ "${#marked[@]}" -gt 0 ] || { echo "FAIL: $build lists no exercise test"; exit 1; }
declare -A in_build
while IFS= read -r t; do in_build[$t]=1; done < <(jq -r '.tests[].name' <<<"$listing")
declare -A rubric_exercise visible
while read -r file kind name _; do
  case "$kind" in
    exercise) rubric_exercise[$name]=$file ;;
    case)
      visible[${name%%:*}]=1
      [ -n "${in_build[$name]:-}" ] || fail "$file: the case $name is not a ctest test of $build" ;;
    hidden)
      if [ -d "$root/tests/hidden" ] && [ -z "${in_build[$name]:-}" ]; then fail "$file: the hidden case $name is not a ctest test of $build"; fi ;;
  esac
done < <(awk '{ print FILENAME, $0 }' "$rubrics"/*.rubric | sed "s|^$rubrics/||")
for e in "${marked[@]}"; do
  [ -n "${rubric_exercise[$e]:-}" ] || fail "$e is an exercise of the build but in no rubric"
  [ -n "${visible[$e]:-}" ] || fail "$e has no visible graded case"
done
# (A lookup, not `printf ... | grep -q`: under pipefail, grep's early exit can fail printf with
# SIGPIPE and the pipe with it, for an exercise that is there.)
declare -A is_marked
for e in "${marked[@]}"; do is_marked[$e]=1; done
for e in "${!rubric_exercise[@]}"; do
  [ -n "${is_marked[$e]:-}" ] || fail "${rubric_exercise[$e]}: $e is not an exercise of the build"
done
if [ "$failures" -gt 0 ]; then echo "$failures check(s) failed"; exit 1; fi
echo "PASS: ${#marked[@]} exercises, each in a rubric; every graded case is a test of the build"
