#!/usr/bin/env bash
# gpu_check.sh: one command that checks every GPU path of this repository on the NVIDIA GPUs
# this machine has, and writes what it saw into one Markdown report. The checks are CTest
# tests: it configures and builds the cuda backend, runs the test suite, then the tests
# labelled "gpu" (tools/gpu_check/steps.cmake: every chapter on 1 GPU, on all GPUs, on logical
# devices sharing one GPU, the PyTorch twins, both allreduce benchmarks, chapter 10's kernel
# benchmark), one after another: seconds per epoch only compare when nothing else runs on the GPUs.
#
# Exit status: 0 everything passed, 1 something failed (the report says what), 2 a bad command
# line, 77 no GPU answers and --allow-no-gpu was not given ("not applicable", as the chapters),
# 130 interrupted (the report is still written).
set -euo pipefail
export LC_NUMERIC=C  # decimal points, whatever the user's locale
readonly program_name=gpu_check.sh
repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
readonly repo_root here=$repo_root/tools/gpu_check

usage() {
  cat <<EOF
usage: $program_name [options]
  builds the cuda backend and checks every GPU path on this machine's NVIDIA GPUs: the test
  suite, then ctest's "gpu" tests (every chapter on 1 GPU, on all GPUs and on 2 and 4 logical
  devices of one GPU, chapter 05 under mpirun, the PyTorch twins of chapters 01 and 09 where
  python3 has PyTorch with CUDA, both allreduce benchmarks, chapter 10's kernel benchmark);
  writes one Markdown report

options:
  --build-dir DIR   where to build (default build-gpu-check in the repository)
  --out DIR         where the report (gpu_check.md) and the logs (gpu_check/) go (default results/)
  --skip-build      use the build already in --build-dir as it is
  --cuda-archs LIST CUDA architectures to compile for, e.g. 80;90 (default native)
  --quick           short runs (2 epochs on 4096 images, benchmarks up to 1 MiB), not judged on
                    accuracy; without a GPU shorter still (1 epoch on 1024 images)
  --only LIST       only these parts, comma-separated: tests (the test suite) and chapter numbers
                    (01 to 10: its runs, twin and benchmark), e.g. --only tests,01,09; the build
                    always comes first
  --allow-no-gpu    where no GPU answers, run the same steps on the build's own backend instead
                    of exiting with status 77: this checks the script, not the GPUs
  --list-steps      print the name of every step, in order (a machine with 2 GPUs, mpirun and
                    PyTorch with CUDA), and exit
  --help            this text

exit status: 0 all passed, 1 a step failed, 2 a bad command line, 77 no GPU (without --allow-no-gpu)
EOF
}
refuse_command_line() { echo "$program_name: $1" >&2; usage >&2; exit 2; }
require_value() {  # option [value]: present, not empty, not another option
  [[ $# -ge 2 && -n "$2" ]] || refuse_command_line "$1 needs a value"
  [[ "$2" != --* ]] || refuse_command_line "$1 needs a value, got the option '$2'"
}

build_dir=$repo_root/build-gpu-check out_dir=$repo_root/results cuda_archs="" only=""
skip_build=no quick=no allow_no_gpu=no
while [[ $# -gt 0 ]]; do
  case "$1" in
    --help) usage; exit 0 ;;
    --build-dir) require_value "$@"; build_dir=$2; shift ;;
    --out) require_value "$@"; out_dir=$2; shift ;;
    --cuda-archs) require_value "$@"; cuda_archs=$2; shift ;;
    --only) require_value "$@"; only=$2; shift ;;
    --skip-build) skip_build=yes ;;
    --quick) quick=yes ;;
    --allow-no-gpu) allow_no_gpu=yes ;;
    --list-steps)  # configure, build and the suite, then the "gpu" tests as steps.cmake registers them
      printf '%s\n' configure build ctest
      cmake -P "$here/steps.cmake" 2>&1 | cut -f 1
      exit 0 ;;
    *) refuse_command_line "unknown option '$1'" ;;
  esac
  shift
