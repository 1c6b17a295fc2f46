#!/usr/bin/env bash
# Chapter 10's results, from one command, with the log and CSV behind the figure and a stamp of
# the machine (tools/machine_stamp.sh):
#
#   kernels   10_fast_kernels at ResNet-18's shapes, batch 256: each kernel's time, bytes moved,
#             GB/s and percentage of the device's copy rate, for chapter 09's kernel (the
#             reference) and, in the cuda build, the raw kernel beside it. The table as markdown
#             and CSV, and a bar chart of the percentages (one bar per variant, kernel and shape).
#
# Usage (from anywhere, after building):
#   chapters/10_fast_kernels/make_figures.sh [--build DIR] [--out DIR] [--quick] kernels|all
# Default build folder build/, default output this chapter's figures/ (where the README's
# figures come from). --quick: batch 8, one warm-up call and 3 timed calls, to see that
# everything works. The files are named after the backend (10_fast_kernels_cpu.*,
# 10_fast_kernels_cuda.*), so a GPU's run sits beside the CPU's.
# Takes (cpu backend, 2 cores): about 10 seconds; run nothing else meanwhile.
set -euo pipefail
source "$(dirname "$0")/../../tools/figures_common.sh"
figures_parse "kernels" "$@"
require_programs 10_fast_kernels

kernels() {
  local args=()
  [ "$quick" = 1 ] && args=(-b 8 -w 1 -n 3)
  echo "== 10_fast_kernels ${args[*]}"
  local log=$runs/kernels.log
  "$build/bin/10_fast_kernels" --out "$runs/out" ${args[@]+"${args[@]}"} >"$log" 2>&1 || { cat "$log"; exit 1; }
  grep '^result:' "$log"
  local backend; backend=$(backend_of "$log")
  local name=$out/10_fast_kernels_$backend
  cp "$log" "$name.log"
  cp "$runs/out/10_fast_kernels.csv" "$name.csv"
  cp "$runs/out/10_fast_kernels.md" "$name.md"
  # The stamp of the table (NAME.md), and of the plot where one is drawn (NAME.png).
  "$root/tools/machine_stamp.sh" "$build" >"$name.stamp.txt"
  echo "wrote $name.log, .csv, .md and its stamp"
  plot_percentages "$name.csv" "$name.png" "$backend"
}

# One bar per kernel and shape for each variant: its GB/s as a percentage of the copy rate.
plot_percentages() {  # plot_percentages CSV PNG BACKEND
  can_draw "$2" || return 0
  local data=$runs/percentages.dat has_raw=0
  # Per kernel and shape, in the CSV's order: "label" reference% raw% (NaN where a variant did
  # not run: the cpu build times the references only). The CSV's shape is quoted and holds no comma.
  # awk's status says whether any raw kernel ran: 0 yes, 3 no.
  if awk -F, 'NR > 1 {
        gsub(/"/, "", $2); key = $1 " " $2
        if (!(key in ref)) { order[++n] = key; ref[key] = "NaN"; raw[key] = "NaN" }
        if ($3 == "raw") { raw[key] = $8; any_raw = 1 } else ref[key] = $8
      }
      END { for (i = 1; i <= n; ++i) printf "\"%s\" %s %s\n", order[i], ref[order[i]], raw[order[i]]
            exit any_raw ? 0 : 3 }' "$1" >"$data"; then
    has_raw=1
  fi
  [ -s "$data" ] || { echo "error: $1 holds no rows to plot" >&2; exit 1; }
  local batch; batch=$(awk -F, 'NR == 2 { print $4 }' "$1")
  gnuplot -c /dev/stdin "$data" "$2" "$3" "$has_raw" "$batch" <<'PLOT'
set terminal pngcairo size 1200,520 font 'sans,10' noenhanced
set output ARG2
set title sprintf("GB/s as a percentage of the device's copy rate, batch %s (%s build)", ARG5, ARG3)
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set yrange [0:*]
set ylabel "% of the copy rate"
set xtics rotate by -50 scale 0 font ',8'
set grid ytics
set key top left
set rmargin 9
set arrow from graph 0, first 100 to graph 1, first 100 nohead dt 2
if (ARG4 eq "1") {
  plot ARG1 using 2:xtic(1) title "chapter 09's kernel (reference)", '' using 3 title 'raw CUDA kernel'
} else {
  plot ARG1 using 2:xtic(1) title "chapter 09's kernel (reference; the cpu build times no raw kernels)"
}
PLOT
  echo "wrote $2"
}

case "$what" in
  kernels|all) kernels ;;
esac
