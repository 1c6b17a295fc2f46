#!/usr/bin/env bash
# Chapter 09 against PyTorch: one training step of 09_resnet, dumped (--dump-step) and checked
# tensor by tensor by chapters/09_resnet/crosscheck.py, on one device, on two with SyncBN and on
# three with BatchNorm per device (uneven shards), on the build's default table of layer kernels;
# then on one device with each table 09_resnet offers (--kernels). Skipped (exit 77) where
# Debian's python3 cannot import torch (apt-get install python3-torch).
#   tests/resnet_crosscheck.sh BUILD_DIR SCRATCH_DIR
set -euo pipefail
build=$1 scratch=$2
root=$(cd "$(dirname "$0")/.." && pwd)
python=/usr/bin/python3
if ! "$python" -c 'import torch' 2>/dev/null; then
  echo "cannot import torch with $python (apt-get install python3-torch): skipped"
  exit 77
fi
check() {  # check NAME ARGS...: dump one step with ARGS, then compare it with PyTorch's
  local name=$1; shift
  rm -rf "${scratch:?}/$name"
  "$build/bin/09_resnet" --width 4 --batch-size 24 --progress off --dump-step "$scratch/$name" "$@" >/dev/null
  echo "== $name: 09_resnet $*"
  "$python" "$root/chapters/09_resnet/crosscheck.py" "$scratch/$name" | tail -n 1
}
check one_device
check two_devices_sync --devices 2 --bn sync
check three_devices_per_device --devices 3 --bn device --batch-size 25
for table in reference raw tiled; do
  check "one_device_$table" --kernels "$table"
done