done
for part in ${only//,/ }; do
  [[ "$part" == tests ]] || { [[ "$part" =~ ^[0-9][0-9]$ ]] && compgen -G "$repo_root/chapters/${part}_*/" >/dev/null; } ||
    refuse_command_line "--only: '$part' is neither 'tests' nor a chapter number (01 to 10)"
done
# The steps run from the repository root: paths given relative to here are made absolute.
build_dir=$(realpath -m -- "$build_dir") out_dir=$(realpath -m -- "$out_dir")
readonly report=$out_dir/gpu_check.md logs_dir=$out_dir/gpu_check

# --- Which GPUs answer: those nvidia-smi lists, or those CUDA_VISIBLE_DEVICES leaves ---------
gpu_count=0 gpu_problem=""
if ! command -v nvidia-smi >/dev/null; then
  gpu_problem="nvidia-smi not found"
elif ! listing=$(nvidia-smi -L 2>&1); then
  gpu_problem="nvidia-smi -L: $(head -n 1 <<<"$listing")"
elif ! gpu_count=$(grep -c '^GPU [0-9]*:' <<<"$listing"); then
  gpu_problem="nvidia-smi -L lists no GPU"
elif [[ -n "${CUDA_VISIBLE_DEVICES+set}" ]]; then
  gpu_count=$(tr ',' '\n' <<<"$CUDA_VISIBLE_DEVICES" | grep -c . || true)
  [[ "$gpu_count" -gt 0 ]] || gpu_problem="CUDA_VISIBLE_DEVICES is set but empty"
fi
mode=gpu
if [[ "$gpu_count" -eq 0 ]]; then
  if [[ "$allow_no_gpu" == no ]]; then
    echo "$program_name: no NVIDIA GPU answers ($gpu_problem); nothing to check" >&2
    echo "(--allow-no-gpu runs the same steps on the build's own backend, to check the script itself)" >&2
    exit 77
  fi
  mode=no-gpu
fi
if [[ "$skip_build" == yes && ! -f "$build_dir/CMakeCache.txt" ]]; then
  echo "$program_name: --skip-build, but $build_dir holds no build (no CMakeCache.txt); drop --skip-build to build there" >&2
  exit 1
fi

# --- Small helpers ------------------------------------------------------------------------
now() { date +%s.%N; }
seconds_since() { awk -v start="$1" -v end="$(now)" 'BEGIN { printf "%.1f", end - start }'; }
check_started=$(now)
cores=$(nproc)
# One value from the build's CMake cache ("" when the build or the value is missing).
cache_value() { sed -n "s/^$1:[A-Z]*=//p" "$build_dir/CMakeCache.txt" 2>/dev/null | head -n 1; }
# A command as a person would type it from the repository root.
command_text() {
  local word text=""
  for word in "$@"; do
    word=${word#"$repo_root"/}
    [[ "$word" =~ ^[A-Za-z0-9_./=:,@%+-]+$ ]] || word="'${word//\'/\'\\\'\'}'"
    text+="$word "
  done
  printf '%s' "${text% }"
}
# Whether --only chose a step: "ctest" is the part "tests", a chapter's steps start with its number.
selected() {
  local part=${1:0:2}
  [[ "$1" == ctest ]] && part=tests
  [[ -z "$only" || ! "$1" =~ ^([0-9][0-9]_|ctest$) || ",$only," == *",$part,"* ]]
}

# The Steps table's rows this script makes (the "gpu" tests write their own); every row is
# PASS, "FAIL: why" or "not run: why", and a step counts as passed only if it ran and passed.
rows=()
record_step() {  # name title command outcome exit seconds
  rows+=("| $1 | $2 | ${4//|//} | $5 | $6 | ${3:+\`$3\`} |")
  printf '[%6.1f s] %-34s %s (%s s)\n' "$(seconds_since "$check_started")" "$1" "$4" "$6"
}
# Runs a command from the repository root within a time limit (timeout ends a hung one, and
# everything it started). In the background, so that a Ctrl-C reaches this script at once.
running_pid="" run_status=0
run_limited() {  # limit command...
  (cd "$repo_root" && exec timeout --kill-after=10 "$@") &
  running_pid=$!
  run_status=0
  wait "$running_pid" || run_status=$?
  running_pid=""
}
# A command that is a step of its own, its output in gpu_check/<name>.log.
run_step() {  # name title limit command...
  local name=$1 title=$2 limit=$3 started outcome=PASS
  shift 3
  started=$(now)
  echo "\$ $(command_text "$@")" >"$logs_dir/$name.log"
  run_limited "$limit" "$@" >>"$logs_dir/$name.log" 2>&1
  if [[ "$run_status" -ne 0 ]]; then
    outcome="FAIL: exit $run_status: $(grep -iE 'error|fail' "$logs_dir/$name.log" | tail -n 1 | cut -c 1-200) (see the log)"
    [[ "$run_status" -ne 124 ]] || outcome="FAIL: timed out after $limit s (see the log)"
  fi
  record_step "$name" "$title" "$(command_text "$@")" "$outcome" "$run_status" "$(seconds_since "$started")"
}
failed() { [[ "${rows[-1]}" == *"| FAIL"* ]]; }

# --- The build ----------------------------------------------------------------------------
configure_and_build() {
  if [[ "$skip_build" == yes ]]; then
    record_step configure configure "" "not run: --skip-build: the build in $(command_text "$build_dir") is used as it is" "" 0.0
    record_step build build "" "not run: --skip-build" "" 0.0
  else
    local -a configure=(cmake -S "$repo_root" -B "$build_dir")
    # Without a GPU the backend is left to the build (cached, or auto: cpu). "native" compiles
    # for exactly the GPUs here, and the all-GPU steps are registered for as many as answer.
    if [[ "$mode" == gpu ]]; then
      configure+=(-DMGPU_BACKEND=cuda "-DMGPU_GPU_CHECK_GPUS=$gpu_count")
      if [[ -n "$cuda_archs" ]]; then configure+=("-DCMAKE_CUDA_ARCHITECTURES=$cuda_archs")
      elif [[ -z "${CUDAARCHS:-}" ]]; then configure+=(-DCMAKE_CUDA_ARCHITECTURES=native); fi
    fi
    run_step configure configure 900 "${configure[@]}"
    failed && return 1
    run_step build build 1800 cmake --build "$build_dir" -j "$cores"
    failed && return 1
  fi
  if [[ "$mode" == gpu && "$(cache_value MGPU_BUILT_BACKEND)" != cuda ]]; then
    record_step backend "the build's backend" "" "FAIL: $(command_text "$build_dir") is not a cuda build (backend $(cache_value MGPU_BUILT_BACKEND), asked for: $(cache_value MGPU_BACKEND)); drop --skip-build or give a cuda build" "" 0.0
    return 1
  fi
  local registered
  registered=$(cache_value MGPU_GPU_CHECK_GPUS)
  if [[ "$mode" == gpu && "$registered" != "$gpu_count" ]]; then
    record_step gpus "the GPUs the build's steps use" "" "FAIL: the build registered its all-GPU steps for ${registered:-?} GPU(s) and $gpu_count answer: configure it with -DMGPU_GPU_CHECK_GPUS=$gpu_count (or drop --skip-build)" "" 0.0
    return 1
  fi
}

# --- The test suite -----------------------------------------------------------------------
# Left out: the "gpu" tests (they run next, one by one), this script's own tests (gpu_check), and
# those that skip for reasons that say nothing about the GPUs: the comparisons with PyTorch
# (torch: they run Debian's /usr/bin/python3; the twins are "gpu" tests), the runs under SLURM
# (scheduler) and the offline kit's check (offline_kit). With one GPU, also the checks that need
# two (multi_gpu). Without a GPU only the *_help tests run, from tests/ so that their Testing/
# log does not land in that of a ctest that runs this script.
suite_command=()
run_test_suite() {
  local left_out='gpu|gpu_check|torch|scheduler|offline_kit' title="the whole test suite (ctest)"
  [[ "$gpu_count" -ge 2 ]] || left_out+='|multi_gpu'
  suite_command=(ctest --test-dir "$build_dir" --output-on-failure -j "$cores" -LE "^($left_out)\$")
  if [[ "$mode" == no-gpu ]]; then
    suite_command=(ctest --test-dir "$build_dir/tests" --output-on-failure -R '_help$' -LE gpu_check)
    title="a fast subset of the tests (no GPU)"
  fi
  local started log=$logs_dir/ctest.log outcome=PASS failed skipped
  started=$(now)
  echo "\$ $(command_text "${suite_command[@]}")" >"$log"
  run_limited 600 "${suite_command[@]}" >>"$log" 2>&1
  failed=$(lines_after "The following tests FAILED:" "$log" | grep -c . || true)
  skipped=$(lines_after "The following tests did not run:" "$log" | grep -c . || true)
  if grep -q 'No tests were found' "$log" || [[ ! -f "$build_dir/CTestTestfile.cmake" ]]; then
    outcome="FAIL: ctest found no tests (was doctest found when configuring? apt-get install doctest-dev)"
  elif [[ "$failed" -gt 0 ]]; then
    outcome="FAIL: $failed test(s) failed"
  elif [[ "$mode" == gpu && "$skipped" -gt 0 ]]; then
    outcome="FAIL: $skipped test(s) skipped: on a GPU machine every GPU test must run"
  elif [[ "$run_status" -eq 124 ]]; then
    outcome="FAIL: timed out after 600 s (see the log)"
  elif [[ "$run_status" -ne 0 ]] || ! grep -q 'tests passed, ' "$log"; then
    outcome="FAIL: exit $run_status (see the log)"
  fi
  record_step ctest "$title" "$(command_text "${suite_command[@]}")" "$outcome" "$run_status" "$(seconds_since "$started")"
}
# The lines of ctest's output under a heading such as "The following tests FAILED:".
lines_after() {  # heading log
  awk -v heading="$1" 'index($0, heading) == 1 { on = 1; next } on && /^\t/ { print; next } on { exit }' "$2"
}

# --- The "gpu" tests ------------------------------------------------------------------------
# PyTorch with CUDA, for the twins: the python3 on the PATH must import torch and see a CUDA
# device (status 3: it imports, but sees none). Where it does not, the twins are left out.
torch_found=no torch_note=""
find_torch() {
  local python out status=0
  if ! python=$(command -v python3); then torch_note="none: python3 not found"; return 0; fi
  out=$(timeout 120 "$python" -c 'import sys, torch
print(torch.__version__, "with CUDA", torch.version.cuda)
sys.exit(0 if torch.cuda.is_available() else 3)' 2>&1) || status=$?
  case "$status" in
    0) torch_found=yes torch_note="$(tail -n 1 <<<"$out") ($python)" ;;
    3) torch_note="none with CUDA: torch $(tail -n 1 <<<"$out") sees no CUDA device ($python)" ;;
    *) torch_note="none with CUDA: $python cannot import torch ($(tail -n 1 <<<"$out" | cut -c 1-160))" ;;
  esac
}

