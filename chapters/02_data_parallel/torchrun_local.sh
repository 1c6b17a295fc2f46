#!/usr/bin/env bash
# torchrun on this machine: K processes of a training script, as compare.sh and the tests start
# the DDP twin.
#
#   chapters/02_data_parallel/torchrun_local.sh K SCRIPT [ARGS...]
#   chapters/02_data_parallel/torchrun_local.sh 2 chapters/02_data_parallel/ddp_torch.py --epochs 2
#
# It is `torchrun --nnodes=1 --nproc_per_node=K SCRIPT ARGS` with two changes, each explained
# below. The interpreter is Debian's /usr/bin/python3 (where python3-torch is installed), or
# MGPU_PYTHON.
set -euo pipefail
if [[ ${1:-} == -h || ${1:-} == --help ]]; then
  echo "usage: $0 K SCRIPT [ARGS...]   (K: the number of processes, at least 1)"
  exit 0
fi
if [[ $# -lt 2 || ! $1 =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: $0 K SCRIPT [ARGS...]   (K: the number of processes, at least 1)" >&2
  exit 2
fi
nproc=$1
shift
python=${MGPU_PYTHON:-/usr/bin/python3}

# torchrun is `python3 -m torch.distributed.run`: asked for through the interpreter, it is that
# interpreter's torch. A rendezvous on port 0 takes a free port, so that two runs on one machine
# (two tests at once) cannot meet each other; --standalone always takes 29400 in torch 1.13.
torchrun=("$python" -m torch.distributed.run --nnodes=1 --nproc_per_node="$nproc"
          --rdzv_backend=c10d --rdzv_endpoint=localhost:0)

# Debian 12 pairs torch 1.13 with Python 3.11, which torch 1.13 predates. From 3.11 on,
# iterating over an IntFlag skips its zero member, so torchrun reads its own defaults,
# --redirects 0 --tee 0, as nothing and stops ("AttributeError: 'NoneType' object has no
# attribute 'get'"). Given as per-rank maps that name only local rank 9, which does not exist
# for 9 processes or fewer, they mean "redirect nothing" again. Only where that parse fails.
if ! "$python" -c 'import sys
from torch.distributed.elastic.multiprocessing.api import Std
sys.exit(Std.from_str("0") is None)' 2>/dev/null; then
  if ((nproc > 9)); then
    echo "error: $python's torchrun cannot parse its default --redirects; the way around it here holds for 9 processes or fewer, not $nproc" >&2
    exit 1
  fi
  torchrun+=(--redirects 9:0 --tee 9:0)
fi
exec "${torchrun[@]}" "$@"
