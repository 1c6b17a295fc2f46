#!/usr/bin/env bash
# Run chapter 01's C++ LeNet and its PyTorch twin on the same settings and
# print their accuracy and time per epoch side by side, with a plot of both
# (results/01_lenet_vs_torch.png for d2l's settings, <C++ run>_vs_torch.png for
# others; tools/twin_compare.sh does the work).
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
source "$(dirname "$0")/../../tools/twin_compare.sh"
twin_compare 01_lenet chapters/01_lenet/lenet_torch.py "$@"
