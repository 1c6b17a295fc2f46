#!/usr/bin/env bash
# Run chapter 01's C++ LeNet and its PyTorch twin on the same settings and
# print their accuracy and time per epoch side by side.
#
# Usage (from the repository root):
#   chapters/01_lenet/compare.sh [BUILD_DIR] [-- extra flags for both programs]
# Example:
#   chapters/01_lenet/compare.sh build -- --epochs 2 --limit-train 10000
#
# BUILD_DIR defaults to "build".  The extra flags go to both programs, so stick
# to the ones they share: --epochs --batch-size --lr --data-dir --limit-train
# --seed --out.
set -euo pipefail

build_dir=build
if [[ $# -gt 0 && $1 != -- ]]; then
    build_dir=$1
    shift
fi
if [[ $# -gt 0 ]]; then
    if [[ $1 != -- ]]; then
        echo "usage: $0 [BUILD_DIR] [-- extra flags passed to both programs]" >&2
        exit 2
    fi
    shift
fi
extra=("$@")

cpp_bin=$build_dir/bin/01_lenet
twin=chapters/01_lenet/lenet_torch.py
python=/usr/bin/python3   # Debian's interpreter: that is where python3-torch is installed

# Check both prerequisites before spending minutes on the first run.
if [[ ! -x $cpp_bin ]]; then
    echo "error: $cpp_bin not found; build it first:" >&2
    echo "  cmake -S . -B $build_dir && cmake --build $build_dir -j" >&2
    exit 1
fi
if ! "$python" -c 'import torch' 2>/dev/null; then
    echo "error: $python cannot import torch; install it with:" >&2
    echo "  apt-get install python3-torch" >&2
    exit 1
fi

logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT

# tee shows progress live and keeps a copy for parsing; with pipefail a
# failing program still stops the script.  (The ${a[@]+...} form keeps
# "set -u" quiet on older bash when no extra flags were given.)
echo "== C++: $cpp_bin ${extra[*]-}"
"$cpp_bin" ${extra[@]+"${extra[@]}"} | tee "$logs/cpp.txt"
echo
echo "== PyTorch twin: $twin ${extra[*]-}"
"$python" "$twin" ${extra[@]+"${extra[@]}"} | tee "$logs/torch.txt"
echo

# field FILE KEY: the value of KEY=... on the last "result:" line of FILE.
field() {
    local line
    line=$(grep '^result:' "$1" | tail -n 1) || true
    if [[ -z $line ]]; then
        echo "error: no 'result:' line in the output of ${1##*/}" >&2
        exit 1
    fi
    sed -n "s/.*[[:space:]]$2=\([^[:space:]]*\).*/\1/p" <<<"$line"
}

cpp_backend=$(field "$logs/cpp.txt" backend)
cpp_acc=$(field "$logs/cpp.txt" test_acc)
cpp_sec=$(field "$logs/cpp.txt" sec_per_epoch)
py_backend=$(field "$logs/torch.txt" backend)
py_acc=$(field "$logs/torch.txt" test_acc)
py_sec=$(field "$logs/torch.txt" sec_per_epoch)

printf '%-14s %-11s %-9s %s\n' program backend test_acc sec/epoch
printf '%-14s %-11s %-9s %s\n' 01_lenet "$cpp_backend" "$cpp_acc" "$cpp_sec"
printf '%-14s %-11s %-9s %s\n' "pytorch twin" "$py_backend" "$py_acc" "$py_sec"
# bash has no floating point; awk does the division.
awk -v py="$py_sec" -v cpp="$cpp_sec" 'BEGIN {
    if (cpp + 0 > 0) printf "PyTorch / C++ time per epoch: %.2fx\n", py / cpp
    else print "PyTorch / C++ time per epoch: n/a (C++ time is zero)"
}'

# Both programs wrote a CSV with the same columns into the same folder (--out, default
# results/): draw the two runs in one picture, test accuracy and seconds per epoch.
out=results
for ((i = 0; i < ${#extra[@]}; i++)); do
    case ${extra[i]} in
        --out) out=${extra[i + 1]-results} ;;
        --out=*) out=${extra[i]#--out=} ;;
    esac
done
if command -v gnuplot >/dev/null; then
    # The paths and names reach gnuplot as values (ARG1..ARG5 of `gnuplot -c`), never as script
    # text: a quote or a backquote in --out cannot end a string or run a command. ('PLOT' is
    # quoted, so bash expands nothing in the script either.)
    if gnuplot -c /dev/stdin "$out/01_lenet_vs_torch.png" "$out/01_lenet.csv" "$out/01_lenet_torch.csv" \
        "$cpp_backend" "$py_backend" <<'PLOT'
set terminal pngcairo size 1000,400 font 'sans,10' noenhanced
set output ARG1
set datafile separator ','
set key bottom right
set grid
set xlabel 'epoch'
set multiplot layout 1,2 title sprintf('01_lenet (C++, %s) and its PyTorch twin (%s)', ARG4, ARG5)
set ylabel 'test accuracy'
set yrange [0:1]
plot ARG2 using 1:4 with linespoints title 'C++', \
     ARG3 using 1:4 with linespoints title 'PyTorch'
set ylabel 'seconds per epoch'
set yrange [0:*]
plot ARG2 using 1:5 with linespoints title 'C++', \
     ARG3 using 1:5 with linespoints title 'PyTorch'
unset multiplot
PLOT
    then
        echo "wrote $out/01_lenet_vs_torch.png"
    else
        echo "warning: gnuplot failed: no plot, the CSVs have the numbers" >&2
    fi
else
    echo "warning: gnuplot not found (apt-get install gnuplot-nox): no plot, the CSVs have the numbers" >&2
fi
