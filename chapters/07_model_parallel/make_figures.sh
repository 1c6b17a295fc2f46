#!/usr/bin/env bash
# Chapter 07's results, each from one command, with the logs and CSVs behind every figure and a
# stamp of the machine (tools/machine_stamp.sh):
#
#   training  time per epoch and accuracy on a subset (--limit-train 10240, 2 epochs): one
#             device, the naive split on 2, GPipe and 1F1B with 4 micro-batches on 2, and the
#             2 x 2 hybrid on 4
#   full      d2l's full recipe (10 epochs, 60,000 images) for GPipe on 2 devices
#   bubble    the idle fraction of each device for m = 1, 2, 4, 8, 16 micro-batches, GPipe and
#             1F1B, against (k-1)/(m+k-1) and against the prediction from the stages' own times;
#             the activation memory each stage keeps
#   timeline  one step device by device (forward, backward, copies, waits): the naive split and
#             GPipe with 4 micro-batches
#
# Usage (from anywhere, after building):
#   chapters/07_model_parallel/make_figures.sh [--build DIR] [--out DIR] [--quick] training|full|bubble|timeline|all
# Default build folder build/, default output this chapter's figures/. --quick: tiny runs, to see
# that everything works. Takes (cpu backend, 2 cores): training and bubble under 1 minute each,
# timeline well under 1, full about 3 minutes (all about 4); run nothing else meanwhile.
set -euo pipefail
source "$(dirname "$0")/../../tools/figures_common.sh"
figures_parse "training|full|bubble|timeline" "$@"
require_programs 07_model_parallel
program=$build/bin/07_model_parallel

# run NAME ARGS...: the program with ARGS, its log kept as $runs/NAME.log (shown if it fails).
run() {
  local name=$1
  shift
  echo "== 07_model_parallel $*"
  "$program" --progress off --out "$runs/out" "$@" >"$runs/$name.log" 2>&1 || { cat "$runs/$name.log"; exit 1; }
  grep '^result:' "$runs/$name.log"
}

training() {
  local subset=(--epochs 2 --limit-train 10240 --profile-steps 0)
  [ "$quick" = 1 ] && subset=(--epochs 1 --limit-train 512 --profile-steps 0)
  run one_device "${subset[@]}" --devices 1 --schedule naive
  run naive_k2 "${subset[@]}" --schedule naive
  run gpipe_k2 "${subset[@]}" --schedule gpipe --micro-batches 4
  run 1f1b_k2 "${subset[@]}" --schedule 1f1b --micro-batches 4
  run hybrid_k4 "${subset[@]}" --devices 4 --data-parallel 2 --schedule gpipe --micro-batches 4
  local backend; backend=$(backend_of "$runs/one_device.log")
  local table=$out/07_training_subset_$backend.csv
  echo "run,devices,schedule,micro_batches,replicas,test_acc,sec_per_epoch,samples_per_sec" >"$table"
  for name in one_device naive_k2 gpipe_k2 1f1b_k2 hybrid_k4; do
    cp "$runs/$name.log" "$out/07_training_${name}_$backend.log"
    awk -v name="$name" '/^backend/ { split($0, a, ", "); } /^result:/ {
        for (i = 2; i <= NF; ++i) { split($i, kv, "="); v[kv[1]] = kv[2] } }
      END { print name "," v["devices"] "," sched "," m "," r "," v["test_acc"] "," v["sec_per_epoch"] "," v["samples_per_sec"] }' \
      sched="$(awk '/^backend/ { for (i = 1; i <= NF; ++i) if ($i == "schedule") { sub(",", "", $(i + 1)); print $(i + 1) } }' "$runs/$name.log")" \
      m="$(awk '/^backend/ { for (i = 1; i <= NF; ++i) if ($i == "micro-batch(es)") print $(i - 1) }' "$runs/$name.log")" \
      r="$(awk '/^backend/ { for (i = 1; i <= NF; ++i) if ($i == "replica(s),") print $(i - 1) }' "$runs/$name.log")" \
      "$runs/$name.log" >>"$table"
  done
  cat "$table"
  echo "wrote $table and the runs' logs"
}

full() {
  local full=(--profile-steps 0)
  [ "$quick" = 1 ] && full=(--epochs 1 --limit-train 1024 --profile-steps 0)
  # Named here, so that --quick's files have the full run's names.
  run full_gpipe_k2 "${full[@]}" --schedule gpipe --micro-batches 4 --run-name 07_model_parallel_k2_gpipe_m4
  local backend; backend=$(backend_of "$runs/full_gpipe_k2.log")
  local name=$out/07_model_parallel_k2_gpipe_m4_$backend
  cp "$runs/full_gpipe_k2.log" "$name.log"
  cp "$runs/out/07_model_parallel_k2_gpipe_m4.csv" "$name.csv"
  copy_plot "$runs/out/07_model_parallel_k2_gpipe_m4.png" "$name.png"
  echo "wrote $name.{log,csv}"
}

