#!/usr/bin/env bash
# Chapter 05's results, each from one command, with the logs and CSVs behind every figure and a
# stamp of the machine (tools/machine_stamp.sh):
#
#   training  d2l's recipe on 1 process and on 2 (overlap on, then off), beside chapter 02's
#             1-device run: test accuracy and time per epoch, and each run's per-step profile.
#   overlap   the overlap timeline: one traced step with overlap off and one with it on, every
#             rank's device (forward and backward, each layer's gradients complete, waiting for
#             the sum, sgd) and host thread (the collective's calls), from the program's
#             <run>_timeline.csv; and the per-step profile over 200 steps of each.
#
# Usage (from anywhere, after building; mpirun from Open MPI on the PATH):
#   chapters/05_multi_process/make_figures.sh [--build DIR] [--out DIR] [--quick] training|overlap|all
# Default build folder build/, default output this chapter's figures/ (where the README's
# figures come from). --quick: tiny runs, to see that everything works.
# Takes (cpu backend, 2 cores): training under 4 minutes, overlap about 20 s; all about 4 minutes.
#
# 1 process is started directly, not by mpirun: Open MPI binds each process to one core when it
# starts 1 or 2 of them, and a single process should have both cores of a 2-core machine.
set -euo pipefail
source "$(dirname "$0")/../../tools/figures_common.sh"
figures_parse "training|overlap" "$@"
require_programs 05_multi_process
program=$build/bin/05_multi_process
command -v mpirun >/dev/null || { echo "error: mpirun not found: apt-get install openmpi-bin" >&2; exit 1; }

run() {  # run NAME LAUNCHER... -- ARGS...: one run, its output kept in $runs/NAME.log
  local name=$1; shift
  local launch=()
  while [ "$1" != -- ]; do launch+=("$1"); shift; done
  shift
  echo "== ${launch[*]} 05_multi_process $*"
  ${launch[@]+"${launch[@]}"} "$program" --progress off --out "$runs/out" "$@" >"$runs/$name.log" 2>&1 ||
    { cat "$runs/$name.log"; exit 1; }
  grep '^result:' "$runs/$name.log"
}

# run_csv NAME: the CSV of run NAME's training, as its log names it ("wrote .../05_multi_process_devices-2.csv").
# The name says the collective, which the program chooses by itself (NCCL where each rank has a
# GPU of its own, else MPI), so it is read, not assumed.
run_csv() {
  sed -n 's/^wrote \(.*\.csv\)$/\1/p' "$runs/$1.log" | grep -v '_timeline\.csv$' | tail -n 1
}

training() {
  local args=()
  [ "$quick" = 1 ] && args=(--epochs 2 --limit-train 2560 --profile-steps 2)
  run k1 -- ${args[@]+"${args[@]}"}
  run k2 mpirun -np 2 -- ${args[@]+"${args[@]}"}
  run k2_no_overlap mpirun -np 2 -- --overlap off ${args[@]+"${args[@]}"}
  local backend; backend=$(backend_of "$runs/k1.log")
  cat "$runs/k1.log" "$runs/k2.log" "$runs/k2_no_overlap.log" >"$out/05_multi_process_$backend.log"
  local name csvs=()
  for name in k1 k2 k2_no_overlap; do
    local csv; csv=$(run_csv "$name")
    [ -n "$csv" ] || { echo "error: the $name run wrote no CSV (see $out/05_multi_process_$backend.log)" >&2; exit 1; }
    csvs+=("$out/$(basename "$csv" .csv)_$backend.csv")
    cp "$csv" "${csvs[-1]}"
  done
  echo "wrote $out/05_multi_process_$backend.log and the runs' CSVs"
  # Chapter 02's 1-device run from the same seed, as that chapter's figures/ keep it.
  local ch02=$root/chapters/02_data_parallel/figures/02_data_parallel_k1_cpu.csv
  plot_training "$out/05_multi_process_$backend.png" "$ch02" "${csvs[@]}" "$backend"
}

plot_training() {  # PNG CH02_CSV K1_CSV K2_CSV K2_NO_OVERLAP_CSV BACKEND
  can_draw "$1" || return 0
  gnuplot -c /dev/stdin "$@" <<'PLOT'
set terminal pngcairo size 1000,400 font 'sans,10' noenhanced
set output ARG1
set datafile separator ','
set key bottom right
set grid
set xlabel 'epoch'
set xrange [0:*]
set multiplot layout 1,2 title sprintf('05_multi_process (%s build): 1 and 2 processes, beside chapter 02 on 1 device', ARG6)
set ylabel 'test accuracy'
set yrange [0:1]
plot ARG2 using 1:4 with lines lw 4 lc rgb '#cccccc' title 'chapter 02, 1 device', \
     ARG3 using 1:4 with linespoints lc 1 title '1 process', \
     ARG4 using 1:4 with linespoints lc 2 title '2 processes', \
     ARG5 using 1:4 with linespoints lc 3 dt 2 title '2 processes, overlap off'
# Time: the epochs sec_per_epoch averages (column 6 is 1) as lines, epoch 1 (with one-time
# set-up) as open circles.
set ylabel "seconds per epoch\n(open circle: one-time set-up included)"
set yrange [0:*]
plot ARG2 using 1:($6 == 1 ? $5 : 1/0) with lines lw 4 lc rgb '#cccccc' title 'chapter 02, 1 device', \
     ARG3 using 1:($6 == 1 ? $5 : 1/0) with linespoints lc 1 title '1 process', \
     ARG4 using 1:($6 == 1 ? $5 : 1/0) with linespoints lc 2 title '2 processes', \
     ARG5 using 1:($6 == 1 ? $5 : 1/0) with linespoints lc 3 dt 2 title '2 processes, overlap off', \
     ARG3 using 1:($6 == 1 ? 1/0 : $5) with points pt 6 ps 1.5 lc 1 notitle, \
     ARG4 using 1:($6 == 1 ? 1/0 : $5) with points pt 6 ps 1.5 lc 2 notitle, \
     ARG5 using 1:($6 == 1 ? 1/0 : $5) with points pt 6 ps 1.5 lc 3 notitle
unset multiplot
PLOT
  stamp "$1"
  echo "wrote $1"
}

