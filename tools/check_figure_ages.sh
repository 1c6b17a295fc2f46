#!/usr/bin/env bash
# Which of the chapters' committed figures are older than the code they describe. Every figure
# a README shows has a stamp beside it (NAME.stamp.txt, tools/machine_stamp.sh) whose `commit:`
# line names the commit that measured it. A figure is older than its code when its chapter's
# code (the C++ and CUDA sources, the PyTorch twins, the build file) has changed in a commit
# after that one: its numbers may no longer be what the code gives. (common/, which every
# chapter uses, is not counted: a change there would age every figure at once; nor the
# figure scripts, whose edits are mostly their comments.)
#
#   tools/check_figure_ages.sh [--strict] [REPOSITORY]
#
# Prints one line per figure: "current", or "older than its code" with the first commit since
# that touched the chapter (run the chapter's make_figures.sh to measure it again). Exit status
# 1 when a README shows a figure without a stamp, or a stamp names a commit this history does
# not hold (a figure made on a branch that did not land); with --strict, also when a figure is
# older than its code. 2 for a bad command line; 77 (not applicable) outside a git checkout or in
# a shallow clone.
set -uo pipefail
usage="usage: tools/check_figure_ages.sh [--strict] [REPOSITORY]"
strict=0
root=$(cd "$(dirname "$0")/.." && pwd)
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) echo "$usage"; exit 0 ;;
    --strict) strict=1; shift ;;
    -*) echo "$usage" >&2; exit 2 ;;
    *) root=$(cd "$1" && pwd) || exit 2; shift ;;
  esac
done
git -C "$root" rev-parse --verify --quiet HEAD >/dev/null ||
  { echo "check_figure_ages.sh: $root is not a git checkout with a commit: not applicable"; exit 77; }

# A shallow clone (git clone --depth 1) lacks the commits the stamps name.
if [ "$(git -C "$root" rev-parse --is-shallow-repository)" = true ]; then
  echo "check_figure_ages.sh: $root is a shallow clone, without the commits the stamps name: not applicable"
  exit 77
fi
errors=0 stale=0 current=0
cd "$root" || exit 2
for readme in chapters/[0-9][0-9]_*/README.md; do
  chapter=$(dirname "$readme")
  # The figures the README shows: ![...](figures/NAME.png).
  for figure in $(grep -o '](figures/[^)]*\.png)' "$readme" | sed 's/^](//; s/)$//' | sort -u); do
    shown="$chapter/$figure"
    stamp="${shown%.png}.stamp.txt"
    if [ ! -f "$stamp" ]; then
      echo "NO STAMP: $shown (each figure a README shows has NAME.stamp.txt beside it)"
      errors=$((errors + 1)); continue
    fi
    commit=$(sed -n 's/^commit: *\([0-9a-f]*\).*/\1/p' "$stamp" | head -n 1)
    if [ -z "$commit" ] || ! git cat-file -e "$commit^{commit}" 2>/dev/null; then
      echo "UNKNOWN COMMIT: $shown (its stamp names '${commit:-nothing}', which this history does not hold)"
      errors=$((errors + 1)); continue
    fi
    # The chapter's code: its folder less the lesson's text and the figures themselves.
    newer=$(git log --format='%h %s' --reverse "$commit..HEAD" -- "$chapter/*.cpp" "$chapter/*.cu" "$chapter/*.h" \
              "$chapter/*.cuh" "$chapter/*.py" "$chapter/CMakeLists.txt" | head -n 1)
    if [ -n "$newer" ]; then
      echo "older than its code: $shown (measured at $commit; $chapter changed since: ${newer:0:100})"
      stale=$((stale + 1))
    else
      echo "current: $shown (measured at $commit)"
      current=$((current + 1))
    fi
  done
done
echo "figures: $current current, $stale older than their code, $errors without a stamp or with an unknown commit"
[ "$errors" = 0 ] || exit 1
[ "$strict" = 1 ] && [ "$stale" -gt 0 ] && exit 1
exit 0
