#!/usr/bin/env bash
# The figure scripts make figures from committed code only, so that a stamp's commit is the code
# that made the figure:
#   - a tree with a modified or an untracked file is refused, status 1, before anything is run
#     or written, by a script that uses figures_parse (chapter 07's) and by one that reads its
#     own options (chapter 06's); the refusal names the changed file and the override;
#   - a change inside a chapter's figures/ folder does not count (the scripts rewrite it);
#   - MGPU_FIGURES_ALLOW_DIRTY=1 lets the script go on, and tools/machine_stamp.sh then opens
#     the stamp with a WARNING line and marks the commit "+ UNCOMMITTED CHANGES"; a clean tree's
#     stamp has neither;
#   - --help still answers in a tree with changes;
#   - on a clean tree, a build made from another commit is refused, and a stamp names the commit
#     the runs began at (MGPU_FIGURES_COMMIT) with a "moved:" line where HEAD has moved since.
# The scripts run in a small git repository made here (the repository's own tools and two of
# its scripts, committed), with a build folder that holds only the commit it was built from
# (common/generated/mgpu_build_commit.h) and no programs: a script that gets past the checks
# stops at "not found: build first", status 1 too, and says so.
#
#   figures_refuse_dirty_tree.sh        (a second or two; 77, skipped, where git is missing)
set -euo pipefail
command -v git >/dev/null || { echo "git not found: skipped"; exit 77; }
unset GIT_DIR GIT_WORK_TREE GIT_INDEX_FILE
source_root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/mgpu-figures-dirty.XXXXXX")
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

repo="$work/repo"
mkdir -p "$repo/tools" "$repo/chapters/06_mixed_precision" "$repo/chapters/07_model_parallel/figures"
cp "$source_root"/tools/{figures_common.sh,machine_stamp.sh,source_changes.sh} "$repo/tools/"
cp "$source_root/chapters/06_mixed_precision/make_figures.sh" "$repo/chapters/06_mixed_precision/"
cp "$source_root/chapters/07_model_parallel/make_figures.sh" "$repo/chapters/07_model_parallel/"
echo "a figure's log" >"$repo/chapters/07_model_parallel/figures/old.log"
git -C "$repo" init -q
git -C "$repo" add -A
git -C "$repo" -c user.name=test -c user.email=test@example.invalid commit -q -m "the scripts"

ch06="$repo/chapters/06_mixed_precision/make_figures.sh"
ch07="$repo/chapters/07_model_parallel/make_figures.sh"
nobuild="$work/no-build"
out="$work/out"
# built_from COMMIT: the build folder says it was built from COMMIT, as cmake/Commit.cmake writes it.
built_from() {
  mkdir -p "$nobuild/common/generated"
  printf '#define MGPU_BUILD_COMMIT "%s"\n' "$1" >"$nobuild/common/generated/mgpu_build_commit.h"
}
built_from "$(git -C "$repo" describe --always)"

# run NAME SCRIPT ARGS...: runs SCRIPT with ARGS (env from the caller), its status in $status and
# its stdout and stderr together in $work/NAME.txt.
run() {
  local name=$1; shift
  set +e
  "$@" >"$work/$name.txt" 2>&1
  status=$?
  set -e
}
# refused NAME: the run was refused for the tree's changes, and nothing was written.
refused() {
  [ "$status" = 1 ] || fail "$1: status $status, expected 1 (refused)"
  grep -q "refusing to make figures from a tree with uncommitted changes" "$work/$1.txt" ||
    fail "$1: no refusal in its output: $(cat "$work/$1.txt")"
  grep -q "MGPU_FIGURES_ALLOW_DIRTY=1" "$work/$1.txt" || fail "$1: the refusal does not name the override"
  [ ! -e "$out" ] || fail "$1: $out was created by a refused run"
}
# went_on NAME: the run got past the check, to the missing build.
went_on() {
  [ "$status" = 1 ] || fail "$1: status $status, expected 1 (no build)"
  grep -q "not found: build first" "$work/$1.txt" || fail "$1: did not get past the check: $(cat "$work/$1.txt")"
  ! grep -q "refusing" "$work/$1.txt" || fail "$1: refused, though it should not be"
}

