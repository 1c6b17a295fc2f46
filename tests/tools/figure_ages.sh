#!/usr/bin/env bash
# tools/check_figure_ages.sh on a small repository made here: a figure measured at one commit
# is "current" until its chapter's code changes, then "older than its code" (a failure only
# with --strict); a figure whose stamp names a commit this history lacks, or that has no stamp,
# fails it always. Skipped (77) without git.
set -uo pipefail
command -v git >/dev/null || { echo "SKIPPED: needs git"; exit 77; }
check=$(cd "$(dirname "$0")/../.." && pwd)/tools/check_figure_ages.sh
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
repo=$work/repo
mkdir -p "$repo/chapters/01_first/figures"
cd "$repo" || exit 1
git init -q && git config user.email t@t && git config user.name t
echo 'int main() {}' > chapters/01_first/main.cpp
printf '# first\n\n![a run](figures/run.png)\n' > chapters/01_first/README.md
echo png > chapters/01_first/figures/run.png
git add -A && git commit -qm code
measured=$(git rev-parse --short HEAD)
printf 'commit:   %s\n' "$measured" > chapters/01_first/figures/run.stamp.txt
git add -A && git commit -qm figure

out=$("$check" --strict "$repo") || fail "a current figure failed --strict: $out"
grep -q "^current: chapters/01_first/figures/run.png (measured at $measured)" <<<"$out" || fail "not current: $out"

echo '// the README changes, the figure stays current' >> chapters/01_first/README.md
git commit -qam readme
"$check" --strict "$repo" >/dev/null || fail "a README edit aged the figure"

echo 'int f() { return 1; }' >> chapters/01_first/main.cpp
git commit -qam "the model changes"
out=$("$check" "$repo") || fail "an aged figure failed without --strict: $out"
grep -q "^older than its code: chapters/01_first/figures/run.png (measured at $measured; chapters/01_first changed since: [0-9a-f]* the model changes)" <<<"$out" ||
  fail "the aged figure was not named with the commit that aged it: $out"
if "$check" --strict "$repo" >/dev/null; then fail "--strict passed an aged figure"; fi

printf 'commit:   0123456\n' > chapters/01_first/figures/run.stamp.txt
out=$("$check" "$repo") && fail "a stamp naming an unknown commit passed: $out"
grep -q "^UNKNOWN COMMIT: chapters/01_first/figures/run.png" <<<"$out" || fail "unknown commit not named: $out"

rm chapters/01_first/figures/run.stamp.txt
out=$("$check" "$repo") && fail "a figure without a stamp passed: $out"
grep -q "^NO STAMP: chapters/01_first/figures/run.png" <<<"$out" || fail "missing stamp not named: $out"
echo "check_figure_ages: current, aged (--strict fails), unknown commit and missing stamp each seen"
