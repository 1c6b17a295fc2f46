#!/usr/bin/env bash
# Chapter 09's results, each from one command, with the logs and CSVs behind every figure and a
# stamp of the machine (tools/machine_stamp.sh):
#
#   d2l     d2l 13.6's table: one device with batch 256 at lr 0.1, then two devices with batch 512
#           at lr 0.2, BatchNorm per device (d2l's DataParallel) and synchronized (SyncBN); test
#           accuracy and time per epoch of the three, one plot, and the table as CSV.
#   syncbn  where per-device statistics hurt: a batch of 64 on 4 devices (16 images a device)
#           with BatchNorm per device and with SyncBN, beside the same batch of 64 on one device
#           (which SyncBN computes exactly, up to rounding).
#   twin    d2l's 1-device recipe in C++ and in the PyTorch twin side by side (compare.sh; needs
#           python3-torch), on the same settings as d2l's first run.
#
# On a GPU (cuda build) the runs are d2l's full recipe: width 64, all 60,000 images, 10 epochs.
# The cpu backend does 2.7 GFLOP per image at width 64, 21 minutes of training an epoch on 2 cores, so
# there the runs are a documented subset: --width 16 (a sixteenth of the work) on the first
# 10,000 images, 10 epochs (syncbn: 5).
#
# Usage (from anywhere, after building):
#   chapters/09_resnet/make_figures.sh [--build DIR] [--out DIR] [--quick] d2l|syncbn|twin|redraw|all
# (redraw: no run: d2l's and syncbn's figures drawn again from the CSVs and logs earlier runs left
# in figures/; each stamp keeps what they were measured on, and names the commit that drew it.)
# Default build folder build/, default output this chapter's figures/. --quick: tiny runs, to
# see that everything works. Takes (cpu backend, 2 cores): d2l about 21 minutes, syncbn about
# 13, twin about 11; run nothing else meanwhile.
set -euo pipefail
source "$(dirname "$0")/../../tools/figures_common.sh"
figures_parse "d2l|syncbn|twin|redraw" "$@"
[ "$what" = redraw ] || require_programs 09_resnet
program=$build/bin/09_resnet

run() {  # run NAME ARGS...: one invocation, its output kept in $runs/NAME.log (CSVs in $runs/NAME/)
  local name=$1; shift
  echo "== 09_resnet $*"
  "$program" --progress off --out "$runs/$name" "$@" >"$runs/$name.log" 2>&1 || { cat "$runs/$name.log"; exit 1; }
  grep '^result:' "$runs/$name.log"
}

# The settings every run shares on this machine's backend: the full recipe on a GPU, the
# subset on a CPU; tiny with --quick. (The backend: from the first line of a one-image step.)
if [ "$what" = redraw ]; then
  backend=""  # each figure's, from its files' names
elif "$program" --limit-train 1 --batch-size 1 --width 1 --dump-step "$runs/probe" >"$runs/probe.log" 2>&1; then
  backend=$(backend_of "$runs/probe.log")
else
  cat "$runs/probe.log"; exit 1
fi
if [ "$quick" = 1 ]; then
  common=(--width 4 --limit-train 2048 --epochs 2)
elif [ "$backend" = cuda ]; then
  common=(--width 64)
else
  common=(--width 16 --limit-train 10000)
fi

# result_field LOG FIELD: FIELD of LOG's result line.
result_field() {
  awk -v f="$2" '/^result:/ { for (i = 1; i <= NF; ++i) { split($i, kv, "="); if (kv[1] == f) print kv[2] } }' "$1"
}