run clean_07 "$ch07" --build "$nobuild" --out "$out" --quick training
went_on clean_07
rm -rf "$out"
[ -z "$("$repo/tools/machine_stamp.sh")" ] && fail "machine_stamp.sh printed nothing"
"$repo/tools/machine_stamp.sh" >"$work/clean.stamp.txt"
! grep -q "WARNING\|UNCOMMITTED" "$work/clean.stamp.txt" || fail "a clean tree's stamp warns: $(cat "$work/clean.stamp.txt")"
grep -q "^commit: *[0-9a-f]*$" "$work/clean.stamp.txt" || fail "a clean tree's stamp has no plain commit line"

echo "# changed" >>"$repo/tools/figures_common.sh"
run modified_07 "$ch07" --build "$nobuild" --out "$out" --quick training
refused modified_07
grep -q "tools/figures_common.sh" "$work/modified_07.txt" || fail "modified_07: the changed file is not named"
run modified_06 "$ch06" --build "$nobuild" --out "$out" --quick all
refused modified_06
run help_07 "$ch07" --help
[ "$status" = 0 ] || fail "--help in a tree with changes: status $status"

MGPU_FIGURES_ALLOW_DIRTY=1 run allowed_07 "$ch07" --build "$nobuild" --out "$out" --quick training
went_on allowed_07
grep -q "MGPU_FIGURES_ALLOW_DIRTY=1" "$work/allowed_07.txt" || fail "allowed_07: no warning that the tree has changes"
rm -rf "$out"
"$repo/tools/machine_stamp.sh" >"$work/dirty.stamp.txt"
head -n 1 "$work/dirty.stamp.txt" | grep -q "^WARNING: *NOT MADE FROM A COMMIT" ||
  fail "a stamp of a tree with changes does not open with the warning: $(cat "$work/dirty.stamp.txt")"
grep -q "^commit: .* + UNCOMMITTED CHANGES$" "$work/dirty.stamp.txt" || fail "the stamp's commit is not marked"
git -C "$repo" checkout -q -- tools/figures_common.sh

echo "new" >"$repo/tools/new_file.sh"
run untracked_07 "$ch07" --build "$nobuild" --out "$out" --quick training
refused untracked_07
rm "$repo/tools/new_file.sh"

echo "rewritten by a figure run" >>"$repo/chapters/07_model_parallel/figures/old.log"
echo "new figure" >"$repo/chapters/07_model_parallel/figures/new.csv"
run figures_only_07 "$ch07" --build "$nobuild" --out "$out" --quick training
went_on figures_only_07
rm -rf "$out"

# A build from an earlier commit, on a clean tree: refused, naming both commits.
first=$(git -C "$repo" describe --always)
git -C "$repo" checkout -q -- chapters && git -C "$repo" clean -qfd chapters
git -C "$repo" -c user.name=test -c user.email=test@example.invalid commit -q --allow-empty -m "a later commit"
run stale_build_07 "$ch07" --build "$nobuild" --out "$out" --quick training
[ "$status" = 1 ] || fail "stale_build_07: status $status, expected 1 (a build of another commit)"
grep -q "built from $first.*the tree is at $(git -C "$repo" describe --always)" "$work/stale_build_07.txt" ||
  fail "stale_build_07: the refusal does not name both commits: $(cat "$work/stale_build_07.txt")"
[ ! -e "$out" ] || fail "stale_build_07: $out was created by a refused run"
built_from "$(git -C "$repo" describe --always)-dirty"  # built while figures/ had changes: accepted
run rebuilt_07 "$ch07" --build "$nobuild" --out "$out" --quick training
went_on rebuilt_07
rm -rf "$out"

# The stamp names the commit the runs began at, and says where HEAD has moved since.
MGPU_FIGURES_COMMIT=$first "$repo/tools/machine_stamp.sh" >"$work/moved.stamp.txt"
grep -q "^commit: *$first$" "$work/moved.stamp.txt" || fail "the stamp does not name the runs' commit: $(cat "$work/moved.stamp.txt")"
grep -q "^moved: .*$(git -C "$repo" rev-parse --short HEAD)" "$work/moved.stamp.txt" || fail "the stamp does not say HEAD moved"
! grep -q "^moved:" "$work/clean.stamp.txt" || fail "a stamp whose runs' commit is HEAD says it moved"

[ "$failures" = 0 ] && echo "figures_refuse_dirty_tree: all checks passed"
exit $((failures > 0))
