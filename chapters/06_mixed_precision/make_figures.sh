#!/usr/bin/env bash
# Chapter 06's results, each from one command, with the logs and CSVs behind every figure and a
# stamp of the machine (tools/machine_stamp.sh):
#
#   precision   d2l's recipe (10 epochs, batch 256, lr 0.2) on 1 device in fp32, tf32, bf16, fp16
#               with dynamic loss scaling and fp16 without (16-bit runs exchange 16-bit gradients);
#               the same on 2 devices with the first --limit-train-k2 training images (default
#               20,000: a third of the time); then, on those 20,000 too, bf16 on 2 devices with
#               fp32 gradients (the cost of the 16-bit exchange), and fp16 with PyTorch's mean
#               loss, with and without scaling, on 1 device (where underflow shows). A table
#               (precision.md), the test accuracy curves (precision_k1.png, precision_k2.png) and
#               the loss scaler's record (scaler.png).
#   accumulate  fp32 on 2 devices, 20,000 images: batch 256; batch 64; batch 64 with
#               --accumulate 4 (the step of batch 256 with the memory of batch 64). A table
#               (accumulate.md) and the curves.
#   scaler      no run: scaler.png drawn again from the logs and CSVs precision left in figures/logs
#               (its stamp keeps what they were measured on, and names the commit that drew it).
#
# Usage (from anywhere, after building):
#   chapters/06_mixed_precision/make_figures.sh [--build DIR] [--out DIR] [--quick] precision|accumulate|all
# Default build folder build/, default output this chapter's figures/. --quick: 2 epochs of
# 5,120 images, to see that everything works; --limit-train N: the first N training images only
# in every run (10 epochs still). --keep: a run whose log in <out>/logs is complete is not run
# again (to finish an interrupted table; delete the logs to redo it). Takes (cpu backend, 2 cores): precision about
# 13 minutes, accumulate about 2; run nothing else meanwhile (see BEFORE_EACH_RUN in run()).
set -euo pipefail
source "$(dirname "$0")/../../tools/figures_common.sh"  # (its helpers only: this script reads its own options)
build=$root/build
out=$root/chapters/06_mixed_precision/figures
quick=0
keep=0
limit=""
limit_k2=20000
what=""
usage="usage: $0 [--build DIR] [--out DIR] [--quick] [--limit-train N] [--limit-train-k2 N] [--keep] precision|accumulate|scaler|all"
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=${2:?$usage}; shift 2 ;;
    --out) out=${2:?$usage}; shift 2 ;;
    --quick) quick=1; shift ;;
    --limit-train) limit=${2:?$usage}; shift 2 ;;
    --limit-train-k2) limit_k2=${2:?$usage}; shift 2 ;;
    --keep) keep=1; shift ;;
    -h|--help) echo "$usage"; exit 0 ;;
    precision|accumulate|scaler|all) what=$1; shift ;;
    *) echo "$usage" >&2; exit 2 ;;
  esac
done
[ -n "$what" ] || { echo "$usage" >&2; exit 2; }
require_committed_tree  # figures from committed code only (tools/figures_common.sh)
program=$build/bin/06_mixed_precision
[ "$what" = scaler ] || [ -x "$program" ] || { echo "error: $program not found: build first (cmake -S . -B build && cmake --build build -j)" >&2; exit 1; }
mkdir -p "$out/logs"
out=$(cd "$out" && pwd)  # absolute: the scaler's plot is drawn from the repository's root
recipe=()
[ "$quick" = 1 ] && recipe=(--epochs 2 --limit-train 5120)
[ -n "$limit" ] && recipe+=(--limit-train "$limit")
small=(--limit-train "$limit_k2")  # the runs besides the 1-device table
[ "$quick" = 1 ] && small=()

# field LOG NAME: the value of NAME= on the result: or mixed: line of LOG
field() {
  awk -v f="$2" '/^(result|mixed):/ { for (i = 2; i <= NF; ++i) { split($i, kv, "="); if (kv[1] == f) print kv[2] } }' "$1"
}
# csv_of LOG: the run's CSV (the "wrote ... .csv" line), and its scaler CSV, if any
csv_of() { sed -n 's/^wrote \(.*[^r]\.csv\)$/\1/p' "$1" | grep -v '_scaler\.csv$' | head -n 1; }
scaler_csv_of() { sed -n 's/^wrote \(.*_scaler\.csv\)$/\1/p' "$1" | head -n 1; }

