#!/usr/bin/env bash
# Run chapter 02's C++ data-parallel LeNet on K devices and its PyTorch twin, DDP in K processes
# started by torchrun, on the same settings, and print their accuracy and time per epoch side by
# side, with a plot of both (results/02_data_parallel_vs_torch.png; tools/twin_compare.sh does
# the work).
#
# Usage (from the repository root):
#   chapters/02_data_parallel/compare.sh [BUILD_DIR] [-- extra flags for both programs]
# Example (DDP on 2 cores is slow: a few minutes):
#   chapters/02_data_parallel/compare.sh build -- --devices 2 --epochs 3 --limit-train 10000
#
# BUILD_DIR defaults to "build".  The extra flags go to both programs, so stick to the ones
# they share: --devices (K, default 2: the C++ program's devices, the twin's processes)
# --epochs --batch-size (the global batch: K must divide it for the twin) --lr --data-dir
# --limit-train --seed --out.  The C++ program runs with --baseline off: the K-device run alone,
# which is the one compared.
set -euo pipefail
source "$(dirname "$0")/../../tools/twin_compare.sh"

twin_check_flags() {
  devices=$(twin_flag devices 2)
  if ! [[ $devices =~ ^[1-9][0-9]*$ ]]; then
    echo "error: --devices must be a whole number of at least 1, got '$devices'" >&2
    exit 2
  fi
}

twin_launch() {
  twin_cpp_command+=(--baseline off)
  # torchrun --nproc_per_node=K, with a free port and Debian 12's fix (torchrun_local.sh says why).
  twin_command=(chapters/02_data_parallel/torchrun_local.sh "$devices" "$twin")
}

twin_compare 02_data_parallel chapters/02_data_parallel/ddp_torch.py "$@"
