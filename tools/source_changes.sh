#!/usr/bin/env bash
# What the working tree has that its commit has not: one line per path, as `git status
# --porcelain` writes it (" M" modified, "A " added, " D" deleted, "??" untracked and not
# ignored, ...). Nothing at all in a tree that is exactly its commit.
#
#   tools/source_changes.sh
#
# The chapters' figures/ folders are left out: the figure scripts rewrite them as they run, so a
# figure written a minute ago must not make the next one's stamp say that the code has changed.
# Everything else counts, untracked files too (a new source file changes what gets built).
# Used by tools/figures_common.sh (figures are made from committed code only) and by
# tools/machine_stamp.sh (the stamp's commit line). Exit status 1 outside a git checkout.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
git -C "$root" rev-parse --verify --quiet HEAD >/dev/null || exit 1
git -C "$root" status --porcelain --untracked-files=all -- . ':(exclude,glob)chapters/*/figures/**'
