#!/usr/bin/env bash
# Chapter 08's results, from one command, with the logs and CSVs behind every figure and a stamp
# of the machine (tools/machine_stamp.sh), in this chapter's figures/:
#
#   modes      BSP, ASP and SSP(2) with k = 2 and k = 4 workers: accuracy per epoch and against
#              wall time, staleness histograms, throughput
#   straggler  the same three modes, k = 4, worker 0 taking 3 times as long
#   lr         BSP and ASP on 4 workers, and ASP's fresh twin (1 worker, the same updates without
#              staleness), at four learning rates: when stale gradients stop converging
#   all        all three
#   redraw     no run: every figure above drawn again from the CSVs earlier runs left in figures/,
#              and each run's own pictures (tools/redraw_run_plots.sh); the stamps keep what the
#              numbers were measured on and name the commit that drew them
#
# Usage (after building):
#   chapters/08_parameter_server/make_figures.sh [--build DIR] [--out DIR] [--quick] modes|straggler|lr|all
# Default build folder build/, default output this chapter's figures/ (where the README's figures
# come from). --quick: tiny runs, to see that everything works (give it another --out).
# The recipe is smaller than d2l's, to fit a 2-core machine: the first 20,000 training images,
# batch 64 (the 0.01 initial scale leaves LeNet at chance for ~120,000 images at batch 256; at 64 it
# gets going within the first 20,000), 4 epochs, lr 0.2. Takes about 7 minutes (cpu backend, 2 cores).
set -euo pipefail
source "$(dirname "$0")/../../tools/figures_common.sh"  # (its helpers only: this script reads its own options)
build=$root/build
out=$root/chapters/08_parameter_server/figures
recipe=(--limit-train 20000 --batch-size 64 --epochs 4)
what=""
usage="usage: $0 [--build DIR] [--out DIR] [--quick] modes|straggler|lr|all|redraw"
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=${2:?$usage}; shift 2 ;;
    --out) out=${2:?$usage}; shift 2 ;;
    --quick) recipe=(--limit-train 1280 --batch-size 64 --epochs 2); shift ;;
    -h|--help) echo "$usage"; exit 0 ;;
    modes|straggler|lr|all|redraw) what=$1; shift ;;
    *) echo "$usage" >&2; exit 2 ;;
  esac
done
[ -n "$what" ] || { echo "$usage" >&2; exit 2; }
require_committed_tree  # figures from committed code only (tools/figures_common.sh)
program=$build/bin/08_parameter_server
[ "$what" = redraw ] || [ -x "$program" ] || { echo "error: $program not found: build first (cmake -S . -B build && cmake --build build -j)" >&2; exit 1; }
mkdir -p "$out"

# run NAME RUN [--in DIR] ARGS...: one run, its log in figures/NAME.log, its files named RUN
# (--run-name: the names the plots below read) in figures/, or figures/DIR. That folder is this
# script's: the files an earlier run of it left under RUN go first (the program itself never
# replaces files it cannot prove to be of the same settings). A run that diverges (the program
# stops with "training diverged") is kept as such: that is a result too.
run() {
  local name=$1 run=$2 dir=$out
  shift 2
  if [ "${1:-}" = --in ]; then dir=$out/$2; shift 2; fi
  mkdir -p "$dir"
  rm -f -- "$dir/$run".{csv,json,png,gp} "$dir/${run}"_{pushes,workers,staleness}.*
  echo "== 08_parameter_server ${recipe[*]} $*"
  if ! "$program" --progress off --out "$dir" --run-name "$run" "${recipe[@]}" "$@" >"$out/$name.log" 2>&1; then
    grep -q "training diverged" "$out/$name.log" || { cat "$out/$name.log"; exit 1; }
    echo "   diverged (see $name.log)"
  fi
  grep -E '^(result|parameter_server):' "$out/$name.log" || true
}

# plot NAME: the gnuplot script on stdin draws figures/NAME.png (the CSVs are read from there),
# stamped with what it was measured on (tools/check_readme_links.sh checks).
plot() {
  can_draw "$out/$1.png" || return 0
  (cd "$out" && gnuplot)
  stamp "$out/$1.png"
}

# Cumulative wall time of a run's CSV, as a gnuplot column: seconds summed over epochs so far.
wall='(w = (column(1) == 1 ? 0 : w) + column(5), w)'

