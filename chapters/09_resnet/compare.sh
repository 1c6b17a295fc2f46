#!/usr/bin/env bash
# Run chapter 09's C++ ResNet-18 and its PyTorch twin (d2l 13.6 with nn.DataParallel) on the
# same settings and print their accuracy and time per epoch side by side, with a plot of both
# (results/<C++ run>_vs_torch.png: 09_resnet_vs_torch.png for d2l's settings;
# tools/twin_compare.sh does the work).
#
# Usage (from the repository root):
#   chapters/09_resnet/compare.sh [BUILD_DIR] [-- extra flags for both programs]
# Example (a CPU-sized run: width 16 is a sixteenth of d2l's work per image):
#   chapters/09_resnet/compare.sh build -- --width 16 --limit-train 10000 --epochs 2
#
# BUILD_DIR defaults to "build".  The extra flags go to both programs, so stick to the ones
# they share: --epochs --batch-size --lr --width --data-dir --limit-train --seed --out
# --devices --precision (fp32, tf32 or bf16: the twin's says how in PyTorch's terms; fp32 is
# TF32 off in both).  BatchNorm is per device in both (d2l's DataParallel; the C++ default).  The
# twin runs more than one device only on CUDA GPUs; the C++ cpu build fakes them.
set -euo pipefail
source "$(dirname "$0")/../../tools/twin_compare.sh"

# More than one device: the twin needs that many CUDA GPUs (refused before anything runs).
twin_check_flags() {
  local devices gpus
  devices=$(twin_flag devices 1)
  [[ $devices == 1 ]] && return
  gpus=$("$twin_python" -c 'import torch; print(torch.cuda.device_count())')
  # 10#: decimal, whatever its leading zeros, as the programs read it (bash would read 010 as 8).
  if ! [[ $devices =~ ^[0-9]{1,4}$ ]] || ((10#$devices > gpus)); then
    echo "error: --devices $devices: the PyTorch twin needs that many CUDA GPUs and sees $gpus" >&2
    exit 1
  fi
}

twin_compare 09_resnet chapters/09_resnet/resnet_torch.py "$@"