run() {  # run NAME ARGS...: one invocation; its log, CSVs and plot kept under $out/logs
  local name=$1; shift
  # $BEFORE_EACH_RUN, when set, is run first (on a shared machine: a command that waits until
  # nobody else is timing anything).
  if [ "$keep" = 1 ] && grep -q '^mixed:' "$out/logs/$name.log" 2>/dev/null; then
    echo "== 06_mixed_precision $* (kept from $out/logs/$name.log)"
    grep -E '^(result|mixed):' "$out/logs/$name.log"
    return
  fi
  if [ -n "${BEFORE_EACH_RUN:-}" ]; then $BEFORE_EACH_RUN; fi
  echo "== 06_mixed_precision $*"
  "$program" --progress off --out "$out/logs" "$@" "${recipe[@]}" >"$out/logs/$name.log" 2>&1 ||
    { cat "$out/logs/$name.log"; exit 1; }
  grep -E '^(result|mixed):' "$out/logs/$name.log"
}

# table_row NAME LABEL: one markdown row from the run's log and CSV
table_row() {
  local log=$out/logs/$1.log csv
  csv=$(csv_of "$log")
  local best
  best=$(awk -F, 'NR > 1 && $4 > b { b = $4 } END { printf "%.4f", b }' "$csv")
  local images
  images=$(sed -n 's/^Fashion-MNIST from .*: \([0-9]*\) training.*/\1/p' "$log")
  printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$2" "$(field "$log" devices)" "$images" \
    "$(field "$log" loss_scaling)" "$(field "$log" grad_bits)" "$(field "$log" test_acc)" "$best" \
    "$(field "$log" sec_per_epoch)" "$(field "$log" bucket_bytes)" "$(field "$log" ring_bytes_per_device)" \
    "$(field "$log" skipped_steps)"
}

