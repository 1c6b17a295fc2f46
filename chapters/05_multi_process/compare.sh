#!/usr/bin/env bash
# Run chapter 05's C++ program and its PyTorch twin (chapter 02's DDP script), both as K
# processes started by mpirun, on the same settings, and print their accuracy and time per
# epoch side by side, with a plot of both (results/05_multi_process_vs_torch.png;
# tools/twin_compare.sh does the work).
#
# Usage (from the repository root):
#   chapters/05_multi_process/compare.sh [BUILD_DIR] [-- extra flags for both programs]
# Example (a few minutes on 2 cores):
#   chapters/05_multi_process/compare.sh build -- --devices 2 --epochs 3 --limit-train 10000
#
# BUILD_DIR defaults to "build".  The extra flags go to both programs, so stick to the ones
# they share: --devices (K, the processes: default 1, started directly as the program is without
# mpirun) --epochs --batch-size (the global batch: K must divide it for the twin) --lr
# --data-dir --limit-train --seed --out.  As root, Open MPI wants OMPI_ALLOW_RUN_AS_ROOT=1
# OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 in the environment; MGPU_MPIRUN_FLAGS adds words to both
# mpirun commands (--oversubscribe for more processes than cores, say).
set -euo pipefail
source "$(dirname "$0")/../../tools/twin_compare.sh"

twin_check_flags() {
  ranks=$(twin_flag devices 1)
  if ! [[ $ranks =~ ^[1-9][0-9]*$ ]]; then
    echo "error: --devices must be a whole number of at least 1, got '$ranks'" >&2
    exit 2
  fi
  if ((ranks > 1)) && ! command -v mpirun >/dev/null; then
    echo "error: --devices $ranks needs mpirun: apt-get install openmpi-bin" >&2
    exit 1
  fi
}

twin_launch() {
  twin_command+=(--chapter 05_multi_process)
  ((ranks > 1)) || return 0  # one process: both started directly, a world of one
  local mpirun=(mpirun -np "$ranks")
  read -r -a extra <<<"${MGPU_MPIRUN_FLAGS:-}"
  mpirun+=(${extra[@]+"${extra[@]}"})
  # The twin's ranks meet at rank 0's TCP store, at 127.0.0.1 (every rank is on this machine) and
  # a port that is free now; -x hands MASTER_PORT to every rank, as it must across machines.
  export MASTER_PORT=${MASTER_PORT:-$("$twin_python" -c 'import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])')}
  twin_cpp_command=("${mpirun[@]}" "${twin_cpp_command[@]}")
  twin_command=("${mpirun[@]}" -x MASTER_PORT "${twin_command[@]}")
}

twin_compare 05_multi_process chapters/02_data_parallel/ddp_torch.py "$@"
