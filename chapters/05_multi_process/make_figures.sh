#!/usr/bin/env bash
# The chapter's CPU figures: d2l's defaults on 1 process, on 2 processes, and on 2 processes
# without overlap, then one plot of the three beside chapter 02's 1-device run.
#
# Usage (from the repository root, after building):
#   chapters/05_multi_process/make_figures.sh [BUILD_DIR] [-- extra flags for every run]
# Example, a quick look:
#   chapters/05_multi_process/make_figures.sh build -- --epochs 2 --limit-train 10000
#
# K = 1 is started directly, not by mpirun: Open MPI binds each process to one core when it
# starts 1 or 2 of them, and a single process should have both cores of a 2-core machine.
set -euo pipefail

build_dir=build
if [[ $# -gt 0 && $1 != -- ]]; then
    build_dir=$1
    shift
fi
if [[ $# -gt 0 ]]; then
    if [[ $1 != -- ]]; then
        echo "usage: $0 [BUILD_DIR] [-- extra flags for every run]" >&2
        exit 2
    fi
    shift
fi
extra=("$@")
program=$build_dir/bin/05_multi_process
out=results
if [[ ! -x $program ]]; then
    echo "error: $program not found; build it first: cmake -S . -B $build_dir && cmake --build $build_dir -j" >&2
    exit 1
fi
if ! command -v mpirun >/dev/null; then
    echo "error: mpirun not found: apt-get install openmpi-bin" >&2
    exit 1
fi
mkdir -p "$out"

echo "== 1 process"
"$program" --out "$out" ${extra[@]+"${extra[@]}"} | tee "$out/05_multi_process_k1.log"
echo "== 2 processes, overlap on"
mpirun -np 2 "$program" --out "$out" ${extra[@]+"${extra[@]}"} | tee "$out/05_multi_process_k2.log"
echo "== 2 processes, overlap off"
mpirun -np 2 "$program" --out "$out" --overlap off ${extra[@]+"${extra[@]}"} |
    tee "$out/05_multi_process_k2_no_overlap.log"

# Chapter 02's 1-device run from the same seed: this repository's figure unless you made your own.
ch02=$out/02_data_parallel_k1.csv
[[ -f $ch02 ]] || ch02=chapters/02_data_parallel/figures/02_data_parallel_k1_cpu.csv

if command -v gnuplot >/dev/null; then
    # The paths reach gnuplot as values (ARG1..ARG5 of `gnuplot -c`), never as script text: a
    # quote or a backquote in --out cannot end a string or run a command.
    if gnuplot -c /dev/stdin "$out/05_multi_process_cpu.png" "$ch02" "$out/05_multi_process_k1_mpi.csv" \
        "$out/05_multi_process_k2_mpi.csv" "$out/05_multi_process_k2_mpi_no_overlap.csv" <<'PLOT'
set terminal pngcairo size 1000,400 font 'sans,10' noenhanced
set output ARG1
set datafile separator ','
set key bottom right
set grid
set xlabel 'epoch'
set xrange [0:*]
set multiplot layout 1,2 title '05_multi_process (cpu build): 1 and 2 processes, beside chapter 02 on 1 device'
set ylabel 'test accuracy'
set yrange [0:1]
plot ARG2 using 1:4 with lines lw 4 lc rgb '#cccccc' title 'chapter 02, 1 device', \
     ARG3 using 1:4 with linespoints title '1 process', \
     ARG4 using 1:4 with linespoints title '2 processes', \
     ARG5 using 1:4 with linespoints dt 2 title '2 processes, overlap off'
set ylabel 'seconds per epoch'
set yrange [0:*]
plot ARG2 using 1:5 with lines lw 4 lc rgb '#cccccc' title 'chapter 02, 1 device', \
     ARG3 using 1:5 with linespoints title '1 process', \
     ARG4 using 1:5 with linespoints title '2 processes', \
     ARG5 using 1:5 with linespoints dt 2 title '2 processes, overlap off'
unset multiplot
PLOT
    then
        echo "wrote $out/05_multi_process_cpu.png"
    else
        echo "warning: gnuplot failed: no plot, the CSVs have the numbers" >&2
    fi
else
    echo "warning: gnuplot not found (apt-get install gnuplot-nox): no plot, the CSVs have the numbers" >&2
fi
grep -h '^result:' "$out"/05_multi_process_k*.log
