#!/usr/bin/env bash
# Chapter 03's results, each from one command, with the logs and CSVs behind every figure and a
# stamp of the machine (tools/machine_stamp.sh):
#
#   training  d2l's recipe on 2 devices, chapter 02's allreduce and then the ring, from the same
#             weights and batches (test accuracy and time per epoch), and one step's allreduce
#             timed three ways.
#   bench     03_allreduce_bench on 2, 4 and 8 devices from 4 B to 256 MiB (time, algbw,
#             busbw, wrong elements), and the measured times beside the cost model's
#             predictions: for this machine (alpha and beta calibrated here) and for two
#             interconnects it may not have (PCIe Gen4, NVLink 4), one panel per device count.
#   model     no run: bench's second figure drawn again from the CSVs an earlier bench left in
#             figures/ (its stamp keeps what they were measured on, and names the commit that drew it).
#
# Usage (from anywhere, after building):
#   chapters/03_ring_allreduce/make_figures.sh [--build DIR] [--out DIR] [--quick] training|bench|model|all
# Default build folder build/, default output this chapter's figures/ (where the README's
# figures come from). --quick: tiny runs, to see that everything works.
# Takes (cpu backend, 2 cores): training about 2.5 minutes, bench about 1.5 (all: about 4); run nothing else meanwhile.
set -euo pipefail
source "$(dirname "$0")/../../tools/figures_common.sh"
figures_parse "training|bench|model" "$@"
[ "$what" = model ] || require_programs 03_ring_allreduce 03_allreduce_bench

training() {
  local args=()
  [ "$quick" = 1 ] && args=(--epochs 1 --limit-train 2048)
  echo "== 03_ring_allreduce ${args[*]}"
  local log=$runs/training.log
  # Named here, so that --quick's files have the default run's names (03_ring_allreduce_naive, ...).
  "$build/bin/03_ring_allreduce" --progress off --out "$runs/out" --run-name 03_ring_allreduce ${args[@]+"${args[@]}"} \
    >"$log" 2>&1 ||
    { cat "$log"; exit 1; }
  grep '^result:' "$log"
  local backend; backend=$(backend_of "$log")
  cp "$log" "$out/03_ring_allreduce_$backend.log"
  for algorithm in naive ring; do
    cp "$runs/out/03_ring_allreduce_${algorithm}.csv" "$out/03_ring_allreduce_${algorithm}_k2_$backend.csv"
  done
  copy_plot "$runs/out/03_ring_allreduce.png" "$out/03_ring_allreduce_$backend.png"
  echo "wrote $out/03_ring_allreduce_$backend.log and its two CSVs"
}

bench() {
  local args=()
  [ "$quick" = 1 ] && args=(-g 2 -e 64K)
  echo "== 03_allreduce_bench ${args[*]}"
  local log=$runs/bench.log
  "$build/bin/03_allreduce_bench" --out "$runs/out" ${args[@]+"${args[@]}"} >"$log" 2>&1 || { cat "$log"; exit 1; }
  local backend; backend=$(backend_of "$log")
  local name=$out/03_allreduce_bench_$backend
  cp "$log" "$name.log"
  cp "$runs/out/03_allreduce_bench.csv" "$name.csv"
  cp "$runs/out/03_allreduce_bench_model.csv" "${name}_model.csv"
  copy_plot "$runs/out/03_allreduce_bench.png" "$name.png"
  echo "wrote $name.{log,csv} and ${name}_model.csv"
  plot_model "$name.csv" "${name}_model.csv" "$out/03_allreduce_model_$backend.png" "$backend"
}

# Measured naive and ring times (points) beside the predictions (lines), one panel per device count.
plot_model() {  # plot_model BENCH_CSV MODEL_CSV PNG BACKEND
  can_draw "$3" || return 0
  local counts; counts=$(awk -F, 'NR > 1 { print $2 }' "$1" | sort -un | tr '\n' ' ')
  gnuplot -c /dev/stdin "$@" "$counts" <<'PLOT'
set terminal pngcairo size 1200,480 font 'sans,10' noenhanced
set output ARG3
set datafile separator ','
n = words(ARG5)
set multiplot layout 1,n title sprintf('allreduce time against message size (%s build): measured here (points) and the cost model (lines)', ARG4)
set logscale xy
set grid
set xtics 1024
set format x '%.0b%B'
set xlabel 'message (bytes)'
set ylabel 'time per allreduce (us)'
# One key for the three panels, below the first: inside, it lay over the measured points.
set key below left vertical maxrows 4 font ',8'
set bmargin 8
here = 'this machine (shared memory)'
pcie = 'PCIe Gen4 x16 (A100 80GB PCIe)'
nvlink = 'NVLink 4 + NVSwitch (H100 SXM5)'
do for [i = 1:n] {
  k = int(word(ARG5, i))
  set title sprintf('%d devices', k)
  if (i > 1) { unset key }
  plot ARG1 using ($2 == k && strcol(1) eq 'naive' ? $3 : 1/0):5 with points pt 7 lc 1 title 'naive, measured', \
       ''   using ($2 == k && strcol(1) eq 'ring' ? $3 : 1/0):5 with points pt 5 lc 2 title 'ring, measured', \
       ARG2 using ($2 == k && strcol(1) eq here ? $3 : 1/0):4 with lines lc 1 title 'naive, model of this machine', \
       ''   using ($2 == k && strcol(1) eq here ? $3 : 1/0):5 with lines lc 2 title 'ring, model of this machine', \
       ''   using ($2 == k && strcol(1) eq pcie ? $3 : 1/0):4 with lines dt 2 lc 1 title 'naive, PCIe Gen4 model', \
       ''   using ($2 == k && strcol(1) eq pcie ? $3 : 1/0):5 with lines dt 2 lc 2 title 'ring, PCIe Gen4 model', \
       ''   using ($2 == k && strcol(1) eq nvlink ? $3 : 1/0):4 with lines dt 3 lw 2 lc 1 title 'naive, NVLink 4 model', \
       ''   using ($2 == k && strcol(1) eq nvlink ? $3 : 1/0):5 with lines dt 3 lw 2 lc 2 title 'ring, NVLink 4 model'
}
unset multiplot
PLOT
  stamp "$3"
  echo "wrote $3"
}

case "$what" in
  training) training ;;
  bench) bench ;;
  model)
    # shellcheck disable=SC2034  # read by figures_common.sh's stamp
    redrawing=1
    for csv in "$out"/03_allreduce_bench_*_model.csv; do
      [ -f "$csv" ] || { echo "error: no 03_allreduce_bench_<backend>_model.csv in $out: run bench first" >&2; exit 1; }
      backend=${csv%_model.csv} backend=${backend##*_}
      plot_model "${csv%_model.csv}.csv" "$csv" "$out/03_allreduce_model_$backend.png" "$backend"
    done ;;
  all) training; bench ;;
esac
