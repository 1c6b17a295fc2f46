#!/usr/bin/env bash
# Chapter 02's results that answer "what do more devices buy?", each from one command, with
# the logs and CSVs behind every figure and a stamp of the machine (tools/machine_stamp.sh):
#
#   curves    d2l's recipe on 1 device and then on 2 (the program's default run): test accuracy
#             and time per epoch, one plot of both.
#   scaling   throughput and speed-up for 1, 2 and 4 devices, strong scaling (the global batch
#             stays 256) and weak scaling (256 per device, the global batch grows, the rate
#             scaled with it), with the ideal line; and where a step's time goes for each run
#             (split, compute, waiting for the slowest device, allreduce, update), as stacked bars.
#             Seconds per epoch leave out the first epoch (one-time set-up), as the result line does.
#   lr        d2l's exercise 2: final test accuracy against the learning rate for 1, 2 and 4
#             devices at a fixed batch per device (64, so the global batch is 64, 128, 256), with
#             the rate given per 64 examples and scaled linearly with the global batch, and the
#             4-device sweep once more with one epoch of warm-up (--warmup-epochs 1); then the
#             4-device sweeps again with 4 times the epochs, which gives them as many steps as
#             1 device takes: what the larger batch lacks, steps or a smaller rate.
#   redraw    no run: scaling's figure drawn again from the CSVs an earlier scaling left in
#             figures/ (its stamp keeps what they were measured on, and names the commit that drew it).
#
# Usage (from anywhere, after building):
#   chapters/02_data_parallel/make_figures.sh [--build DIR] [--out DIR] [--quick] curves|scaling|lr|redraw|all
# Default build folder build/, default output this chapter's figures/ (where the README's
# figures come from). --quick: smaller runs, to see that everything works.
# Takes (cpu backend, 2 cores): curves about 3 minutes, scaling about 1.5, lr about 30 with
# other work sharing the cores (less on a quiet machine); run nothing else meanwhile.
set -euo pipefail
source "$(dirname "$0")/../../tools/figures_common.sh"
figures_parse "curves|scaling|lr|redraw" "$@"
[ "$what" = redraw ] || require_programs 02_data_parallel
program=$build/bin/02_data_parallel

# result_field LOG DEVICES FIELD: FIELD of the result line of the DEVICES-device run in LOG
result_field() {
  awk -v k="$2" -v f="$3" '/^result:/ && $0 ~ (" devices=" k " ") {
    for (i = 1; i <= NF; ++i) { split($i, kv, "="); if (kv[1] == f) print kv[2] } }' "$1"
}

# step_times LOG DEVICES: "split compute_busy waiting allreduce sgd" in ms for that run, from its
# "per step" line and its devices' compute spans (waiting: the compute phase less the mean
# device's busy time, i.e. time a device spent done, waiting for the slowest).
step_times() {
  awk -v k="$2" '
    /^== training on / { run = ($4 == k) }
    run && /^per step/ {
      for (i = 1; i <= NF; ++i) {
        if ($i == "split") split_ms = $(i + 1); if ($i == "compute") compute = $(i + 1)
        if ($i == "allreduce") allreduce = $(i + 1); if ($i == "sgd") sgd = $(i + 1)
      }
    }
    run && /^  device [0-9]+ computes from/ { busy += $7 - $5; n++ }
    END { mean = n ? busy / n : compute; printf "%.3f %.3f %.3f %.3f %.3f\n", split_ms, mean, compute - mean, allreduce, sgd }' "$1"
}


run() {  # run NAME ARGS...: one invocation, its output kept in $runs/NAME.log and echoed
  local name=$1; shift
  echo "== 02_data_parallel $*"
  "$program" --progress off --out "$runs/out" "$@" >"$runs/$name.log" 2>&1 || { cat "$runs/$name.log"; exit 1; }
  grep '^result:' "$runs/$name.log"
}

curves() {
  local args=()
  [ "$quick" = 1 ] && args=(--epochs 2 --limit-train 5120)
  # Named here, so that --quick's files have the default run's names (02_data_parallel_k1, ...).
  run curves --run-name 02_data_parallel ${args[@]+"${args[@]}"}
  local backend; backend=$(backend_of "$runs/curves.log")
  cp "$runs/curves.log" "$out/02_data_parallel_$backend.log"
  for k in 1 2; do cp "$runs/out/02_data_parallel_k$k.csv" "$out/02_data_parallel_k${k}_$backend.csv"; done
  copy_plot "$runs/out/02_data_parallel.png" "$out/02_data_parallel_$backend.png"
  echo "wrote $out/02_data_parallel_$backend.log and its two CSVs"
}

