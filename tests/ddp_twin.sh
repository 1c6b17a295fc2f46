#!/usr/bin/env bash
# The DDP twin of chapters 02 and 05 (chapters/02_data_parallel/ddp_torch.py) on a tiny run,
# started as its chapter starts it, and what it must print and write:
#   tests/ddp_twin.sh torchrun|mpirun K OUT [twin flags...]
# torchrun: chapter 02's (chapters/02_data_parallel/torchrun_local.sh K); mpirun: chapter 05's
# (mpirun -np K, with MGPU_MPIRUN_FLAGS, the twin named --chapter 05_multi_process).
# Checks: exit status 0; one "rank r: host ..." line per rank; the result line, with the
# chapter, K, the epochs, the batch, a test accuracy, the launcher and gloo or NCCL; a CSV
# with one row per epoch. Skipped (exit 77) where Debian's python3 cannot import torch.
set -euo pipefail
if [[ $# -lt 3 ]]; then
  echo "usage: $0 torchrun|mpirun K OUT [twin flags...]" >&2
  exit 2
fi
launcher=$1 ranks=$2 out=$3
shift 3
root=$(cd "$(dirname "$0")/.." && pwd)
twin=$root/chapters/02_data_parallel/ddp_torch.py
python=/usr/bin/python3
if ! "$python" -c 'import torch' 2>/dev/null; then
  echo "cannot import torch with $python (apt-get install python3-torch): skipped"
  exit 77
fi

case $launcher in
  torchrun)
    chapter=02_data_parallel
    command=("$root/chapters/02_data_parallel/torchrun_local.sh" "$ranks" "$twin") ;;
  mpirun)
    chapter=05_multi_process
    # A port free now for rank 0's store: tests that run at once must not meet.
    MASTER_PORT=$("$python" -c 'import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])')
    export MASTER_PORT
    read -r -a mpirun_flags <<<"${MGPU_MPIRUN_FLAGS:-}"
    command=(mpirun -np "$ranks" ${mpirun_flags[@]+"${mpirun_flags[@]}"} -x MASTER_PORT
             "$python" "$twin" --chapter 05_multi_process) ;;
  *)
    echo "error: unknown launcher '$launcher' (torchrun or mpirun)" >&2
    exit 2 ;;
esac

rm -rf "${out:?}"
mkdir -p "$(dirname "$out")"
echo "== ${command[*]} --out $out $*"
status=0
"${command[@]}" --out "$out" "$@" >"$out.log" 2>&1 || status=$?
cat "$out.log"
flunk() {
  echo "FAILED: $*" >&2
  exit 1
}
((status == 0)) || flunk "exit status $status"

for ((r = 0; r < ranks; r++)); do
  grep -q "^rank $r: host " "$out.log" || flunk "no line 'rank $r: host ...'"
done
# The run's own settings, read back from the flags (the last one wins, as in argparse).
epochs=10 batch=256
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case ${args[i]} in
    --epochs) epochs=${args[i + 1]} ;;
    --batch-size) batch=${args[i + 1]} ;;
  esac
done
number='[0-9]+\.[0-9]+'
result="^result: chapter=${chapter}_torch backend=torch-(cpu|cuda) devices=$ranks epochs=$epochs batch=$batch lr=$number"
result+=" precision=fp32 test_acc=[01]\.[0-9]{4} sec_per_epoch=$number samples_per_sec=[0-9]+ first_epoch_sec=$number"
result+=" launcher=$launcher collective=(gloo|nccl)$"
grep -Eq "$result" "$out.log" || flunk "no result line matching '$result'"
# Its CSV, named after its settings and the number of processes, as its "wrote" line says.
csv=$(sed -n 's/^wrote \(.*\.csv\)$/\1/p' "$out.log" | tail -n 1)
[[ -n $csv ]] || flunk "no 'wrote ....csv' line"
[[ $(basename "$csv") == "${chapter}_torch"* ]] || flunk "$csv is not named after ${chapter}_torch"
if ((ranks > 1)); then
  [[ $csv == *"_devices-$ranks.csv" ]] || flunk "$csv does not say its $ranks processes (_devices-$ranks)"
fi
[[ -f $csv ]] || flunk "$csv was not written"
rows=$(($(wc -l <"$csv") - 1))
((rows == epochs)) || flunk "$csv has $rows rows, expected one per epoch ($epochs)"
echo "ddp twin: $launcher with $ranks processes: passed"
