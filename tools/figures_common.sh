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
# Bad arguments print the usage and exit 2.
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
  mkdir -p "$out"
  runs=$(mktemp -d)
  trap 'rm -rf "$runs"' EXIT
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

# stamp PNG: what PNG was measured on, beside it as NAME.stamp.txt (tools/check_readme_links.sh
# asks for one beside every plot a README shows).
stamp() { "$root/tools/machine_stamp.sh" >"${1%.png}.stamp.txt"; }
