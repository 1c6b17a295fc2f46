#!/usr/bin/env bash
# Chapter 05 started by torchrun itself, as a PyTorch user would start it:
#   torchrun --nproc_per_node=2 --no_python build/bin/05_multi_process
# Each process sees torchrun's RANK, WORLD_SIZE and LOCAL_RANK but is a world of one to MPI, so
# each must refuse (status 2, naming torchrun's variables and the mpirun command), and nothing
# may train. Checks: torchrun ends with a failure; both ranks' refusals are in its output; no
# result line; no results file. Skipped (77) where Debian's python3 cannot import torch.
#   tests/torchrun_refused.sh PROGRAM OUT
set -euo pipefail
if [[ $# -ne 2 ]]; then
  echo "usage: $0 PROGRAM OUT" >&2
  exit 2
fi
program=$1 out=$2
root=$(cd "$(dirname "$0")/.." && pwd)
if ! /usr/bin/python3 -c 'import torch' 2>/dev/null; then
  echo "cannot import torch with /usr/bin/python3 (apt-get install python3-torch): skipped"
  exit 77
fi
rm -rf "$out"
status=0
output=$("$root/chapters/02_data_parallel/torchrun_local.sh" 2 --no_python "$program" \
  --epochs 1 --limit-train 64 --out "$out" 2>&1) || status=$?
echo "$output"
fail() { echo "FAIL: $*"; exit 1; }
[ "$status" -ne 0 ] || fail "torchrun ended with status 0: the processes were not refused"
refusals=$(grep -c "WORLD_SIZE=2 and RANK=[01] are set (torchrun's launch)" <<<"$output" || true)
[ "$refusals" -eq 2 ] || fail "$refusals refusal(s) naming torchrun's variables, expected one per rank (2)"
grep -q "mpirun -np 2" <<<"$output" || fail "the refusal does not say how to start it (mpirun -np 2)"
if grep -q "^result:" <<<"$output"; then fail "a process trained (a result line)"; fi
if [ -e "$out" ] && [ -n "$(ls -A "$out")" ]; then fail "results were written into $out: $(ls "$out")"; fi
echo "PASS: under torchrun both ranks refused, naming its variables, and nothing trained"