scaling() {
  local limit=20480 epochs=3
  [ "$quick" = 1 ] && limit=5120 epochs=2
  local common=(--limit-train "$limit" --epochs "$epochs")
  for k in 2 4; do
    run strong_k$k --devices "$k" --batch-size 256 --lr 0.2 "${common[@]}"
    run weak_k$k --devices "$k" --batch-size $((256 * k)) --lr "$(awk -v k="$k" 'BEGIN { print 0.2 * k }')" "${common[@]}"
  done
  local backend; backend=$(backend_of "$runs/strong_k2.log")
  local csv=$out/02_scaling_$backend.csv steps=$out/02_step_time_$backend.csv
  # The 1-device point of both: batch 256 on one device (the --devices 2 strong run's first run).
  local base; base=$(result_field "$runs/strong_k2.log" 1 samples_per_sec)
  {
    echo "scaling,devices,global_batch,samples_per_sec,speedup,ideal,sec_per_epoch,test_acc"
    for scaling in strong weak; do
      echo "$scaling,1,256,$base,1,1,$(result_field "$runs/strong_k2.log" 1 sec_per_epoch),$(result_field "$runs/strong_k2.log" 1 test_acc)"
      for k in 2 4; do
        local log=$runs/${scaling}_k$k.log sps
        sps=$(result_field "$log" "$k" samples_per_sec)
        echo "$scaling,$k,$(result_field "$log" "$k" batch),$sps,$(awk -v a="$sps" -v b="$base" 'BEGIN { printf "%.3f", a / b }'),$k,$(result_field "$log" "$k" sec_per_epoch),$(result_field "$log" "$k" test_acc)"
      done
    done
  } >"$csv"
  {
    echo "run,split_ms,compute_ms,waiting_ms,allreduce_ms,sgd_ms"
    echo "k=1,$(step_times "$runs/strong_k2.log" 1 | tr ' ' ',')"
    for k in 2 4; do
      echo "k=$k strong,$(step_times "$runs/strong_k$k.log" "$k" | tr ' ' ',')"
      echo "k=$k weak,$(step_times "$runs/weak_k$k.log" "$k" | tr ' ' ',')"
    done
  } >"$steps"
  cat "$runs"/strong_k2.log "$runs"/weak_k2.log "$runs"/strong_k4.log "$runs"/weak_k4.log >"$out/02_scaling_$backend.log"
  echo "wrote $csv, $steps, $out/02_scaling_$backend.log"
  cat "$csv" "$steps"
  draw_scaling "$csv" "$steps" "$backend"
}

draw_scaling() {  # draw_scaling CSV STEPS_CSV BACKEND
  if can_draw "$out/02_scaling_$3.png"; then
    gnuplot -c /dev/stdin "$out/02_scaling_$3.png" "$1" "$2" "$3" <<'PLOT'
set terminal pngcairo size 1200,400 font 'sans,10' noenhanced
set output ARG1
set datafile separator ','
set multiplot layout 1,3 title sprintf('02_data_parallel on the %s backend: what k devices buy (epochs after the first)', ARG4)
set grid
set key top left
set xlabel 'devices'
set xtics (1, 2, 4)
set ylabel 'training images per second'
set title 'throughput'
# Room above the curves for the key: the ideal line ends at the top right, under it otherwise.
set offsets 0, 0, graph 0.25, 0
plot ARG2 using 2:(strcol(1) eq 'strong' ? $4 : 1/0) with linespoints lw 2 title 'strong: global batch 256', \
     ''   using 2:(strcol(1) eq 'weak' ? $4 : 1/0) with linespoints lw 2 title 'weak: 256 per device', \
     ''   using 2:(strcol(1) eq 'strong' ? $4 / $5 * $6 : 1/0) with lines dt 2 lc 'gray' title 'ideal (k times 1 device)'
set title 'speed-up'
set offsets 0, 0, 0, 0
set ylabel 'speed-up over 1 device'
plot ARG2 using 2:(strcol(1) eq 'strong' ? $5 : 1/0) with linespoints lw 2 title 'strong', \
     ''   using 2:(strcol(1) eq 'weak' ? $5 : 1/0) with linespoints lw 2 title 'weak', \
     ''   using 2:(strcol(1) eq 'strong' ? $6 : 1/0) with lines dt 2 lc 'gray' title 'ideal'
set title 'where a step goes (mean of 20 steps)'
set ylabel 'ms per step'
set xlabel ''
unset xtics
set xtics rotate by -30 nomirror
set style data histograms
set style histogram rowstacked
set style fill solid 0.8 border -1
set boxwidth 0.7
set key top left reverse Left
set yrange [0:*]
set offsets 0, 0, graph 0.45, 0
plot ARG3 using 2:xtic(1) title 'split', '' using 3 title 'compute', '' using 4 title 'waiting for the slowest', \
     '' using 5 title 'allreduce', '' using 6 title 'sgd'
unset multiplot
PLOT
    stamp "$out/02_scaling_$3.png"
    echo "wrote $out/02_scaling_$3.png"
  fi
}

