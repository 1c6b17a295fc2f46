#!/usr/bin/env bash
# Chapter 01's results from one command, with the log and CSVs behind the figure and a stamp of
# the machine (tools/machine_stamp.sh): d2l's recipe in C++ and in the PyTorch twin, side by side
# (compare.sh), test accuracy and time per epoch.
#
# Usage (from anywhere, after building; PyTorch from Debian's python3-torch):
#   chapters/01_lenet/make_figures.sh [--build DIR] [--out DIR] [--quick] [all]
# (all: the one figure this chapter has; the word is there so that every chapter's script takes it.)
# Default build folder build/, default output this chapter's figures/ (where the README's
# figures come from). --quick: a tiny run, to see that everything works.
# Takes (cpu backend, 2 cores): about 4 minutes, most of it PyTorch's; run nothing else meanwhile.
set -euo pipefail
source "$(dirname "$0")/../../tools/figures_common.sh"
figures_parse "" "$@"

args=(--out "$runs/out")
[ "$quick" = 1 ] && args+=(--epochs 1 --limit-train 2048)
(cd "$root" && chapters/01_lenet/compare.sh "$build" -- "${args[@]}") | tee "$runs/compare.log"
backend=$(backend_of "$runs/compare.log")
# Both runs' files are named after their settings (01_lenet and 01_lenet_torch for d2l's;
# --quick's differ): their "wrote ....csv" lines say which, the twin's name starting 01_lenet_torch.
wrote=$(sed -n 's/^wrote \(.*\)\.csv$/\1/p' "$runs/compare.log")
run=$(grep -v '/01_lenet_torch[^/]*$' <<<"$wrote" | head -n 1 || true)
twin_run=$(grep '/01_lenet_torch[^/]*$' <<<"$wrote" | tail -n 1 || true)
[ -n "$run" ] || { echo "error: 01_lenet wrote no CSV (see above)" >&2; exit 1; }
[ -n "$twin_run" ] || { echo "error: the PyTorch twin wrote no CSV (see above)" >&2; exit 1; }
cp "$runs/compare.log" "$out/01_lenet_vs_torch_$backend.log"
cp "$run.csv" "$out/01_lenet_$backend.csv"
cp "$run.json" "$out/01_lenet_$backend.json"
cp "$twin_run.csv" "$out/01_lenet_torch_$backend.csv"
# Each plot with its stamp (tools/check_readme_links.sh asks for one beside every plot a README shows).
copy_plot "$run.png" "$out/01_lenet_$backend.png"
copy_plot "${run}_vs_torch.png" "$out/01_lenet_vs_torch_$backend.png"
echo "wrote $out/01_lenet_vs_torch_$backend.log, 01_lenet_$backend.csv (.json) and 01_lenet_torch_$backend.csv"