overlap() {
  local args=(--epochs 1 --limit-train 2560 --profile-steps 200)
  [ "$quick" = 1 ] && args=(--epochs 1 --limit-train 1024 --profile-steps 2)
  run overlap mpirun -np 2 -- "${args[@]}"
  local backend; backend=$(backend_of "$runs/overlap.log")
  cp "$runs/overlap.log" "$out/05_overlap_timeline_$backend.log"
  local timeline; timeline=$(sed -n 's/^wrote \(.*_timeline\.csv\) .*/\1/p' "$runs/overlap.log" | tail -n 1)
  [ -n "$timeline" ] || { echo "error: the overlap run wrote no timeline (see $out/05_overlap_timeline_$backend.log)" >&2; exit 1; }
  cp "$timeline" "$out/05_overlap_timeline_$backend.csv"
  sed -n '/^per step/,/overlap saves/p' "$runs/overlap.log"
  plot_timeline "$out/05_overlap_timeline_$backend.csv" "$out/05_overlap_timeline_$backend.png" "$backend"
}

# Each rank's two lanes as rows (device above host), spans as bars, instants as ticks; one
# panel per overlap setting, on one time axis.
plot_timeline() {  # CSV PNG BACKEND
  can_draw "$2" || return 0
  local ranks; ranks=$(awk -F, 'NR > 1 && $1 + 1 > n { n = $1 + 1 } END { print n }' "$1")
  gnuplot -c /dev/stdin "$@" "$ranks" <<'PLOT'
set terminal pngcairo size 1200,520 font 'sans,10' noenhanced
set output ARG2
set datafile separator ','
ranks = int(ARG4)
set multiplot layout 2,1 title sprintf('05_multi_process (%s build), 2 processes: one traced step', ARG3)
set xlabel 'ms from the step''s start'
set yrange [-0.7:2 * ranks - 0.3]
set ytics () 
do for [r = 0:ranks - 1] { set ytics add (sprintf('rank %d host', r) 2 * r, sprintf('rank %d device', r) 2 * r + 1) }
set grid x
set key outside right top font ',9'
set style fill solid 0.8 border -1
row(rank, lane) = 2 * rank + (lane eq 'device' ? 1 : 0)
is(what, prefix) = strstrt(what, prefix) == 1
# The span kinds, each its own colour; zero-length spans ("layer 3 complete"; "MPI sum 1
# started" is a short call) are drawn as ticks.
do for [m in 'off on'] {
  set title sprintf('overlap %s', m)
  set xrange [0:*]
  plot ARG1 using (strcol(2) eq m && is(strcol(4), 'forward') ? ($5 + $6) / 2 : 1/0):(row($1, strcol(3))):5:6:(row($1, strcol(3)) - 0.3):(row($1, strcol(3)) + 0.3) with boxxyerror lc rgb '#4477aa' title 'forward and backward', \
       ''   using (strcol(2) eq m && is(strcol(4), 'waiting') ? ($5 + $6) / 2 : 1/0):(row($1, strcol(3))):5:6:(row($1, strcol(3)) - 0.3):(row($1, strcol(3)) + 0.3) with boxxyerror lc rgb '#ee6677' title 'device waits for the sum', \
       ''   using (strcol(2) eq m && is(strcol(4), 'sgd') ? ($5 + $6) / 2 : 1/0):(row($1, strcol(3))):5:6:(row($1, strcol(3)) - 0.3):(row($1, strcol(3)) + 0.3) with boxxyerror lc rgb '#228833' title 'sgd', \
       ''   using (strcol(2) eq m && is(strcol(4), 'finish') ? ($5 + $6) / 2 : 1/0):(row($1, strcol(3))):5:6:(row($1, strcol(3)) - 0.12):(row($1, strcol(3)) + 0.12) with boxxyerror lc rgb '#bbbbbb' title 'host in finish()', \
       ''   using (strcol(2) eq m && is(strcol(4), 'MPI_Waitall') ? ($5 + $6) / 2 : 1/0):(row($1, strcol(3))):5:6:(row($1, strcol(3)) - 0.3):(row($1, strcol(3)) + 0.3) with boxxyerror lc rgb '#aa3377' title 'host in MPI_Waitall', \
       ''   using (strcol(2) eq m && is(strcol(4), 'layer') ? $5 : 1/0):(row($1, strcol(3)) + 0.42) with points pt 11 ps 1.2 lc rgb '#000000' title 'a layer''s gradients complete (3, 2, 1, 0)', \
       ''   using (strcol(2) eq m && is(strcol(4), 'MPI sum') ? $5 : 1/0):(row($1, strcol(3)) + 0.42) with points pt 9 ps 1.2 lc rgb '#ccbb44' title 'host starts a layer''s MPI sum', \
       ''   using (strcol(2) eq m && is(strcol(4), 'start_layer') ? $5 : 1/0):(row($1, strcol(3)) - 0.42) with points pt 1 ps 1 lc rgb '#66ccee' title 'host calls start_layer'
}
unset multiplot
PLOT
  stamp "$2"
  echo "wrote $2"
}

case "$what" in
  training) training ;;
  overlap) overlap ;;
  all) training; overlap ;;
esac