bubble() {
  local common=(--epochs 1 --limit-train 1024 --profile-steps 10) ms=(1 2 4 8 16)
  [ "$quick" = 1 ] && common=(--epochs 1 --limit-train 256 --profile-steps 2) && ms=(1 4)
  local csv=$runs/bubble.csv backend=""
  echo "schedule,stages,micro_batches,stage,busy,idle,formula,predicted,stage_ms,step_ms,activation_mb" >"$csv"
  for schedule in gpipe 1f1b; do
    for m in "${ms[@]}"; do
      local sched=$schedule
      [ "$m" = 1 ] && sched=naive
      run "bubble_${schedule}_m$m" "${common[@]}" --schedule "$sched" --micro-batches "$m"
      backend=$(backend_of "$runs/bubble_${schedule}_m$m.log")
      cat "$runs/bubble_${schedule}_m$m.log" >>"$runs/bubble_all.log"
      awk -v s="$schedule" '/^bubble:/ { for (i = 2; i <= NF; ++i) { split($i, kv, "="); v[kv[1]] = kv[2] }
          print s "," v["stages"] "," v["micro_batches"] "," v["stage"] "," v["busy"] "," v["idle"] "," v["formula"] "," \
                v["predicted"] "," v["stage_ms"] "," v["step_ms"] "," v["activation_mb"] }' \
        "$runs/bubble_${schedule}_m$m.log" >>"$csv"
    done
  done
  local name=$out/07_bubble_$backend
  cp "$csv" "$name.csv"
  cp "$runs/bubble_all.log" "$name.log"
  cat "$name.csv"
  echo "wrote $name.{csv,log}"
  plot_bubble "$name.csv" "$name.png" "$backend" $((2 * ${#ms[@]}))
}

# plot_bubble CSV PNG BACKEND ROWS: idle fraction against m, one panel per schedule; the CSV holds
# ROWS lines per schedule (gpipe first), stage 0 and stage 1 in turn for each m.
plot_bubble() {
  can_draw "$2" || return 0
  gnuplot -c /dev/stdin "$@" <<'PLOT'
set terminal pngcairo size 1200,420 font 'sans,10' noenhanced
set output ARG2
set datafile separator ','
rows = int(ARG4)
set multiplot layout 1,2 title sprintf('LeNet on 2 pipeline stages, --split 2 (%s build): idle fraction of each device against micro-batches per step', ARG3)
set logscale x 2
set xlabel 'micro-batches m'
set ylabel 'idle fraction of the step'
set yrange [0:1]
set grid
set key center right font ',8'
do for [i = 0:1] {
  first = 1 + i * rows
  set title (i == 0 ? 'gpipe' : '1f1b')
  plot ARG1 every 2::first::(first + rows - 2) using 3:6 with linespoints pt 7 lc 1 title 'device 0 (conv1, conv2) measured', \
       ARG1 every 2::(first + 1)::(first + rows - 1) using 3:6 with linespoints pt 5 lc 2 title 'device 1 (dense3, dense4) measured', \
       ARG1 every 2::first::(first + rows - 2) using 3:8 with lines dt 2 lc 1 title 'device 0 predicted from its stage times', \
       ARG1 every 2::(first + 1)::(first + rows - 1) using 3:8 with lines dt 2 lc 2 title 'device 1 predicted', \
       ARG1 every 2::first::(first + rows - 2) using 3:7 with lines lw 2 lc rgb 'black' title '(k-1)/(m+k-1): equal stages'
}
unset multiplot
PLOT
  stamp "$2"
  echo "wrote $2"
}

timeline() {
  local common=(--epochs 1 --limit-train 1024 --profile-steps 10)
  [ "$quick" = 1 ] && common=(--epochs 1 --limit-train 256 --profile-steps 2)
  # Named here (the full run above has other settings, and its own name): <name>_timeline.csv, .png
  run timeline_naive "${common[@]}" --schedule naive --run-name 07_profiled_naive_m1
  run timeline_gpipe "${common[@]}" --schedule gpipe --micro-batches 4 --run-name 07_profiled_gpipe_m4
  run timeline_1f1b "${common[@]}" --schedule 1f1b --micro-batches 4 --run-name 07_profiled_1f1b_m4
  local backend; backend=$(backend_of "$runs/timeline_naive.log")
  for run in naive_m1 gpipe_m4 1f1b_m4; do
    local from=$runs/out/07_profiled_${run}_timeline name=$out/07_timeline_${run}_$backend
    cp "$from.csv" "$name.csv"
    echo "wrote $name.csv"
    copy_plot "$from.png" "$name.png"
  done
}

case "$what" in
  training) training ;;
  bubble) bubble ;;
  timeline) timeline ;;
  full) full ;;
  all) training; bubble; timeline; full ;;
esac
