#!/usr/bin/env bash
# Runs' pictures drawn again from their CSVs, with no run, as the programs draw them now
# (build/bin/plot_runs, common/report.cpp's plot_runs): for pictures drawn before the drawing
# changed. Two forms:
#
#   tools/redraw_run_plots.sh [--build DIR] FOLDER...
#       each run's own picture in FOLDER (NAME.png beside NAME.csv, a run's CSV, and NAME.gp, the
#       script that drew it), its title kept from NAME.gp; NAME.gp is replaced by the new script,
#       whose first lines name the commit that drew it (the run's own is in NAME.json)
#   tools/redraw_run_plots.sh [--build DIR] --picture PNG --title TITLE CSV=LABEL...
#       PNG, a chapter's figure of one or more runs (as plot_runs draws them), from those CSVs;
#       its stamp keeps what the numbers were measured on and names the commit that drew it
#       (tools/figures_common.sh's redraw_stamp)
#
# Like the chapters' make_figures.sh, it refuses a tree with uncommitted changes
# (MGPU_FIGURES_ALLOW_DIRTY=1 overrides) and a build of another commit.
set -euo pipefail
source "$(dirname "$0")/figures_common.sh"
build=$root/build
usage="usage: $0 [--build DIR] FOLDER... | [--build DIR] --picture PNG --title TITLE CSV=LABEL..."
if [ "${1:-}" = --build ]; then build=${2:?$usage}; shift 2; fi
[ $# -gt 0 ] || { echo "$usage" >&2; exit 2; }
require_committed_tree
require_programs plot_runs
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"; figures_finish' EXIT

if [ "$1" = --picture ]; then
  if [ $# -lt 5 ] || [ "$3" != --title ]; then echo "$usage" >&2; exit 2; fi
  png=$2 title=$4
  shift 4
  name=$(basename "${png%.png}")
  "$build/bin/plot_runs" --out "$scratch/$name.png" --title "$title" "$@" >/dev/null
  cp "$scratch/$name.png" "$png"
  redraw_stamp "$png"
  echo "redrew $png (and its stamp)"
  exit 0
fi

header="epoch,train_loss,train_acc,test_acc,seconds,in_sec_per_epoch"
for folder in "$@"; do
  for png in "$folder"/*.png; do
    [ -f "$png" ] || continue
    name=$(basename "${png%.png}")
    csv=${png%.png}.csv gp=${png%.png}.gp
    if [ ! -f "$csv" ] || [ ! -f "$gp" ] || [ "$(head -n 1 "$csv" | tr -d '\r')" != "$header" ]; then continue; fi
    title=$(sed -n "s/^set multiplot layout 1,2 title '\(.*\)'\$/\1/p" "$gp" | head -n 1)
    [ -n "$title" ] || { echo "error: $gp names no title (set multiplot layout 1,2 title '...'): not a run's picture" >&2; exit 1; }
    "$build/bin/plot_runs" --out "$scratch/$name.png" --title "$title" "$csv=$name" >/dev/null
    cp "$scratch/$name.png" "$png"
    # The new script reads the CSV beside it under its own name, not plot_runs' copy.
    {
      echo "# drawn again at commit $MGPU_FIGURES_COMMIT by tools/redraw_run_plots.sh, from the CSV (the run's commit: $name.json)"
      sed "s/'${name}_1\.csv'/'${name}.csv'/g" "$scratch/$name.gp"
    } >"$gp"
    echo "redrew $png"
  done
done