# Runs them with ctest, one at a time; each writes its rows next to its log (run_step.cmake).
# ctest's own lines (one a test, as it ends) show on the terminal and go to gpu_check/matrix.log.
run_gpu_tests() {
  gpu_tests_started=yes
  local -a ctest=(ctest --test-dir "$build_dir/tests" -L '^gpu$' -O "$logs_dir/matrix.log")
  [[ "$torch_found" == yes ]] || ctest+=(-LE '^twin$')
  [[ -z "$only" ]] || ctest+=(-R "^gpu\\.($(tr ',' '|' <<<"$only"))_")
  local backend=cuda
  [[ "$mode" == gpu ]] || backend=""
  MGPU_GPU_CHECK=$([[ "$quick" == yes ]] && echo quick || echo full) MGPU_GPU_CHECK_LOGS=$logs_dir \
    MGPU_GPU_CHECK_NO_GPU=$([[ "$mode" == no-gpu ]] && echo 1 || true) MGPU_GPU_CHECK_BACKEND=$backend \
    run_limited 14400 "${ctest[@]}" || true
  add_plan_rows all
}
# The "gpu" steps' rows, in the plan's order: each row a step wrote; where it wrote none, why.
# After an interruption, only the rows written.
gpu_tests_started=no
add_plan_rows() {  # all|interrupted
  local registered step title
  registered=$(ctest --test-dir "$build_dir/tests" -N -L '^gpu$' | sed -n 's/^ *Test *#[0-9]*: gpu\.//p')
  while IFS=$'\t' read -r step title; do
    selected "$step" || continue
    if [[ -f "$logs_dir/$step.row" ]]; then
      rows+=("$(cat "$logs_dir/$step.row")")
    elif [[ "$1" == interrupted || ( "$step" == *_torch* && "$torch_found" == no ) ]]; then
      continue
    elif ! grep -qx "$step" <<<"$registered"; then
      rows+=("| $step | $title | not run: $([[ "$mode" == gpu ]] && echo "this machine has $gpu_count GPU" || echo "no GPU") |  | 0.0 |  |")
    else
      rows+=("| $step | $title | FAIL: ctest ended it without an outcome (see gpu_check/matrix.log) |  |  |  |")
    fi
    [[ "$1" == interrupted ]] || awk -F ' [|] ' '{ printf "%-34s %s (%s s)\n", $1, $3, $5 }' <<<"${rows[-1]#| }"
  done < <(cmake -P "$here/steps.cmake" 2>&1)
  return 0
}