# plot PNG TITLE LABEL RUN [LABEL RUN ...]: test accuracy, training loss and seconds per epoch
# of the runs, whose CSVs are copied beside the plot as <png's name>_<run>.csv.
plot() {
  local png=$1 title=$2; shift 2
  local acc="" loss="" sec="" sep=""
  while [ $# -gt 0 ]; do
    local file; file=$(basename "${png%.png}")_$2.csv
    [ "${redrawing:-0}" = 1 ] || cp "$runs/$2"/*.csv "$out/$file"
    acc+="$sep'$file' using 1:4 with linespoints lw 2 title '$1'"
    loss+="$sep'$file' using 1:2 with linespoints lw 2 title '$1'"
    sec+="$sep'$file' using 1:5 with linespoints lw 2 title '$1'"
    sep=", "
    shift 2
  done
  can_draw "$png" || return 0
  (cd "$out" && gnuplot) <<PLOT
set terminal pngcairo size 1400,480 font 'sans,10' noenhanced
set output '$(basename "$png")'
set datafile separator ','
set multiplot layout 1,3 title "$title"
set grid
set xlabel 'epoch'
set xtics 1
# The keys below the plots: a run's test accuracy may fall anywhere.
set key below vertical maxrows 3
set bmargin 7
set ylabel 'test accuracy'
set yrange [0:1]
plot $acc
set ylabel 'training loss (mean over the epoch)'
set yrange [0:*]
plot $loss
set ylabel 'seconds per epoch'
plot $sec
unset multiplot
PLOT
  stamp "$png"
  echo "wrote $png"
}

d2l() {
  local epochs=()
  [ "$quick" = 1 ] || epochs=(--epochs 10)
  run k1 --devices 1 --batch-size 256 --lr 0.1 "${common[@]}" ${epochs[@]+"${epochs[@]}"}
  run k2 --devices 2 --batch-size 512 --lr 0.2 "${common[@]}" ${epochs[@]+"${epochs[@]}"}
  run k2_sync --devices 2 --batch-size 512 --lr 0.2 --bn sync "${common[@]}" ${epochs[@]+"${epochs[@]}"}
  local w; w=$(sed -n 's/^ResNet-18, width \([0-9]*\).*/\1/p' "$runs/k1.log")
  local csv=$out/09_d2l_table_$backend.csv
  {
    echo "devices,batch,lr,batch_norm,test_acc,sec_per_epoch,samples_per_sec"
    for run in k1 k2 k2_sync; do
      local bn=device
      [ "$run" = k2_sync ] && bn=sync
      echo "$(result_field "$runs/$run.log" devices),$(result_field "$runs/$run.log" batch),$(result_field "$runs/$run.log" lr),$bn,$(result_field "$runs/$run.log" test_acc),$(result_field "$runs/$run.log" sec_per_epoch),$(result_field "$runs/$run.log" samples_per_sec)"
    done
  } >"$csv"
  cat "$runs/k1.log" "$runs/k2.log" "$runs/k2_sync.log" >"$out/09_d2l_table_$backend.log"
  plot_d2l "$w"
  echo "wrote $csv, $out/09_d2l_table_$backend.log"
  cat "$csv"
}

syncbn() {
  local epochs=()
  [ "$quick" = 1 ] || epochs=(--epochs 5)
  local small=(--batch-size 64 --lr 0.05 "${common[@]}" ${epochs[@]+"${epochs[@]}"})
  run b64_k1 --devices 1 "${small[@]}"
  run b64_k4 --devices 4 "${small[@]}"
  run b64_k4_sync --devices 4 --bn sync "${small[@]}"
  local w; w=$(sed -n 's/^ResNet-18, width \([0-9]*\).*/\1/p' "$runs/b64_k1.log")
  cat "$runs/b64_k1.log" "$runs/b64_k4.log" "$runs/b64_k4_sync.log" >"$out/09_syncbn_$backend.log"
  plot_syncbn "$w"
  echo "wrote $out/09_syncbn_$backend.log"
}

plot_d2l() {  # plot_d2l WIDTH
  plot "$out/09_d2l_table_$backend.png" "09_resnet (width $1) on the $backend backend: d2l 13.6's two recipes" \
    "1 device, batch 256, lr 0.1" k1 "2 devices, batch 512, lr 0.2, BN per device" k2 \
    "2 devices, batch 512, lr 0.2, SyncBN" k2_sync
}

plot_syncbn() {  # plot_syncbn WIDTH
  plot "$out/09_syncbn_$backend.png" "09_resnet (width $1) on the $backend backend: batch 64, 16 images per device on 4" \
    "1 device" b64_k1 "4 devices, BN per device" b64_k4 "4 devices, SyncBN" b64_k4_sync
}

# redraw: both figures again, for each backend whose CSVs and logs are in figures/, with no run.
redraw() {
  redrawing=1
  local log drawn=0
  for log in "$out"/09_d2l_table_*.log "$out"/09_syncbn_*.log; do
    [ -f "$log" ] || continue
    backend=${log%.log} backend=${backend##*_}
    local w; w=$(sed -n 's/^ResNet-18, width \([0-9]*\).*/\1/p' "$log" | head -n 1)
    case "$log" in
      */09_d2l_table_*) plot_d2l "$w" ;;
      *) plot_syncbn "$w" ;;
    esac
    drawn=$((drawn + 1))
  done
  [ "$drawn" -gt 0 ] || { echo "error: no 09_d2l_table_<backend>.log or 09_syncbn_<backend>.log in $out: run d2l or syncbn first" >&2; exit 1; }
}

twin() {
  local epochs=()
  [ "$quick" = 1 ] || epochs=(--epochs 10)
  (cd "$root" && chapters/09_resnet/compare.sh "$build" -- --out "$runs/twin" \
    --batch-size 256 --lr 0.1 "${common[@]}" ${epochs[@]+"${epochs[@]}"}) | tee "$runs/twin.log"
  cp "$runs/twin.log" "$out/09_resnet_vs_torch_$backend.log"
  # The twin's CSV is named after its settings too: its "wrote" line (the last) says which.
  local twin_csv; twin_csv=$(sed -n 's/^wrote \(.*\/09_resnet_torch[^/]*\.csv\)$/\1/p' "$runs/twin.log" | tail -n 1)
  [ -n "$twin_csv" ] || { echo "error: the PyTorch twin wrote no CSV (see above)" >&2; exit 1; }
  cp "$twin_csv" "$out/09_resnet_torch_$backend.csv"
  # The picture is named after the C++ run, whose name says its settings: twin_compare says which.
  local picture; picture=$(sed -n 's/^wrote \(.*_vs_torch\.png\)$/\1/p' "$runs/twin.log" | tail -n 1)
  copy_plot "${picture:-$runs/twin/09_resnet_vs_torch.png}" "$out/09_resnet_vs_torch_$backend.png"
  echo "wrote $out/09_resnet_vs_torch_$backend.log and 09_resnet_torch_$backend.csv"
}

case "$what" in
  d2l) d2l ;;
  syncbn) syncbn ;;
  twin) twin ;;
  redraw) redraw ;;
  all) d2l; syncbn; twin ;;
esac