# plot_curves PNG TITLE NAME LABEL [NAME LABEL...]: test accuracy per epoch of the runs
plot_curves() {
  local png=$1 title=$2; shift 2
  can_draw "$png" || return 0
  local plots="" sep=""
  while [ $# -gt 0 ]; do
    plots+="$sep'$(csv_of "$out/logs/$1.log")' using 1:4 with linespoints title '$2'"
    sep=", "; shift 2
  done
  gnuplot <<PLOT
set terminal pngcairo size 900,450 font 'sans,10' noenhanced
set output '$png'
set datafile separator ','
set title '$title'
set key bottom right
set grid
set xlabel 'epoch'
set ylabel 'test accuracy'
set yrange [0:1]
plot $plots
PLOT
  stamp "$png"
  echo "wrote $png"
}

precision() {
  local configs=("fp32|--precision fp32" "tf32|--precision tf32" "bf16|--precision bf16"
                 "fp16_scaled|--precision fp16" "fp16_unscaled|--precision fp16 --loss-scale none")
  local c
  for c in "${configs[@]}"; do
    # shellcheck disable=SC2086  # the flags are words
    run "${c%%|*}_k1" ${c#*|} --devices 1
  done
  for c in "${configs[@]}"; do
    # shellcheck disable=SC2086
    run "${c%%|*}_k2" ${c#*|} --devices 2 "${small[@]}"
  done
  run bf16_g32_k2 --precision bf16 --grad-bits 32 --devices 2 "${small[@]}"
  run fp16_mean_scaled_k1 --precision fp16 --loss mean --devices 1 "${small[@]}"
  run fp16_mean_unscaled_k1 --precision fp16 --loss mean --loss-scale none --devices 1 "${small[@]}"
  # The table's machine stamp, NAME.stamp.txt beside NAME.md; each plot gets its own when drawn.
  "$root/tools/machine_stamp.sh" "$build" >"$out/precision.stamp.txt"
  {
    echo "| run | devices | training images | loss scaling | gradient bits | final test acc | best test acc | s/epoch | gradient bucket (bytes) | bytes sent / device / step | skipped steps |"
    echo "|---|---|---|---|---|---|---|---|---|---|---|"
    for k in 1 2; do
      for c in "${configs[@]}"; do table_row "${c%%|*}_k$k" "${c%%|*}"; done
    done
    table_row bf16_g32_k2 "bf16, fp32 gradients"
    table_row fp16_mean_scaled_k1 "fp16_scaled, mean loss"
    table_row fp16_mean_unscaled_k1 "fp16_unscaled, mean loss"
  } >"$out/precision.md"
  cat "$out/precision.md"
  for k in 1 2; do
    local data="all 60,000 training images"
    [ "$k" = 2 ] && [ ${#small[@]} -gt 0 ] && data="the first $limit_k2 training images"
    plot_curves "$out/precision_k$k.png" "06_mixed_precision: test accuracy, d2l recipe on $k device(s), $data" \
      "fp32_k$k" fp32 "tf32_k$k" tf32 "bf16_k$k" bf16 "fp16_scaled_k$k" "fp16, loss scaling" \
      "fp16_unscaled_k$k" "fp16, no loss scaling"
  done
  draw_scaler
}

# The scaler's record: the scale at each epoch's end, the skipped steps, the gradients flushed.
# (The logs name the CSVs from the repository's root, or absolutely.)
draw_scaler() {
  if can_draw "$out/scaler.png"; then
    local s1 s2 m1 m2
    s1=$(scaler_csv_of "$out/logs/fp16_scaled_k1.log"); s2=$(scaler_csv_of "$out/logs/fp16_scaled_k2.log")
    m1=$(scaler_csv_of "$out/logs/fp16_mean_scaled_k1.log"); m2=$(scaler_csv_of "$out/logs/fp16_mean_unscaled_k1.log")
    (cd "$root" && gnuplot) <<PLOT
set terminal pngcairo size 1200,450 font 'sans,10' noenhanced
set output '$out/scaler.png'
set datafile separator ','
set key below vertical maxrows 3
set bmargin 7
set grid
set xtics 1
set xlabel 'epoch'
set multiplot layout 1,3 title '06_mixed_precision: dynamic loss scaling in fp16 (d2l recipe)'
set logscale y 2
set ylabel 'loss scale at the epoch end'
plot '$s1' using 1:2 with linespoints title 'sum loss, 1 device', '$s2' using 1:2 with linespoints title 'sum loss, 2 devices (fp16 gradients)', '$m1' using 1:2 with linespoints title 'mean loss, 1 device'
unset logscale y
set ylabel 'steps skipped (overflow)'
set yrange [0:*]
plot '$s1' using 1:3 with linespoints title 'sum loss, 1 device', '$s2' using 1:3 with linespoints title 'sum loss, 2 devices', '$m1' using 1:3 with linespoints title 'mean loss, 1 device'
set ylabel '% of dz1 flushed to 0 by fp16'
plot '$m2' using 1:(100*\$8) with linespoints title 'mean loss, no scaling', '$m1' using 1:(100*\$8) with linespoints title 'mean loss, dynamic scaling'
unset multiplot
PLOT
    stamp "$out/scaler.png"
    echo "wrote $out/scaler.png"
  fi
}

accumulate() {
  run acc_b256_m1 --precision fp32 --devices 2 --batch-size 256 "${small[@]}"
  run acc_b64_m1 --precision fp32 --devices 2 --batch-size 64 "${small[@]}"
  run acc_b64_m4 --precision fp32 --devices 2 --batch-size 64 --accumulate 4 "${small[@]}"
  "$root/tools/machine_stamp.sh" "$build" >"$out/accumulate.stamp.txt"
  {
    echo "| run | examples per step | final test acc | s/epoch | bytes sent / device / step | bytes sent / device / example |"
    echo "|---|---|---|---|---|---|"
    for r in "acc_b256_m1|batch 256" "acc_b64_m1|batch 64" "acc_b64_m4|batch 64, --accumulate 4"; do
      local log=$out/logs/${r%%|*}.log
      printf '| %s | %s | %s | %s | %s | %s |\n' "${r#*|}" "$(( $(field "$log" batch) * $(field "$log" accumulate) ))" \
        "$(field "$log" test_acc)" "$(field "$log" sec_per_epoch)" "$(field "$log" ring_bytes_per_device)" \
        "$(field "$log" bytes_per_example)"
    done
  } >"$out/accumulate.md"
  cat "$out/accumulate.md"
  local data=""
  [ ${#small[@]} -gt 0 ] && data=", the first $limit_k2 training images"
  plot_curves "$out/accumulate.png" "06_mixed_precision: gradient accumulation, fp32 on 2 devices$data" \
    acc_b256_m1 "batch 256" acc_b64_m1 "batch 64" acc_b64_m4 "batch 64 x 4 micro-batches"
}

# shellcheck disable=SC2034  # redrawing: read by figures_common.sh's stamp
case "$what" in
  precision) precision ;;
  accumulate) accumulate ;;
  scaler) redrawing=1; draw_scaler ;;  # redrawing: read by figures_common.sh's stamp
  all) precision; accumulate ;;
esac
