#!/usr/bin/env bash
# Every file a README points to exists: the targets of its Markdown links and images, and every
# `figures/...` path it quotes (the plots, CSVs and logs that back its numbers). A path is read
# relative to the README's folder, or else to the repository root. And every plot in a figures/
# folder that a README shows has its machine stamp beside it (NAME.stamp.txt for NAME.png,
# written by the chapter's make_figures.sh with tools/machine_stamp.sh): what it was measured on.
#
#   tools/check_readme_links.sh        # ctest runs it as readme_links
#
# Prints each missing file with the README that names it; exit status 1 if there is one.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

# Prints "README: target" for each target that names nothing (a glob must match something).
check() {
  local readme=$1 folder target
  folder=$(dirname "$readme")
  {
    # [text](target) and ![alt](target), without an #anchor; web addresses are not files here
    grep -oE '\]\([^)]+\)' "$readme" | sed -E 's/^\]\(//; s/\)$//; s/#.*//' | grep -vE '^(https?:|mailto:|$)' || true
    # `.../figures/name.ext` quoted in code spans
    grep -oE '`[^` ]*figures/[^` ]+`' "$readme" | tr -d '`' || true
  } | sort -u | while IFS= read -r target; do
    # shellcheck disable=SC2086 # unquoted on purpose: a glob in the README is expanded
    if ! compgen -G "$folder/$target" >/dev/null && ! compgen -G "$root/$target" >/dev/null; then
      echo "$readme: $target does not exist"
    elif [[ $target == *figures/*.png ]] && [ ! -f "$folder/${target%.png}.stamp.txt" ] &&
         [ ! -f "$root/${target%.png}.stamp.txt" ]; then
      echo "$readme: $target has no machine stamp beside it (${target%.png}.stamp.txt)"
    fi
  done
}

problems=$(find . -name '*.md' -not -path './build*' -not -path './.git/*' -not -path './results/*' -print0 |
  while IFS= read -r -d '' readme; do check "$readme"; done)
if [ -n "$problems" ]; then
  echo "$problems"
  exit 1
fi
echo "every file the READMEs point to exists"