modes() {
  for k in 2 4; do
    run bsp_k$k 08_parameter_server_bsp_k$k --devices $k --mode bsp
    run asp_k$k 08_parameter_server_asp_k$k --devices $k --mode asp
    run ssp2_k$k 08_parameter_server_ssp2_k$k --devices $k --mode ssp --staleness 2
  done
  draw_modes
}

draw_modes() {
  plot modes <<PLOT
set terminal pngcairo size 1100,800 font 'sans,10' noenhanced
set output 'modes.png'
set datafile separator ','
set key bottom right
set grid
set multiplot layout 2,2 title 'BSP, ASP and SSP(2): test accuracy ($(echo "${recipe[*]}"), cpu backend)'
w = 0
do for [k in "2 4"] {
  set title sprintf('k = %s workers, per epoch', k)
  set xlabel 'epoch'; set ylabel 'test accuracy'
  set xtics 1
  plot for [m in "bsp asp ssp2"] sprintf('08_parameter_server_%s_k%s.csv', m, k) using 1:4 with linespoints title m
  set title sprintf('k = %s workers, against wall time', k)
  set xlabel 'seconds of training'
  set xtics autofreq
  plot for [m in "bsp asp ssp2"] sprintf('08_parameter_server_%s_k%s.csv', m, k) using $wall:4 with linespoints title m
}
unset multiplot
PLOT
}

draw_staleness() {
  plot staleness <<'PLOT'
set terminal pngcairo size 1100,400 font 'sans,10' noenhanced
set output 'staleness.png'
set datafile separator ','
set style fill solid 0.5
set boxwidth 0.4
set grid
set xlabel 'staleness (updates between a pull and its push)'
set ylabel 'pushes (all epochs)'
set xtics 1
set xrange [-0.5:*]
set yrange [0:*]
set key top right
set multiplot layout 1,2 title 'How stale the gradients were'
do for [k in "2 4"] {
  set title sprintf('k = %s workers', k)
  plot '08_parameter_server_asp_k'.k.'_staleness.csv' using ($2 - 0.2):($1 == 0 ? $3 : 1/0) with boxes \
         title 'asp' fs solid 0.5, \
       '08_parameter_server_ssp2_k'.k.'_staleness.csv' using ($2 + 0.2):($1 == 0 ? $3 : 1/0) with boxes \
         title 'ssp(2)' fs solid 0.5
}
unset multiplot
PLOT
}

straggler() {
  run bsp_k4_straggler 08_parameter_server_bsp_k4_straggler0x3 --devices 4 --mode bsp --straggler 0:3
  run asp_k4_straggler 08_parameter_server_asp_k4_straggler0x3 --devices 4 --mode asp --straggler 0:3
  run ssp2_k4_straggler 08_parameter_server_ssp2_k4_straggler0x3 --devices 4 --mode ssp --staleness 2 --straggler 0:3
  draw_straggler
}

draw_straggler() {
  plot straggler <<PLOT
set terminal pngcairo size 1100,400 font 'sans,10' noenhanced
set output 'straggler.png'
set datafile separator ','
set key bottom right
set grid
set multiplot layout 1,2 title 'k = 4 workers, worker 0 three times slower'
w = 0
set xlabel 'seconds of training'; set ylabel 'test accuracy'
set title 'accuracy against wall time'
plot for [m in "bsp asp ssp2"] sprintf('08_parameter_server_%s_k4_straggler0x3.csv', m) using $wall:4 with linespoints title m
set title 'staleness of the pushes (all epochs)'
set xlabel 'staleness'; set ylabel 'pushes'; set style fill solid 0.5; set logscale y
set key top right; set yrange [1:*]; set xrange [-0.5:*]; set boxwidth 0.4
plot '08_parameter_server_asp_k4_straggler0x3_staleness.csv' using (\$2 - 0.2):(\$1 == 0 ? \$3 : 1/0) with boxes title 'asp', \
     '08_parameter_server_ssp2_k4_straggler0x3_staleness.csv' using (\$2 + 0.2):(\$1 == 0 ? \$3 : 1/0) with boxes title 'ssp2'
unset multiplot
PLOT
}

