#!/usr/bin/env bash
# resnet_speed_check.sh: ResNet-18's speed on one NVIDIA GPU, ours against PyTorch, in about ten
# minutes: the run chapter 10's tensor-core section is measured with (its README, "The tensor
# cores", holds the predictions written before the first run and the figures after).
#
#   source offline-kit/env.sh && tools/resnet_speed_check.sh [--build-dir DIR] [--out DIR]
#
# In order, each step's log under --out:
#   1. stamp      the commit (git log -1), the GPU and driver (nvidia-smi), nvcc's version
#   2. build      the cuda backend for this GPU (native), only what the steps run
#   3. tests      test_implicit_gemm (the mma.sync kernels against chapter 09 on bf16-rounded
#                 inputs) and test_resnet's "layer kernels" cases (every table, one network step)
#   4. sanitizer  compute-sanitizer memcheck and racecheck over test_implicit_gemm's small cases
#   5. profile    one training step of 256 images, kernel by kernel, with raw and with tensor
#   6. runs       09_resnet with d2l's recipe: fp32, tf32, bf16 on raw's kernels and bf16 on
#                 tensor's, queued and as one CUDA graph a step (--graph on); the PyTorch twin
#                 (chapter 09's resnet_torch.py) in fp32, tf32, bf16.
#                 The two bf16 runs that are compared for accuracy train 10 epochs, the others
#                 --epochs (default 4): seconds per epoch are the mean of epoch 2 onwards
#   7. table      printed last: seconds per epoch, peak memory (the programs' own count:
#                 peak_mib, PyTorch's max_memory_allocated), test accuracy (mean, range and
#                 best of epochs 5-10 where there are 10)
#
# Exit status: 0 every step ran and passed, 1 a step failed (the table says which), 2 a bad
# command line, 77 no GPU answers.
set -uo pipefail
export LC_NUMERIC=C
readonly program_name=resnet_speed_check.sh
repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
readonly repo_root

usage() {
  cat <<EOF
usage: $program_name [--build-dir DIR] [--out DIR] [--epochs N] [--skip-build]
  builds what ResNet-18's speed runs need (cuda backend, this GPU's architecture), tests the
  tensor-core convolution on the GPU, runs compute-sanitizer over its small cases, profiles one
  step, times ours and the PyTorch twin in fp32, tf32 and bf16, and prints a table last
  --build-dir DIR  where to build (default build-speed in the repository)
  --out DIR        logs, CSVs and the table (default results/speed)
  --epochs N       epochs of the timing-only runs (default 4; the bf16 comparison trains 10)
  --skip-build     use --build-dir as it is
exit status: 0 all passed, 1 a step failed, 2 a bad command line, 77 no GPU
EOF
}
refuse() { echo "$program_name: $1" >&2; usage >&2; exit 2; }

