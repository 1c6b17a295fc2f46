#!/usr/bin/env bash
# Every chapter's README figures and tables, from one command: runs each chapter's
# make_figures.sh with "all", in chapter order, into the chapters' figures/ folders (each run's
# logs and CSVs beside its plots, with a stamp of the machine and the commit).
#
#   tools/make_all_figures.sh [--build DIR] [--quick] [--out DIR]
# --out DIR: write chapter NN's files under DIR/NN_name/ instead of the chapters' figures/.
# --quick: tiny runs, to see that every script works (a minute or two).
# From committed code only: each script refuses a tree with uncommitted changes before its first
# run (tools/figures_common.sh; MGPU_FIGURES_ALLOW_DIRTY=1 overrides, and the stamps say so).
# Takes (cpu backend, 2 cores): about 35 minutes for chapters 01-05, 27 more for 06-08, 45 for 09
# and seconds for 10 (each script's header gives its own). Run nothing else on the machine meanwhile: the
# figures include times. Needs mpirun (chapter 05) and python3-torch (chapters 01, 09), and gnuplot
# for the plots: without it each script names the plots it did not draw and writes the logs,
# CSVs and tables as always.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=$root/build
quick=()
out=""
usage="usage: $0 [--build DIR] [--quick] [--out DIR]"
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=${2:?$usage}; shift 2 ;;
    --out) out=${2:?$usage}; shift 2 ;;
    --quick) quick=(--quick); shift ;;
    -h|--help) echo "$usage"; exit 0 ;;
    *) echo "$usage" >&2; exit 2 ;;
  esac
done

start=$SECONDS
if ! command -v gnuplot >/dev/null 2>&1; then
  echo "gnuplot not found (apt-get install gnuplot-nox): no plot will be drawn, only the logs, CSVs and tables"
fi
for script in "$root"/chapters/*/make_figures.sh; do
  chapter=$(basename "$(dirname "$script")")
  where=()
  [ -n "$out" ] && where=(--out "$out/$chapter")
  echo "=== $chapter"
  "$script" --build "$build" ${quick[@]+"${quick[@]}"} ${where[@]+"${where[@]}"} all
done
echo "=== every chapter's figures made in $(( (SECONDS - start) / 60 )) min $(( (SECONDS - start) % 60 )) s"