lr() {
  # At each rate L: BSP on 4 workers (one step of L per batch of 64), ASP on 4 workers (four pushes
  # of L * g_i / 64 per batch, each computed on parameters about 3 pushes old), and ASP's fresh
  # twin: 1 worker, batches of 16 at L / 4, the same updates with no staleness at all.
  for rate in 0.2 0.5 0.8 1.2; do
    local twin; twin=$(awk "BEGIN { print $rate / 4 }")
    run lr${rate}_bsp_k4 08_parameter_server_bsp_k4 --in "lr$rate" --devices 4 --mode bsp --lr $rate
    run lr${rate}_asp_k4 08_parameter_server_asp_k4 --in "lr$rate" --devices 4 --mode asp --lr $rate
    run lr${rate}_fresh_k1 08_parameter_server_bsp_k1 --in "lr$rate" --devices 1 --mode bsp --batch-size 16 --lr "$twin"
  done
  draw_lr
}

draw_lr() {
  plot lr <<'PLOT'
set terminal pngcairo size 1200,400 font 'sans,10' noenhanced
set output 'lr.png'
set datafile separator ','
set key below horizontal maxrows 2
set bmargin 6
set grid
set yrange [0:0.9]
set xtics 1
set xlabel 'epoch'; set ylabel 'test accuracy'
set multiplot layout 1,3 title 'Learning rate L and staleness'
set title 'bsp, 4 workers, batch 64, rate L'
plot for [r in "0.2 0.5 0.8 1.2"] sprintf('lr%s/08_parameter_server_bsp_k4.csv', r) using 1:4 with linespoints title 'L = '.r
set title 'asp, 4 workers: 4 pushes of L g_i / 64 per batch'
plot for [r in "0.2 0.5 0.8 1.2"] sprintf('lr%s/08_parameter_server_asp_k4.csv', r) using 1:4 with linespoints title 'L = '.r
set title 'its fresh twin: 1 worker, batch 16, rate L / 4'
plot for [r in "0.2 0.5 0.8 1.2"] sprintf('lr%s/08_parameter_server_bsp_k1.csv', r) using 1:4 with linespoints title 'L = '.r
unset multiplot
PLOT
}

# Every run writes <run>_pushes.csv, one row per push (about 130 KB at this recipe). Keep those of
# the ASP runs of "modes" and "straggler", which the README and its exercises read; the staleness
# histograms (<run>_staleness.csv) keep what the others would say.
prune_pushes() {
  find "$out" -name '*_pushes.csv' ! -name '*_asp_k[0-9]_pushes.csv' ! -name '*_asp_k[0-9]_straggler*_pushes.csv' -delete
  find "$out" -path '*/lr*/*_pushes.csv' -delete
}

# redraw_runs: each run's own pictures drawn again from its CSVs, with no run: its training
# (tools/redraw_run_plots.sh) and its staleness histogram, as the program draws it (main.cpp),
# with its gnuplot script beside it, as the program leaves it.
redraw_runs() {
  "$root/tools/redraw_run_plots.sh" --build "$build" "$out" "$out"/lr*/
  local csv png name stalest
  for csv in "$out"/*_staleness.csv "$out"/lr*/*_staleness.csv; do
    png=${csv%.csv}.png name=$(basename "${csv%_staleness.csv}")
    stalest=$(awk -F, '$1 == 0 { n++ } END { print (n > 0 ? n : 1) }' "$csv")
    cat >"${csv%.csv}.gp" <<PLOT
# cd to this folder, then: gnuplot $(basename "${csv%.csv}.gp")
# drawn again at commit $MGPU_FIGURES_COMMIT by make_figures.sh redraw, from the CSV (the run's commit: $name.json)
set terminal pngcairo size 1000,400 font 'sans,10' noenhanced
set output '$(basename "$png")'
set datafile separator ','
set title '$name: staleness of the pushes (all epochs)'
set xlabel 'staleness (updates between pull and push)'
set ylabel 'pushes'
set xrange [-0.5:$stalest-0.5]
set xtics 1
set yrange [0:*]
set style fill solid 0.6
set boxwidth 0.8
set key off
plot '$(basename "$csv")' using 2:(\$1 == 0 ? \$3 : 1/0) with boxes
PLOT
    (cd "$(dirname "$csv")" && gnuplot "$(basename "${csv%.csv}.gp")")
    echo "wrote $png"
  done
}

# shellcheck disable=SC2034  # redrawing: read by figures_common.sh's stamp
case "$what" in
  modes) modes; draw_staleness ;;
  straggler) straggler ;;
  lr) lr ;;
  all) modes; draw_staleness; straggler; lr ;;
  redraw) redrawing=1; draw_modes; draw_staleness; draw_straggler; draw_lr; redraw_runs ;;
esac
prune_pushes
echo "figures and logs in $out"
