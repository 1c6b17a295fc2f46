# shellcheck shell=bash disable=SC2034  # sourced: the variables it sets are the scripts'
# What every chapter's make_figures.sh shares, sourced by it (not run):
#
#   source "$(dirname "$0")/../../tools/figures_common.sh"
#   figures_parse "curves|scaling|lr" "$@"     # the targets the script knows, then its arguments
#
# figures_parse reads the command line every results script takes,
#   make_figures.sh [--build DIR] [--out DIR] [--quick] TARGET|all
# (with no targets of its own, TARGET may be left out and means all) and sets:
#   root   the repository;  build  the build folder (default build/);  quick  1 or 0
#   out    where the figures go (default: the chapter's figures/, created)
#   what   the target asked for;  runs  a scratch folder, removed when the script ends
# Bad arguments print the usage and exit 2. Then it calls require_committed_tree (below).
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

figures_parse() {
  local targets=$1
  shift
  build=$root/build
  out=$(cd "$(dirname "$0")" && pwd)/figures
  quick=0
  what=""
  local choices="all"
  [ -n "$targets" ] && choices="$targets|all"
  usage="usage: $0 [--build DIR] [--out DIR] [--quick] $choices"
  while [ $# -gt 0 ]; do
    case "$1" in
      --build) build=${2:?$usage}; shift 2 ;;
      --out) out=${2:?$usage}; shift 2 ;;
      --quick) quick=1; shift ;;
      -h|--help) echo "$usage"; exit 0 ;;
      *)
        if [[ "|$choices|" == *"|$1|"* ]]; then what=$1; shift; else echo "$usage" >&2; exit 2; fi ;;
    esac
  done
  [ -z "$what" ] && [ -z "$targets" ] && what=all
  [ -n "$what" ] || { echo "$usage" >&2; exit 2; }
  require_committed_tree
  mkdir -p "$out"
  runs=$(mktemp -d)  # removed by figures_finish
}

# figures_finish (an EXIT trap, set by require_committed_tree): removes the scratch folder, and
# makes the paths in the logs, JSONs and tables this script wrote under $out relative to the
# repository ("wrote chapters/08_parameter_server/figures/x.csv"): where this checkout happened to
# be on the machine that made the figures is no part of them.
figures_finish() {
  [ -n "${runs:-}" ] && rm -rf "$runs"
  if [ -n "${figures_started:-}" ] && [ -d "${out:-}" ]; then
    local prefix
    prefix=$(printf '%s/' "$root" | sed 's/[][\.*^$|]/\\&/g')  # the path, as a sed pattern
    find "$out" -type f -newer "$figures_started" \( -name '*.log' -o -name '*.json' -o -name '*.md' -o -name '*.gp' \) \
      -exec sed -i "s|$prefix||g" {} +
  fi
  [ -n "${figures_started:-}" ] && rm -f "$figures_started"
  return 0
}

# require_committed_tree: figures are made from committed code, so that the commit in their
# stamps is the code that made them. A tree with changes (tools/source_changes.sh: anything but
# the chapters' figures/ folders, which the scripts rewrite), or a copy that is no git checkout,
# is refused, status 1, before a single run, unless MGPU_FIGURES_ALLOW_DIRTY=1 is set: then
# every stamp says on its first line that it was not made from a commit (tools/machine_stamp.sh).
# Scripts that read their own options call it themselves, right after reading them ($build set).
# It also notes the commit the runs start from: the stamps name it, even where HEAD moves while
# they run (tools/machine_stamp.sh reads MGPU_FIGURES_COMMIT).
require_committed_tree() {
  local changes
  changes=$("$root/tools/source_changes.sh" 2>/dev/null) || changes="$root is not a git checkout: no commit to name"
  MGPU_FIGURES_COMMIT=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || true)
  export MGPU_FIGURES_COMMIT
  figures_started=$(mktemp)  # what this script writes from now on is newer than this file
  trap figures_finish EXIT
  if [ -z "$changes" ]; then
    require_build_of_this_commit
    return 0
  fi
  if [ "${MGPU_FIGURES_ALLOW_DIRTY:-0}" = 1 ]; then
    echo "warning: MGPU_FIGURES_ALLOW_DIRTY=1: making figures from uncommitted changes; every stamp will say so" >&2
    return 0
  fi
  {
    echo "error: refusing to make figures from a tree with uncommitted changes:"
    printf '%s\n' "$changes" | head -n 20 | sed 's/^/  /'
    echo "Commit them first, so that each figure's stamp names the commit that made it."
    echo "(MGPU_FIGURES_ALLOW_DIRTY=1 makes them anyway, and every stamp then says so.)"
  } >&2
  exit 1
}