# --- The check ----------------------------------------------------------------------------
# shellcheck source=tools/gpu_check/report.sh
source "$here/report.sh"  # write_report, verdict and the machine's facts

# Ctrl-C (or a TERM, or a HUP when the terminal or the ssh session goes) still leaves a report
# of what ran so far, and stops the step that runs, instead of leaving it orphaned. (Functions end with `return 0`,
# never a bare `return`: run from a trap, that returns the interrupted wait's 130 or 143.)
# shellcheck disable=SC2317  # (run by the trap)
interrupted() {
  echo >&2
  if [[ -n "$running_pid" ]]; then
    kill -TERM "$running_pid" 2>/dev/null || true  # timeout passes it on to the whole run
    wait "$running_pid" 2>/dev/null || true
  fi
  [[ "$gpu_tests_started" == no ]] || add_plan_rows interrupted
  record_step interrupted "the check was interrupted" "" "FAIL: interrupted" "" 0.0
  write_report
  echo "report (incomplete): $(command_text "$report")" >&2
  exit 130
}

rm -rf -- "$logs_dir"
mkdir -p -- "$logs_dir"
if [[ "$mode" == gpu ]]; then
  echo "$program_name: $gpu_count GPU(s) answer; checking $(command_text "$build_dir"), report in $(command_text "$report")"
else
  echo "$program_name: no GPU answers ($gpu_problem); --allow-no-gpu: running the cpu-side steps on $(command_text "$build_dir"). This is NOT a GPU validation."
fi
trap interrupted INT TERM HUP
find_torch
if configure_and_build; then
  if selected ctest; then run_test_suite; fi
  run_gpu_tests
fi
write_report
echo "report: $(command_text "$report")"
verdict
failures=$(printf '%s\n' "${rows[@]}" | awk -F ' [|] ' '$3 ~ /^FAIL/ { printf "  failed: %s: %s\n", substr($1, 3), substr($3, 7) }')
[[ -z "$failures" ]] || { echo "$failures"; exit 1; }