lr_sweep() {
  local limit=20480 epochs=3 bases="0.025 0.05 0.1 0.2 0.4"
  [ "$quick" = 1 ] && limit=5120 epochs=2 bases="0.05 0.2"
  # 4 devices take a quarter of 1 device's steps per epoch: 4 times the epochs give them as many.
  local long=$((4 * epochs))
  local rows=$runs/lr_rows.csv
  : >"$rows"
  # sweep_run NAME DEVICES EPOCHS WARMUP BASE: one run, and its row of the CSV
  sweep_run() {
    local name=$1 k=$2 e=$3 warmup=$4 base=$5 lr
    lr=$(awk -v b="$base" -v k="$k" 'BEGIN { print b * k }')
    if [ "$warmup" = none ]; then
      run "$name" --devices "$k" --batch-size $((64 * k)) --lr "$lr" --limit-train "$limit" --epochs "$e"
    else
      run "$name" --devices "$k" --batch-size $((64 * k)) --lr "$lr" --limit-train "$limit" --epochs "$e" --warmup-epochs 1
    fi
    echo "$k,$warmup,$e,$base,$lr,$((64 * k)),$(result_field "$runs/$name.log" "$k" test_acc)" >>"$rows"
  }
  for base in $bases; do
    for k in 1 2 4; do sweep_run "lr_${base}_k$k" "$k" "$epochs" none "$base"; done
    sweep_run "lr_${base}_k4_warmup" 4 "$epochs" "1 epoch" "$base"
    sweep_run "lr_${base}_k4_long" 4 "$long" none "$base"
    sweep_run "lr_${base}_k4_long_warmup" 4 "$long" "1 epoch" "$base"
  done
  local backend; backend=$(backend_of "$runs/lr_${base}_k1.log")
  local csv=$out/02_lr_sweep_$backend.csv
  # One series after another (devices, epochs, warm-up), so that gnuplot draws each as one line.
  { echo "devices,warmup,epochs,lr_per_64,lr,global_batch,test_acc"; sort -t, -k1,1n -k3,3n -k2,2r -k4,4g "$rows"; } >"$csv"
  cat "$runs"/lr_*.log >"$out/02_lr_sweep_$backend.log"
  echo "wrote $csv, $out/02_lr_sweep_$backend.log"
  cat "$csv"
  plot_lr_sweep "$csv" "$out/02_lr_sweep_$backend.png" "$backend" "$epochs" "$limit" "$long"
}

plot_lr_sweep() {  # plot_lr_sweep CSV PNG BACKEND EPOCHS IMAGES LONG_EPOCHS
  can_draw "$2" || return 0
  gnuplot -c /dev/stdin "$@" <<'PLOT'
set terminal pngcairo size 760,560 font 'sans,10' noenhanced
set output ARG2
set datafile separator ','
set title sprintf('02_data_parallel (%s): final test accuracy, epochs of %s images, 64 images per device', ARG3, ARG5)
set grid
set key below left Left reverse maxrows 3
set logscale x 2
set xtics (0.025, 0.05, 0.1, 0.2, 0.4)
set xlabel 'learning rate per 64 examples (the rate used is this times the number of devices)'
set ylabel 'test accuracy'
set yrange [0:1]
E = int(ARG4); L = int(ARG6)
plot ARG1 using ($1 == 1 && strcol(2) eq 'none' ? $4 : 1/0):7 with linespoints lw 2 title sprintf('1 device, batch 64, %d epochs', E), \
     ''   using ($1 == 2 && strcol(2) eq 'none' ? $4 : 1/0):7 with linespoints lw 2 title sprintf('2 devices, batch 128, %d epochs', E), \
     ''   using ($1 == 4 && $3 == E && strcol(2) eq 'none' ? $4 : 1/0):7 with linespoints lw 2 title sprintf('4 devices, batch 256, %d epochs', E), \
     ''   using ($1 == 4 && $3 == E && strcol(2) ne 'none' ? $4 : 1/0):7 with linespoints lw 2 dt 2 title sprintf('4 devices, batch 256, %d epochs, 1 epoch warm-up', E), \
     ''   using ($1 == 4 && $3 == L && strcol(2) eq 'none' ? $4 : 1/0):7 with linespoints lw 2 lc rgb '#c0392b' title sprintf('4 devices, batch 256, %d epochs (1 device''s steps)', L), \
     ''   using ($1 == 4 && $3 == L && strcol(2) ne 'none' ? $4 : 1/0):7 with linespoints lw 2 dt 2 lc rgb '#6c3483' title sprintf('4 devices, batch 256, %d epochs, 1 epoch warm-up', L)
PLOT
  stamp "$2"
  echo "wrote $2"
}

case "$what" in
  scaling) scaling ;;
  lr) lr_sweep ;;
  curves) curves ;;
  all) curves; scaling; lr_sweep ;;
  redraw)
    # shellcheck disable=SC2034  # read by figures_common.sh's stamp
    redrawing=1
    for csv in "$out"/02_scaling_*.csv; do
      [ -f "$csv" ] || { echo "error: no 02_scaling_<backend>.csv in $out: run scaling first" >&2; exit 1; }
      backend=${csv%.csv} backend=${backend##*_}
      draw_scaling "$csv" "$out/02_step_time_$backend.csv" "$backend"
    done ;;
esac