# require_build_of_this_commit: the programs in $build must be built from the commit the stamps
# will name, not from an earlier one (a commit made since, and no build after it). The build's
# commit is the one cmake/Commit.cmake wrote into the build at its last build (or configure:
# build after configuring, which this cannot tell apart). Its "-dirty" is not held against it:
# a chapter's figures rewritten by an earlier script make the tree "dirty" to git, and the
# source itself was found clean just before.
require_build_of_this_commit() {
  local header="$build/common/generated/mgpu_build_commit.h" built head
  head=$(git -C "$root" describe --always 2>/dev/null) || return 0
  built=$(sed -n 's/^#define MGPU_BUILD_COMMIT "\(.*\)"$/\1/p' "$header" 2>/dev/null || true)
  [ "${built%-dirty}" = "$head" ] && [ -n "$built" ] && return 0
  if [ "${MGPU_FIGURES_ALLOW_DIRTY:-0}" = 1 ]; then  # the override the ctest figure runs set
    echo "warning: MGPU_FIGURES_ALLOW_DIRTY=1: the programs in $build were built from ${built:-an unknown commit}, the tree is at $head" >&2
    return 0
  fi
  {
    echo "error: the programs in $build were built from ${built:-an unknown commit} (its $header), the tree is at $head."
    echo "Build again (cmake --build $build -j), so that the figures come from the commit their stamps name."
  } >&2
  exit 1
}

# require_programs NAME...: each must be built in $build/bin, else say how and exit 1.
require_programs() {
  local program
  for program in "$@"; do
    [ -x "$build/bin/$program" ] ||
      { echo "error: $build/bin/$program not found: build first (cmake -S . -B build && cmake --build build -j)" >&2; exit 1; }
  done
}

# backend_of LOG: the backend a program ran on, from the first line that says it: "backend X"
# (every program starts with one) or a result line's backend=X.
backend_of() {
  awk '$1 == "backend" { sub(",", "", $2); print $2; exit }
       /^result:/ { for (i = 1; i <= NF; ++i) if ($i ~ /^backend=/) { sub("backend=", "", $i); print $i; exit } }' "$1"
}

# Plots need gnuplot. Without it the programs say "gnuplot not found ...: no plot" and go on
# with their CSVs; the scripts do the same: each plot that is not drawn is named, the logs and
# CSVs are written as always, and the script ends with status 0.
have_gnuplot() { command -v gnuplot >/dev/null 2>&1; }

# not_drawn PNG: says that PNG was not drawn, and why.
not_drawn() { echo "not drawn: $1 (gnuplot not found: apt-get install gnuplot-nox; the CSVs have the numbers)"; }

# can_draw PNG: whether PNG can be drawn here; where it cannot, says so (status 1). For the plots a
# script draws itself:  can_draw "$png" || return 0
can_draw() {
  have_gnuplot && return 0
  not_drawn "$1"
  return 1
}

# stamp PNG: what PNG was measured on, beside it as NAME.stamp.txt (tools/check_readme_links.sh
# asks for one beside every plot a README shows). A plot not drawn for want of gnuplot gets no
# stamp (can_draw or copy_plot said so already); a plot missing where gnuplot is installed is an
# error, not something to stamp over.
stamp() {
  if [ ! -f "$1" ]; then
    have_gnuplot || return 0
    echo "error: $1 was not drawn, though gnuplot is installed (see the output above)" >&2
    exit 1
  fi
  if [ "${redrawing:-0}" = 1 ]; then redraw_stamp "$1"; return 0; fi
  "$root/tools/machine_stamp.sh" "$build" >"${1%.png}.stamp.txt"
}

# redraw_stamp PNG: PNG was drawn again, with no run, from the CSVs an earlier run of the script
# left beside it (a script's redraw target; stamp does this where $redrawing is 1). Its stamp keeps
# what the numbers were measured on, that run's commit included, and gains a line that names the
# commit that drew the picture. A picture without a stamp has nothing to keep: that is an error.
redraw_stamp() {
  local file=${1%.png}.stamp.txt measured
  measured=$(grep -v '^drawn:' "$file" 2>/dev/null) ||
    { echo "error: $file is missing: what $1's numbers were measured on is not known; make them again" >&2; exit 1; }
  printf '%s\ndrawn:    %s%s, %s (the plot only, from the CSVs beside it: the numbers are those measured above)\n' \
    "$measured" "${MGPU_FIGURES_COMMIT:-unknown commit}" \
    "$([ -n "$("$root/tools/source_changes.sh" 2>/dev/null)" ] && echo ' + UNCOMMITTED CHANGES')" \
    "$(date -u '+%Y-%m-%d %H:%M UTC')" >"$file"
}

# copy_plot FROM TO: the plot a program drew (FROM) copied to TO, with its stamp; where gnuplot
# is missing the program drew none, and this says which plot is not there instead.
copy_plot() {
  if [ -f "$1" ]; then
    cp "$1" "$2"
  elif have_gnuplot; then
    echo "error: $1 was not drawn, though gnuplot is installed (see the output above)" >&2
    exit 1
  else
    not_drawn "$2"
    return 0
  fi
  stamp "$2"
  echo "wrote $2 (and its stamp)"
}