build_dir=$repo_root/build-speed out_dir=$repo_root/results/speed epochs=4 skip_build=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --build-dir) [[ $# -ge 2 && -n "$2" && "$2" != --* ]] || refuse "--build-dir needs a value"; build_dir=$2; shift ;;
    --out) [[ $# -ge 2 && -n "$2" && "$2" != --* ]] || refuse "--out needs a value"; out_dir=$2; shift ;;
    --epochs)
      [[ $# -ge 2 && "$2" =~ ^[1-9][0-9]*$ ]] || refuse "--epochs needs a positive integer, got '${2:-}'"
      epochs=$2; shift ;;
    --skip-build) skip_build=1 ;;
    --help | -h) usage; exit 0 ;;
    *) refuse "unknown option '$1'" ;;
  esac
  shift
done
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "$program_name: no NVIDIA GPU answers (nvidia-smi): nothing to measure" >&2
  exit 77
fi
mkdir -p "$out_dir" || refuse "--out: cannot make $out_dir"
out_dir=$(cd "$out_dir" && pwd)
results=()  # "step|status|note" rows for the table
failed=0
record() { results+=("$1|$2|$3"); [[ $2 == PASS ]] || failed=1; }
# Runs "$@" with its output in $out_dir/<name>.log; records PASS or FAIL (the exit status).
step() {
  local name=$1; shift
  local started=$SECONDS
  if "$@" >"$out_dir/$name.log" 2>&1; then record "$name" PASS "$((SECONDS - started)) s"
  else record "$name" FAIL "status $?, $((SECONDS - started)) s: $out_dir/$name.log"; fi
}

# 1. stamp
{
  git -C "$repo_root" log -1 --format='commit %H %cd %s' 2>&1
  git -C "$repo_root" status --short | sed 's/^/changed: /'
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  nvcc --version | tail -2
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1
  date -u +%FT%TZ
} >"$out_dir/stamp.txt"
cat "$out_dir/stamp.txt"

# 2. build
bin=$build_dir/bin tests=$build_dir/tests
if [[ $skip_build == 0 ]]; then
  generator=()
  command -v ninja >/dev/null && generator=(-G Ninja)
  step configure cmake -S "$repo_root" -B "$build_dir" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DMGPU_BACKEND=cuda -DCMAKE_CUDA_ARCHITECTURES=native
  step build cmake --build "$build_dir" -j "$(nproc)" --target test_implicit_gemm test_resnet 09_resnet
fi

# 3. tests on the GPU, 4. the sanitizers on the small cases
step test_implicit_gemm "$tests/test_implicit_gemm"
step test_resnet_layer_kernels "$tests/test_resnet" "--test-case=layer kernels*"
if command -v compute-sanitizer >/dev/null; then
  for tool in memcheck racecheck; do
    step "sanitizer_$tool" compute-sanitizer --tool "$tool" --error-exitcode 1 "$tests/test_implicit_gemm" \
      "--test-case=implicit GEMM: forward*"
  done
else
  record sanitizer "not run" "compute-sanitizer not found"
fi

# 5. one step, kernel by kernel (before a one-step training run: --profile runs first)
for kernels in raw tensor; do
  step "profile_$kernels" "$bin/09_resnet" --precision bf16 --kernels "$kernels" --profile on --epochs 1 \
    --limit-train 256 --progress off --out "$out_dir/csv" --run-name "profile_$kernels"
done

# 6. the runs: ours, then the twin's, one after another
ours() {  # name epochs precision kernels [more flags]
  step "ours_$1" "$bin/09_resnet" --epochs "$2" --precision "$3" --kernels "$4" "${@:5}" --progress off \
    --out "$out_dir/csv" --run-name "ours_$1"
}
twin() {  # name epochs precision
  step "twin_$1" python3 "$repo_root/chapters/09_resnet/resnet_torch.py" --device cuda --epochs "$2" \
    --precision "$3" --out "$out_dir/csv" --run-name "twin_$1"
}
ours bf16_tensor 10 bf16 tensor
ours bf16_tensor_graph "$epochs" bf16 tensor --graph on
twin bf16 10 bf16
ours bf16_raw "$epochs" bf16 raw
ours tf32_raw "$epochs" tf32 raw
ours fp32_raw "$epochs" fp32 raw
twin tf32 "$epochs" tf32
twin fp32 "$epochs" fp32

# 7. the table
python3 - "$out_dir" "${results[@]}" <<'EOF' | tee "$out_dir/table.md"
import csv, re, statistics, sys
from pathlib import Path
out = Path(sys.argv[1])
rows = [r.split("|", 2) for r in sys.argv[2:]]
print("\n| step | status | note |\n|---|---|---|")
for name, status, note in rows:
    print(f"| {name} | {status} | {note} |")
print("\n| run | epochs | s/epoch (2 on) | peak MiB | test acc mean 5-10 (range) | best |\n|---|---|---|---|---|---|")
for name, status, _ in rows:
    if not name.startswith(("ours_", "twin_")):
        continue
    path, log = out / "csv" / f"{name}.csv", out / f"{name}.log"
    peak = re.search(r"peak_mib=(\S+)", log.read_text(errors="replace")) if log.exists() else None
    if status != "PASS" or not path.exists():
        print(f"| {name} | - | {status} | - | - | - |")
        continue
    epochs = list(csv.DictReader(path.open()))
    secs = [float(e["seconds"]) for e in epochs[1:]] or [float(epochs[0]["seconds"])]
    accs = [float(e["test_acc"]) for e in epochs]
    late = accs[4:10]
    acc = f"{statistics.mean(late):.4f} ({min(late):.4f}-{max(late):.4f})" if len(accs) >= 10 else "-"
    print(f"| {name} | {len(epochs)} | {statistics.mean(secs):.3f} | {peak.group(1) if peak else '-'} | {acc} | "
          f"{max(accs):.4f} |")
EOF
exit $failed
