#!/usr/bin/env bash
# gpu_check.sh: one command that checks every GPU path of this repository on the NVIDIA GPUs
# this machine has, and writes what it saw into one Markdown report.
#
#   tools/gpu_check.sh            configure and build the cuda backend, run the whole test suite,
#                                 run every chapter on 1 GPU, on all GPUs, and with 2 and 4
#                                 devices on one GPU, the PyTorch twins of chapters 01 and 09
#                                 (where python3 has PyTorch with CUDA), both allreduce benchmarks
#   tools/gpu_check.sh --quick    the same with short runs
#   tools/gpu_check.sh --list-steps   the names of the steps, in order (tools/README.md's table)
#   tools/gpu_check.sh --help     the options
#
# Exit status: 0 everything passed, 1 something failed (the report says what), 2 a bad command
# line, 77 no GPU answers and --allow-no-gpu was not given ("not applicable", as the chapters).
#
# The steps run one after another, never side by side: the seconds per epoch they report are
# only worth comparing when nothing else ran on the GPUs at the same time.
set -euo pipefail
# Decimal points, whatever the user's locale: the times below are computed with printf and awk.
export LC_NUMERIC=C

readonly program_name=gpu_check.sh
# Associative arrays and empty arrays under `set -u` need bash 4.4 or newer.
if ((BASH_VERSINFO[0] < 4 || (BASH_VERSINFO[0] == 4 && BASH_VERSINFO[1] < 4))); then
  echo "$program_name: needs bash 4.4 or newer (this is $BASH_VERSION)" >&2
  exit 1
fi
# The repository: this script lives in its tools/ folder.
repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
readonly repo_root

# A training run must end above this test accuracy in a full run (d2l's defaults). Chance is
# 0.10 and d2l's own runs end between 0.75 and 0.84: a run below 0.5 did not learn, whatever
# its exit status says. Short runs (--quick) are not judged: LeNet sits at chance for about
# two epochs of the full training set.
readonly min_test_acc=0.50
# No step may take longer than this: a collective that waits forever (a rank that never
# joins) must end the check with a failure, not hang it.
readonly step_time_limit=300
readonly test_suite_time_limit=600

usage() {
  cat <<EOF
usage: $program_name [options]
  builds the cuda backend and checks every GPU path on this machine's NVIDIA GPUs: the test
  suite, every chapter on 1 GPU, on all GPUs and with 2 and 4 devices on one GPU, chapter 05
  under mpirun, the PyTorch twins of chapters 01 and 09 beside them (where python3 has PyTorch
  with CUDA), both allreduce benchmarks; writes one Markdown report

options:
  --build-dir DIR   where to build (default build-gpu-check in the repository)
  --out DIR         where the report (gpu_check.md) and the logs (gpu_check/) go (default
                    results/ in the repository)
  --skip-build      use the build already in --build-dir as it is
  --cuda-archs LIST CUDA architectures to compile for, e.g. 80;90 (default native: this
                    machine's GPUs; CMake's CUDAARCHS environment variable works too)
  --quick           short runs (2 epochs on 4096 images, benchmarks up to 1 MiB) instead of
                    d2l's defaults; without a GPU shorter still (1 epoch on 1024 images)
  --only LIST       only these parts, comma-separated: tests (the test suite) and chapter
                    numbers (01 to 09: that chapter's runs, twin and benchmark), e.g. --only tests,01,09;
                    to split the check over several shorter runs (a job's time limit). The build
                    always comes first (with --skip-build, the one in --build-dir is used)
  --allow-no-gpu    where no GPU answers, run the same steps on the build's own backend (normally
                    cpu) instead of exiting with status 77; GPU-only steps are then "not run".
                    This checks the script, not the GPUs.
  --list-steps      print the name of every step the check can run, in order, one a line (those
                    of a machine with 2 or more GPUs and PyTorch with CUDA), and exit; runs nothing
  --help            this text

exit status: 0 all passed, 1 a step failed, 2 a bad command line, 77 no GPU (without --allow-no-gpu)
EOF
}

# A refused command line: the reason, then the usage, both on stderr, and status 2.
refuse_command_line() {
  echo "$program_name: $1" >&2
  usage >&2
  exit 2
}

# --- The command line ---------------------------------------------------------------------
build_dir="$repo_root/build-gpu-check"
out_dir="$repo_root/results"
skip_build=no
quick=no
allow_no_gpu=no
list_steps=no
cuda_archs=""
only=""  # the parts to run, ",tests,01,09,"; empty: all of them

# An option that takes a value must have one: not missing, not empty, not another option.
require_value() {  # option [value]
  if [[ $# -lt 2 || -z "$2" ]]; then
    refuse_command_line "$1 needs a value"
  fi
  if [[ "$2" == --* ]]; then
    refuse_command_line "$1 needs a value, got the option '$2'"
  fi
}

parse_command_line() {
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
      --list-steps) list_steps=yes ;;
      *) refuse_command_line "unknown option '$1'" ;;
    esac
    shift
  done
  if [[ -n "$only" ]]; then
    local part
    local -a parts
    IFS=',' read -ra parts <<<"$only"
    for part in "${parts[@]}"; do
      if [[ "$part" != tests ]] && ! { [[ "$part" =~ ^[0-9][0-9]$ ]] && compgen -G "$repo_root/chapters/${part}_*/" >/dev/null; }; then
        refuse_command_line "--only: '$part' is neither 'tests' nor a chapter number (01 to 09)"
      fi
    done
    only=",$only,"
  fi
  # The programs run from the repository root (where they find data/), so every path the user
  # gave relative to where they stand is made absolute first.
  build_dir=$(realpath -m -- "$build_dir")
  out_dir=$(realpath -m -- "$out_dir")
}

parse_command_line "$@"

readonly report="$out_dir/gpu_check.md"
readonly logs_dir="$out_dir/gpu_check"  # one <step>.log per step, and each run's CSVs and plots

# --- Small helpers ------------------------------------------------------------------------
now() { date +%s.%N; }
seconds_since() { awk -v start="$1" -v end="$(now)" 'BEGIN { printf "%.1f", end - start }'; }
check_started=$(now)

# One value from the build's CMake cache ("" when the build or the value is missing). Read it
# after configuring: before, a new build folder has no cache yet.
cache_value() {
  local cache="$build_dir/CMakeCache.txt"
  [[ -f "$cache" ]] || return 0
  sed -n "s/^$1:[A-Z]*=//p" "$cache" | head -n 1
}

# The backend the build compiles, cpu or cuda ("" if unknown). cmake/Backend.cmake caches it as
# MGPU_BUILT_BACKEND: the cached MGPU_BACKEND is what was asked for, which may be "auto". (A
# build configured before that entry existed still says cpu or cuda there when one was asked for.)
built_backend() {
  local backend
  backend=$(cache_value MGPU_BUILT_BACKEND)
  [[ -n "$backend" ]] || backend=$(cache_value MGPU_BACKEND)
  if [[ "$backend" == cpu || "$backend" == cuda ]]; then
    echo "$backend"
  fi
}

# A command as a person would type it from the repository root: paths inside the repository
# are shortened, and each word is quoted only where the shell needs it.
command_text() {
  local word text=""
  for word in "$@"; do
    word=${word#"$repo_root"/}
    if [[ ! "$word" =~ ^[A-Za-z0-9_./=:,@%+-]+$ ]]; then
      word="'${word//\'/\'\\\'\'}'"  # in single quotes, each ' written as '\''
    fi
    text+="$word "
  done
  printf '%s' "${text% }"
}

# --- Which GPUs answer --------------------------------------------------------------------
# gpu_count: the GPUs CUDA programs will see; first_gpu: the one "on one GPU" runs use;
# gpu_problem: why none answers, for the message.
gpu_count=0
first_gpu=""
gpu_problem=""
find_gpus() {
  local listing
  if ! command -v nvidia-smi >/dev/null 2>&1; then
    gpu_problem="nvidia-smi not found"
    return 0
  fi
  if ! listing=$(nvidia-smi -L 2>&1); then
    gpu_problem="nvidia-smi -L: $(head -n 1 <<<"$listing")"
    return 0
  fi
  gpu_count=$(grep -c '^GPU [0-9]*:' <<<"$listing" || true)
  if [[ "$gpu_count" -eq 0 ]]; then
    gpu_problem="nvidia-smi -L lists no GPU"
    return 0
  fi
  first_gpu=0
  # CUDA_VISIBLE_DEVICES, where set, decides what CUDA programs see: honour it.
  if [[ -n "${CUDA_VISIBLE_DEVICES+set}" ]]; then
    local -a visible
    IFS=',' read -ra visible <<<"$CUDA_VISIBLE_DEVICES"
    gpu_count=${#visible[@]}
    first_gpu=${visible[0]:-}
    if [[ "$gpu_count" -eq 0 ]]; then
      gpu_problem="CUDA_VISIBLE_DEVICES is set but empty"
    fi
  fi
}

if [[ "$list_steps" == yes ]]; then
  # The plan of a machine where every step runs: two GPUs (the "all GPUs" steps), mpirun, and
  # PyTorch with CUDA (the twins). Nothing is run or looked up.
  gpu_count=2
  first_gpu=0
  mode=gpu
else
  find_gpus
  if [[ "$gpu_count" -gt 0 ]]; then
    mode=gpu
  elif [[ "$allow_no_gpu" == yes ]]; then
    mode=no-gpu
  else
    echo "$program_name: no NVIDIA GPU answers ($gpu_problem); nothing to check" >&2
    echo "(--allow-no-gpu runs the same steps on the build's own backend, to check the script itself)" >&2
    exit 77
  fi
fi
readonly mode gpu_count first_gpu

if [[ "$list_steps" == no && "$skip_build" == yes && ! -f "$build_dir/CMakeCache.txt" ]]; then
  echo "$program_name: --skip-build, but $build_dir holds no build (no CMakeCache.txt); drop --skip-build to build there" >&2
  exit 1
fi

cores=$(nproc)
readonly cores

# --- Where the steps' outcomes are kept, for the report -----------------------------------
# One entry per step, in the order they ran. An outcome is PASS, "FAIL: why" or "not run: why";
# a step is never counted as passed unless it ran and passed.
step_names=()
step_titles=()
step_commands=()
step_outcomes=()
step_exits=()
step_seconds=()
training_rows=()      # one Markdown row per "result:" line of a training program
benchmark_sections=() # one Markdown section per benchmark: its tables
test_suite_section="" # what ctest said
configure_report=""   # the build's configure report, when this script configured it
failures=0
not_run=0

record_step() {  # name title command outcome exit seconds
  set -- "$1" "$2" "$3" "${4//|//}" "$5" "$6"  # a | would end the report's table cell
  step_names+=("$1")
  step_titles+=("$2")
  step_commands+=("$3")
  step_outcomes+=("$4")
  step_exits+=("$5")
  step_seconds+=("$6")
  case "$4" in
    FAIL*) failures=$((failures + 1)) ;;
    "not run"*) not_run=$((not_run + 1)) ;;
  esac
  printf '[%6.1f s] %-34s %s (%s s)\n' "$(seconds_since "$check_started")" "$1" "$4" "$6"
}

# Whether a step is among the parts --only chose: the test suite's step is "ctest", a chapter's
# steps are named after its number ("09_resnet_1dev", "03_allreduce_bench"), and the others
# (configure, build) always belong.
selected() {  # step name
  local part
  case "$1" in
    ctest) part=tests ;;
    [0-9][0-9]_*) part=${1:0:2} ;;
    *) return 0 ;;
  esac
  [[ -z "$only" || "$only" == *",$part,"* ]]
}

# With --list-steps a step only says its name, and is not run (status 0: "listed, skip it").
listed() {  # name
  [[ "$list_steps" == yes ]] || return 1
  echo "$1"
}

# A step that is not run, and why (no GPU, one GPU only, --skip-build, ...).
skip_step() {  # name title reason
  selected "$1" || return 0
  listed "$1" && return 0
  record_step "$1" "$2" "" "not run: $3" "" "0.0"
}

# Runs one command with its whole output in logs_dir/<name>.log, within a time limit.
# Sets run_status (the exit status; 124 when the limit ended it) and run_seconds.
run_status=0
run_seconds=0
run_limit=0
running_pid=""  # the run in progress (its timeout process), for interrupted
run_logged() {  # name limit_seconds command...
  local name=$1 limit=$2
  shift 2
  run_limit=$limit
  local log="$logs_dir/$name.log" started
  echo "\$ $(command_text "$@")" >"$log"
  started=$(now)
  if [[ -t 1 ]]; then  # on a terminal, say what runs now; record_step's line overwrites it
    printf '[%6.1f s] %-34s ...\r' "$(seconds_since "$check_started")" "$name"
  fi
  # The programs run from the repository root, as the tests do. `timeout` ends a hung run
  # (SIGTERM to the run and everything it started, then SIGKILL 10 s later). It runs in the
  # background and the script waits for it, so that Ctrl-C reaches the script at once (see
  # interrupted), which then ends the run through timeout.
  (cd "$repo_root" && exec timeout --kill-after=10 "$limit" "$@") >>"$log" 2>&1 &
  running_pid=$!
  if wait "$running_pid"; then
    run_status=0
  else
    run_status=$?
  fi
  running_pid=""
  run_seconds=$(seconds_since "$started")
}

# Why a run that did not exit with 0 failed, in words, with the line of its log that says why:
# the last one a program of this repository printed about itself ("05_multi_process: rank 1:
# error: ..."), or else the last that speaks of an error (a compiler's, mpirun's, ctest's).
status_problem() {  # status log
  local why last_error
  case "$1" in
    124 | 137) why="timed out after ${run_limit} s" ;;
    77) why="exit 77: not applicable in this build" ;;
    *) why="exit $1" ;;
  esac
  last_error=$(grep -E '^[0-9][0-9]_[a-z_]+: ' "$2" | tail -n 1 | cut -c 1-200 || true)
  if [[ -z "$last_error" ]]; then
    last_error=$(grep -iE 'error|fail|abort' "$2" | tail -n 1 | cut -c 1-200 || true)
  fi
  if [[ -n "$last_error" ]]; then
    why+=": $last_error"
  fi
  echo "$why (see the log)"
}

# In the no-GPU mode a cuda build stops at "no GPU answers": that run could not happen here.
no_gpu_answered() {  # log
  if [[ "$mode" == no-gpu ]] && grep -q 'no GPU answers' "$1"; then
    return 0
  fi
  return 1
}

# --- The build ----------------------------------------------------------------------------
# Sets build_ok to yes when there is a build to check (built now, or given with --skip-build).
build_ok=no
configure_and_build() {
  if [[ "$list_steps" == yes && "$skip_build" == no ]]; then
    listed configure
    listed build
    build_ok=yes
    return 0
  fi
  if [[ "$skip_build" == yes ]]; then
    skip_step configure "configure" "--skip-build: the build in $(command_text "$build_dir") is used as it is"
    skip_step build "build" "--skip-build"
  else
    local -a configure=(cmake -S "$repo_root" -B "$build_dir")
    if [[ "$mode" == gpu ]]; then
      configure+=(-DMGPU_BACKEND=cuda)
      # "native" compiles for exactly the GPUs that answer here: the fastest build, and the
      # code that runs is the code compiled for these GPUs (no PTX compiled at load time).
      if [[ -n "$cuda_archs" ]]; then
        configure+=("-DCMAKE_CUDA_ARCHITECTURES=$cuda_archs")
      elif [[ -z "${CUDAARCHS:-}" ]]; then
        configure+=(-DCMAKE_CUDA_ARCHITECTURES=native)
      fi
    fi
    # Without a GPU the backend is left to the build (cached, or "auto", which picks cpu):
    # a cuda build for "native" architectures cannot be configured where no GPU answers.
    run_logged configure 900 "${configure[@]}"
    configure_report=$(awk '/mgpu configuration/ { on = 1 } on && /^-- *$/ { exit } on { sub(/^-- /, ""); print }' \
                         "$logs_dir/configure.log")
    if [[ "$run_status" -ne 0 ]]; then
      record_step configure "configure" "$(command_text "${configure[@]}")" \
        "FAIL: $(status_problem "$run_status" "$logs_dir/configure.log")" "$run_status" "$run_seconds"
      return 0
    fi
    record_step configure "configure" "$(command_text "${configure[@]}")" PASS 0 "$run_seconds"

    local -a build=(cmake --build "$build_dir" -j "$cores")
    run_logged build 1800 "${build[@]}"
    if [[ "$run_status" -ne 0 ]]; then
      record_step build "build" "$(command_text "${build[@]}")" \
        "FAIL: $(status_problem "$run_status" "$logs_dir/build.log")" \
        "$run_status" "$run_seconds"
      return 0
    fi
    record_step build "build" "$(command_text "${build[@]}")" PASS 0 "$run_seconds"
  fi
  # A GPU check of a cpu build would check nothing: say so before spending any time.
  if [[ "$list_steps" == no && "$mode" == gpu && "$(built_backend)" == cpu ]]; then
    record_step backend "the build's backend" "" \
      "FAIL: $(command_text "$build_dir") is a cpu build (backend cpu, asked for: $(cache_value MGPU_BACKEND)); drop --skip-build or give a cuda build" \
      "" "0.0"
    return 0
  fi
  build_ok=yes
}

# --- The test suite -----------------------------------------------------------------------
# The lines of ctest's output that follow a heading such as "The following tests FAILED:".
lines_after() {  # heading log
  awk -v heading="$1" 'index($0, heading) == 1 { on = 1; next } on && /^\t/ { print; next } on { exit }' "$2"
}

run_test_suite() {
  selected ctest || return 0
  listed ctest && return 0
  local title="the whole test suite (ctest)"
  # Left out: this script's own tests (label gpu_check), and those that skip for reasons that
  # say nothing about the GPUs: the comparisons with PyTorch (label torch: they run Debian's
  # /usr/bin/python3, seldom the one with PyTorch on a GPU machine; the twins run as steps of
  # their own, with the python3 on the PATH: run_torch_twins), the runs under SLURM (label scheduler: without SLURM, or not as root) and
  # the offline kit's check (label offline_kit: without root or Debian's registry). CI runs them.
  # With one GPU, also the checks that mean two (label multi_gpu: they skip, saying so).
  local left_out='gpu_check|torch|scheduler|offline_kit'
  local multi_note=""
  if [[ "$gpu_count" -lt 2 ]]; then
    left_out+='|multi_gpu'
    multi_note=" With one GPU, also the checks that need two (label \`multi_gpu\`: chapter 04's exercise)."
  fi
  local -a ctest=(ctest --test-dir "$build_dir" --output-on-failure -j "$cores" -LE "^($left_out)\$")
  local note="The whole suite but this script's own tests (label \`gpu_check\`), the PyTorch comparisons (label \`torch\`: they run \`/usr/bin/python3\`; the twins run as steps of their own), the runs under SLURM (label \`scheduler\`) and the offline kit's check (label \`offline_kit\`); on a GPU machine no test may fail or be skipped.$multi_note"
  if [[ "$mode" == no-gpu ]]; then
    # Without a GPU only a fast subset runs (each program's --help): enough to show that
    # ctest's report is read right; the whole suite is the build's own business. It runs from
    # the tests/ folder so that its Testing/ log lands there: this script itself may be running
    # as one of the suite's tests, and must not write into that ctest's log.
    ctest=(ctest --test-dir "$build_dir/tests" --output-on-failure -R '_help$' -LE gpu_check)
    title="a fast subset of the tests (no GPU)"
    note="No GPU: only a fast subset ran (the tests named *_help), to check that ctest's report is read right. This is not the test suite's verdict."
  fi
  if [[ ! -f "$build_dir/CTestTestfile.cmake" ]]; then
    local why="the build has no tests: CMake did not find doctest when configuring. Install it (Debian/Ubuntu: apt-get install doctest-dev; elsewhere the doctest package, or -Ddoctest_DIR=...) and configure again"
    test_suite_section="**FAIL**: $why."
    record_step ctest "$title" "$(command_text "${ctest[@]}")" "FAIL: $why" "" "0.0"
    return 0
  fi
  run_logged ctest "$test_suite_time_limit" "${ctest[@]}"
  local log="$logs_dir/ctest.log" failed skipped summary outcome=PASS
  summary=$(grep -E 'tests passed, [0-9]+ tests? failed out of' "$log" || true)
  failed=$(lines_after "The following tests FAILED:" "$log")
  skipped=$(lines_after "The following tests did not run:" "$log")
  if grep -q 'No tests were found' "$log"; then
    outcome="FAIL: ctest found no tests (was doctest found when configuring? apt-get install doctest-dev)"
  elif [[ -n "$failed" ]]; then
    outcome="FAIL: $(grep -c . <<<"$failed") test(s) failed"
  elif [[ "$mode" == gpu && -n "$skipped" ]]; then
    outcome="FAIL: $(grep -c . <<<"$skipped") test(s) skipped: on a GPU machine every GPU test must run"
  elif [[ "$run_status" -ne 0 || -z "$summary" ]]; then
    outcome="FAIL: $(status_problem "$run_status" "$log")"
  fi
  record_step ctest "$title" "$(command_text "${ctest[@]}")" "$outcome" "$run_status" "$run_seconds"
  test_suite_section="$note"$'\n\n'"\`$(command_text "${ctest[@]}")\`: ${summary:-no summary line}"
  if [[ -n "$failed" ]]; then
    test_suite_section+=$'\n\nFailed:\n\n```\n'"$failed"$'\n```'
  fi
  if [[ -n "$skipped" ]]; then
    test_suite_section+=$'\n\nDid not run (skipped):\n\n```\n'"$skipped"$'\n```'
  fi
}

# --- The training programs ----------------------------------------------------------------
# Every training program ends each run with one line of key=value pairs:
#   result: chapter=01_lenet backend=cpu devices=1 epochs=10 ... test_acc=0.8312 sec_per_epoch=3.91 ...
# (chapters 02-04 train several times in one program, and print one such line per training).
# Turns each into a row of the report's training table and checks it; what is wrong goes into
# result_problems ("" when nothing is).
result_problems=""
read_result_lines() {  # step log
  local step=$1 log=$2 line pair run="" problems=""
  local -A value
  while IFS= read -r line; do
    # The CSV a training wrote just before its result line names that training
    # ("wrote results/02_data_parallel_k2.csv" -> 02_data_parallel_k2).
    if [[ "$line" =~ ^wrote\ (.*)\.csv$ ]]; then
      run=$(basename "${BASH_REMATCH[1]}")
      continue
    fi
    [[ "$line" == "result: "* ]] || continue
    value=()
    local -a pairs
    read -ra pairs <<<"${line#result: }"
    for pair in "${pairs[@]}"; do
      if [[ "$pair" == *=* ]]; then
        value["${pair%%=*}"]="${pair#*=}"
      fi
    done
    # Keys this table has no column for (new ones may come) still appear, in the last column.
    local other=""
    for pair in "${pairs[@]}"; do
      case "${pair%%=*}" in
        chapter | backend | devices | epochs | test_acc | sec_per_epoch | samples_per_sec | batch | lr) ;;
        *) other+="$pair " ;;
      esac
    done
    local acc=${value[test_acc]:-}
    training_rows+=("| $step | ${run:-${value[chapter]:-?}} | ${value[backend]:-?} | ${value[devices]:-?} | ${value[epochs]:-?} | ${acc:-?} | ${value[sec_per_epoch]:-?} | ${value[samples_per_sec]:-?} | ${other% } |")
    if ! [[ "$acc" =~ ^[0-9]+(\.[0-9]+)?$ ]]; then
      problems+="${run:-a run}: test_acc '${acc}' is not a number; "
    elif [[ "$quick" == no ]] && awk -v a="$acc" -v m="$min_test_acc" 'BEGIN { exit !(a < m) }'; then
      problems+="${run:-a run}: test_acc $acc is below $min_test_acc (did not learn); "
    fi
    if [[ "$mode" == gpu && "${value[backend]:-}" != cuda ]]; then
      problems+="${run:-a run}: ran on the '${value[backend]:-?}' backend, not cuda; "
    fi
    run=""
  done <"$log"
  result_problems=${problems%; }
}

# Why a program is missing from the build, where CMake says why it left it out.
not_built() {  # program
  local why
  why="$(command_text "$1") was not built"
  case "$(basename "$1")" in
    04_*) why+=" (a cuda build leaves chapter 04 out where CMake found no NCCL: see the configure report)" ;;
    05_*) why+=" (chapter 05 is left out where CMake found no MPI: see the configure report)" ;;
  esac
  echo "$why"
}

# A training program, from start to its result lines. $1: the step's name (and log's);
# $2: what it checks, in words; then the command.
run_training() {
  local name=$1 title=$2
  shift 2
  selected "$name" || return 0
  listed "$name" && return 0
  local program=$1
  # "env CUDA_VISIBLE_DEVICES=0 prog" or "mpirun ... prog": the program is the last word
  # before the options that is a path into the build.
  local word
  for word in "$@"; do
    if [[ "$word" == "$build_dir"/bin/* ]]; then
      program=$word
    fi
  done
  if [[ ! -x "$program" ]]; then
    record_step "$name" "$title" "$(command_text "$@")" "FAIL: $(not_built "$program")" "" "0.0"
    return 0
  fi
  run_logged "$name" "$step_time_limit" "$@"
  local log="$logs_dir/$name.log" outcome=PASS
  read_result_lines "$name" "$log"
  if no_gpu_answered "$log"; then
    outcome="not run: no GPU (this is a cuda build)"
  elif [[ "$run_status" -ne 0 ]]; then
    outcome="FAIL: $(status_problem "$run_status" "$log")"
  elif ! grep -q '^result: ' "$log"; then
    outcome="FAIL: no result line"
  elif [[ -n "$result_problems" ]]; then
    outcome="FAIL: $result_problems"
  fi
  record_step "$name" "$title" "$(command_text "$@")" "$outcome" "$run_status" "$run_seconds"
}

# --- The benchmarks -----------------------------------------------------------------------
# A benchmark passes when it exits with 0 (it checks every element of every allreduce, and
# exits non-zero when one is wrong); its tables go into the report as they were printed.
run_benchmark() {
  local name=$1 title=$2
  shift 2
  selected "$name" || return 0
  listed "$name" && return 0
  if [[ ! -x "$1" ]]; then
    record_step "$name" "$title" "$(command_text "$@")" "FAIL: $(not_built "$1")" "" "0.0"
    return 0
  fi
  run_logged "$name" "$step_time_limit" "$@"
  local log="$logs_dir/$name.log" outcome=PASS tables
  if no_gpu_answered "$log"; then
    outcome="not run: no GPU (this is a cuda build)"
  elif [[ "$run_status" -ne 0 ]]; then
    outcome="FAIL: $(status_problem "$run_status" "$log")"
  fi
  record_step "$name" "$title" "$(command_text "$@")" "$outcome" "$run_status" "$run_seconds"
  # Each table starts at its "# allreduce, ..." heading and ends at the next empty line; the
  # lines saying what was checked, or why a column is missing, come with them.
  tables=$(awk '/^# allreduce/ { on = 1 } on && /^$/ { on = 0; print ""; next } on || /checked|no nccl column/' "$log")
  benchmark_sections+=("### $name: $title"$'\n\n'"\`$(command_text "$@")\` (log: \`gpu_check/$name.log\`)"$'\n\n```\n'"${tables:-(no table: see the log)}"$'\n```')
}

# --- The plan -----------------------------------------------------------------------------
# Options every chapter run gets: d2l's defaults, or a short run; and its own --out, so that
# runs of one program do not overwrite each other's CSVs and plots. Without a GPU a short run
# only has to feed the report (a CI runner has 2 cores), so it is shorter still.
chapter_options=()
multi_process_options=()  # chapter 05 also times some steps apart after training
if [[ "$quick" == yes && "$mode" == gpu ]]; then
  chapter_options=(--epochs 2 --limit-train 4096)
  multi_process_options=(--profile-steps 5)
elif [[ "$quick" == yes ]]; then
  chapter_options=(--epochs 1 --limit-train 1024 --batch-size 64)
  multi_process_options=(--profile-steps 2)
fi
# Chapter 09 (ResNet-18) costs 200 times LeNet's work per image: without a GPU it runs at
# --width 4 (a 256th of the work), on a GPU at d2l's width 64.
# Its full recipe runs once (with its kernel table); the other chapter 09 runs, and the PyTorch
# twin's, take 3 epochs, to keep the whole check within minutes. Without a GPU, in short runs,
# the full recipe still runs longer than the others (2 epochs against 1), so that the
# comparison with PyTorch reads an earlier epoch of it, as on a GPU.
resnet_options=("${chapter_options[@]}")
resnet_more=("${chapter_options[@]}")
if [[ "$mode" != gpu ]]; then
  resnet_options+=(--width 4)
  resnet_more+=(--width 4)
  if [[ "$quick" == yes ]]; then
    resnet_options+=(--epochs 2)
  fi
elif [[ "$quick" != yes ]]; then
  resnet_more+=(--epochs 3)
fi
out_for() { printf '%s' "$logs_dir/$1"; }

# How to start chapter 05 under MPI. Open MPI refuses to run as root (containers, CI) unless
# told twice, and more ranks than cores unless --oversubscribe is given; in a container
# without ptrace its shared-memory transport cannot copy directly between processes, so that
# mechanism is switched off, as in the tests (tests/CMakeLists.txt).
mpirun_path=$(cache_value MPIEXEC_EXECUTABLE)
if [[ -z "$mpirun_path" || "$mpirun_path" == *NOTFOUND ]]; then
  mpirun_path=$(command -v mpirun || command -v mpiexec || true)
fi
mpi_env=()      # what mpirun needs in its environment
mpirun_command=()
mpi_version=""
if [[ -n "$mpirun_path" ]]; then
  mpi_version=$("$mpirun_path" --version 2>&1 | head -n 1 || true)
  mpirun_command=("$mpirun_path")
  if [[ "$mpi_version" == *"Open MPI"* || "$mpi_version" == *OpenRTE* ]]; then
    if [[ "$(id -u)" -eq 0 ]]; then
      mpi_env+=(OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1)
    fi
    mpi_env+=(OMPI_MCA_btl_vader_single_copy_mechanism=none)
    mpirun_command+=(--oversubscribe)
  fi
fi
if [[ "$list_steps" == yes ]]; then
  mpirun_command=(mpirun)  # the plan of a machine that has it
fi

# PyTorch with CUDA, for the twins of chapters 01 and 09: the python3 on the PATH (a virtual
# environment's, where one is active) must import torch and torch must see a CUDA device (in the
# no-GPU mode too: that is how a stand-in python3 tests the comparison table). torch_note says
# which PyTorch, or why none: the report's machine table shows it.
torch_found=no
torch_python=""
torch_note=""
torch_problem=""
find_torch() {
  local out status=0
  torch_python=$(command -v python3 || true)
  if [[ -z "$torch_python" ]]; then
    torch_problem="python3 not found"
    torch_note="none: $torch_problem"
    return 0
  fi
  # Status 3: torch imports, but sees no CUDA device. (Importing torch takes seconds.)
  out=$(timeout 120 "$torch_python" -c 'import sys, torch
print(torch.__version__, "with CUDA", torch.version.cuda)
sys.exit(0 if torch.cuda.is_available() else 3)' 2>&1) || status=$?
  case "$status" in
    0) torch_found=yes; torch_note="$(tail -n 1 <<<"$out") ($torch_python)"; return 0 ;;
    3) torch_problem="torch $(tail -n 1 <<<"$out") sees no CUDA device ($torch_python)" ;;
    *) torch_problem="$torch_python cannot import torch ($(tail -n 1 <<<"$out" | cut -c 1-160))" ;;
  esac
  torch_note="none with CUDA: $torch_problem"
}
if [[ "$list_steps" == yes ]]; then
  torch_found=yes
else
  find_torch
fi

# "On one GPU": several logical devices, or several ranks, all on the first GPU.
one_gpu_env=()
on_one_gpu=()
if [[ "$mode" == gpu ]]; then
  one_gpu_env=("CUDA_VISIBLE_DEVICES=$first_gpu")
  on_one_gpu=(env "${one_gpu_env[@]}")
fi

# Comma-separated device counts for a benchmark: 1, 2, 4, 8 up to $1, and $1 itself.
device_counts_up_to() {
  local k=1 counts="" limit=$1
  while [[ "$k" -le "$limit" && "$k" -le 8 ]]; do
    counts+="$k,"
    k=$((k * 2))
  done
  [[ ",$counts" == *",$limit,"* ]] || counts+="$limit,"
  printf '%s' "${counts%,}"
}

# The kernel table a run with --profile on printed, from the line matching $2 to the line
# "the same step without ...", into the report beside the benchmarks (nothing if it did not run).
add_kernel_table() {  # step regex
  local log="$logs_dir/$1.log" table
  [[ -f "$log" ]] || return 0
  table=$(awk -v start="$2" '$0 ~ start { on = 1 } on { print } /the same step without/ { on = 0 }' "$log")
  benchmark_sections+=("### $1: one training step, kernel by kernel"$'\n\n```\n'"${table:-(no table: see the log)}"$'\n```')
}

run_chapters() {
  local bin="$build_dir/bin" gpus=$gpu_count where="GPU"
  if [[ "$mode" == no-gpu ]]; then
    where="device"
  fi

  run_training 01_lenet_1dev "chapter 01 on 1 $where, with one step's kernel table" \
    "$bin/01_lenet" --devices 1 --profile on "${chapter_options[@]}" --out "$(out_for 01_lenet_1dev)"
  # The same without the recorded step (CUDA graph): what one launch per step saves.
  run_training 01_lenet_1dev_no_graph "chapter 01 on 1 $where, every kernel launched every step (--graph off)" \
    "$bin/01_lenet" --devices 1 --graph off "${chapter_options[@]}" --out "$(out_for 01_lenet_1dev_no_graph)"
  # That table (--profile on: each kernel's calls, time, GFLOP/s or GB/s) goes into the report
  # beside the benchmarks: the figures chapter 01's README asks for on a GPU.
  add_kernel_table 01_lenet_1dev 'kernel by kernel'

  local chapter
  for chapter in 02_data_parallel 03_ring_allreduce 08_parameter_server; do
    run_training "${chapter}_1dev" "chapter ${chapter:0:2} on 1 $where" \
      "$bin/$chapter" --devices 1 "${chapter_options[@]}" --out "$(out_for "${chapter}_1dev")"
    if [[ "$mode" == no-gpu ]]; then
      skip_step "${chapter}_all_gpus" "chapter ${chapter:0:2} on all GPUs" "no GPU"
    elif [[ "$gpus" -gt 1 ]]; then
      run_training "${chapter}_all_gpus" "chapter ${chapter:0:2} on all $gpus GPUs" \
        "$bin/$chapter" --devices "$gpus" "${chapter_options[@]}" --out "$(out_for "${chapter}_all_gpus")"
    else
      skip_step "${chapter}_all_gpus" "chapter ${chapter:0:2} on all GPUs" "this machine has 1 GPU"
    fi
    local k
    for k in 2 4; do
      local title="chapter ${chapter:0:2}, $k logical devices on GPU $first_gpu"
      if [[ "$mode" == no-gpu ]]; then
        title="chapter ${chapter:0:2}, $k logical devices (no GPU: replicas on the build's backend)"
      fi
      run_training "${chapter}_${k}dev_1gpu" "$title" \
        "${on_one_gpu[@]}" "$bin/$chapter" --devices "$k" "${chapter_options[@]}" \
        --out "$(out_for "${chapter}_${k}dev_1gpu")"
    done
  done

  # Chapter 06: LeNet with its GEMMs in reduced precision. TF32 (cuBLAS's tensor-op math) on 1
  # device; bf16 with 16-bit gradients through the ring, and fp16 with dynamic loss scaling
  # (skipped steps, the scale combined over the devices), on 2 logical devices of one GPU;
  # bf16 with the 16-bit NCCL exchange on all GPUs where there are more.
  run_training 06_mixed_precision_1dev_tf32 "chapter 06 on 1 $where, TF32" \
    "$bin/06_mixed_precision" --devices 1 --precision tf32 "${chapter_options[@]}" \
    --out "$(out_for 06_mixed_precision_1dev_tf32)"
  local precision
  for precision in bf16 fp16; do
    local title="chapter 06, $precision on 2 logical devices on GPU $first_gpu"
    [[ "$mode" == no-gpu ]] && title="chapter 06, $precision on 2 logical devices (no GPU)"
    run_training "06_mixed_precision_2dev_1gpu_$precision" "$title" "${on_one_gpu[@]}" "$bin/06_mixed_precision" \
      --devices 2 --precision "$precision" "${chapter_options[@]}" --out "$(out_for "06_mixed_precision_2dev_1gpu_$precision")"
  done
  if [[ "$mode" != no-gpu && "$gpus" -gt 1 ]]; then
    run_training 06_mixed_precision_all_gpus_bf16_nccl "chapter 06, bf16 on all $gpus GPUs, 16-bit NCCL exchange" \
      "$bin/06_mixed_precision" --devices "$gpus" --precision bf16 --allreduce nccl "${chapter_options[@]}" \
      --out "$(out_for 06_mixed_precision_all_gpus_bf16_nccl)"
  fi

  # Chapter 07: LeNet's layers split over devices. GPipe and 1F1B on 2 logical devices of one
  # GPU, the 2x2 hybrid (2 pipelines of 2 stages) on 4; GPipe over 2 GPUs where there are more.
  local schedule
  for schedule in gpipe 1f1b; do
    local title="chapter 07, $schedule over 2 logical devices on GPU $first_gpu"
    [[ "$mode" == no-gpu ]] && title="chapter 07, $schedule over 2 logical devices (no GPU)"
    run_training "07_model_parallel_2dev_1gpu_$schedule" "$title" "${on_one_gpu[@]}" "$bin/07_model_parallel" \
      --devices 2 --schedule "$schedule" "${chapter_options[@]}" --out "$(out_for "07_model_parallel_2dev_1gpu_$schedule")"
  done
  local hybrid_title="chapter 07, 2 pipelines x 2 stages on 4 logical devices on GPU $first_gpu"
  [[ "$mode" == no-gpu ]] && hybrid_title="chapter 07, 2 pipelines x 2 stages on 4 logical devices (no GPU)"
  run_training 07_model_parallel_4dev_1gpu_hybrid "$hybrid_title" "${on_one_gpu[@]}" "$bin/07_model_parallel" \
    --devices 4 --data-parallel 2 "${chapter_options[@]}" --out "$(out_for 07_model_parallel_4dev_1gpu_hybrid)"
  if [[ "$mode" != no-gpu && "$gpus" -gt 1 ]]; then
    run_training 07_model_parallel_2gpus_gpipe "chapter 07, GPipe over 2 GPUs" \
      "$bin/07_model_parallel" --devices 2 --schedule gpipe "${chapter_options[@]}" \
      --out "$(out_for 07_model_parallel_2gpus_gpipe)"
  fi

  # Chapter 09: d2l 13.6's ResNet-18 with its recipe (the program's default lr is 0.1), with one
  # step's kernel table; TF32 and bf16 GEMMs beside fp32; SyncBN on 2 logical devices of one
  # GPU; d2l's 2-GPU recipe per device and with SyncBN on all GPUs where there are more.
  run_training 09_resnet_1dev "chapter 09 (ResNet-18) on 1 $where, with one step's kernel table" \
    "$bin/09_resnet" --devices 1 --profile on "${resnet_options[@]}" --out "$(out_for 09_resnet_1dev)"
  local gemm_precision
  for gemm_precision in tf32 bf16; do
    run_training "09_resnet_1dev_$gemm_precision" "chapter 09 on 1 $where, GEMM inputs read as $gemm_precision by tensor cores" \
      "$bin/09_resnet" --devices 1 --precision "$gemm_precision" "${resnet_more[@]}" \
      --out "$(out_for "09_resnet_1dev_$gemm_precision")"
  done
  add_kernel_table 09_resnet_1dev 'kernels [(]'
  local sync_title="chapter 09, SyncBN on 2 logical devices on GPU $first_gpu"
  [[ "$mode" == no-gpu ]] && sync_title="chapter 09, SyncBN on 2 logical devices (no GPU)"
  run_training 09_resnet_2dev_1gpu_sync "$sync_title" "${on_one_gpu[@]}" "$bin/09_resnet" --devices 2 --bn sync \
    "${resnet_more[@]}" --out "$(out_for 09_resnet_2dev_1gpu_sync)"
  if [[ "$mode" != no-gpu && "$gpus" -gt 1 ]]; then
    run_training 09_resnet_all_gpus "chapter 09 on all $gpus GPUs, BatchNorm per device" \
      "$bin/09_resnet" --devices "$gpus" --batch-size $((256 * gpus)) --lr "$(awk -v k="$gpus" 'BEGIN { print 0.1 * k }')" \
      "${resnet_more[@]}" --out "$(out_for 09_resnet_all_gpus)"
    run_training 09_resnet_all_gpus_sync "chapter 09 on all $gpus GPUs, SyncBN" \
      "$bin/09_resnet" --devices "$gpus" --bn sync --batch-size $((256 * gpus)) \
      --lr "$(awk -v k="$gpus" 'BEGIN { print 0.1 * k }')" "${resnet_more[@]}" --out "$(out_for 09_resnet_all_gpus_sync)"
  fi

  # Chapter 02's DataParallel-style trainer (one process, everything through device 0), to put
  # beside the DDP-style runs above: on 2 logical devices, and on all GPUs where there are more.
  local title="chapter 02, DataParallel-style trainer, 2 logical devices on GPU $first_gpu"
  [[ "$mode" == no-gpu ]] && title="chapter 02, DataParallel-style trainer, 2 logical devices (no GPU)"
  run_training 02_dataparallel_2dev_1gpu "$title" "${on_one_gpu[@]}" "$bin/02_data_parallel" \
    --trainer dataparallel --devices 2 "${chapter_options[@]}" --out "$(out_for 02_dataparallel_2dev_1gpu)"
  if [[ "$mode" != no-gpu && "$gpus" -gt 1 ]]; then
    run_training 02_dataparallel_all_gpus "chapter 02, DataParallel-style trainer, all $gpus GPUs" \
      "$bin/02_data_parallel" --trainer dataparallel --devices "$gpus" "${chapter_options[@]}" \
      --out "$(out_for 02_dataparallel_all_gpus)"
  fi

  # Chapter 04: NCCL, one rank per GPU (the program caps --devices at the GPU count).
  if [[ "$mode" == no-gpu ]]; then
    skip_step 04_nccl_1gpu "chapter 04 (NCCL) on 1 GPU" "no GPU"
    skip_step 04_nccl_all_gpus "chapter 04 (NCCL) on all GPUs" "no GPU"
  else
    run_training 04_nccl_1gpu "chapter 04 (NCCL) on 1 GPU" \
      "$bin/04_nccl" --devices 1 "${chapter_options[@]}" --out "$(out_for 04_nccl_1gpu)"
    if [[ "$gpus" -gt 1 ]]; then
      run_training 04_nccl_all_gpus "chapter 04 (NCCL) on all $gpus GPUs" \
        "$bin/04_nccl" --devices "$gpus" "${chapter_options[@]}" --out "$(out_for 04_nccl_all_gpus)"
    else
      skip_step 04_nccl_all_gpus "chapter 04 (NCCL) on all GPUs" "this machine has 1 GPU"
    fi
  fi

  # Chapter 05: one process per device. With a GPU each rank has its own, and NCCL sums; ranks
  # that share a GPU must use MPI's collectives (NCCL refuses two ranks on one GPU).
  local own_gpu_collective=nccl
  if [[ "$mode" == no-gpu ]]; then
    own_gpu_collective=mpi
  fi
  if [[ "${#mpirun_command[@]}" -eq 0 ]]; then
    local missing="mpirun not found (Debian/Ubuntu: apt-get install openmpi-bin)"
    if [[ "$mode" == no-gpu ]]; then
      skip_step 05_multi_process_np1 "chapter 05, mpirun -np 1" "$missing"
      skip_step 05_multi_process_np2_1gpu "chapter 05, mpirun -np 2 on one device" "$missing"
    else
      selected 05 && record_step 05_multi_process "chapter 05 under mpirun" "" "FAIL: $missing" "" "0.0"
    fi
    return 0
  fi
  run_training 05_multi_process_np1 "chapter 05, mpirun -np 1, collective $own_gpu_collective" \
    env "${mpi_env[@]}" "${mpirun_command[@]}" -np 1 "$bin/05_multi_process" --collective "$own_gpu_collective" \
    "${chapter_options[@]}" "${multi_process_options[@]}" --out "$(out_for 05_multi_process_np1)"
  if [[ "$mode" == no-gpu ]]; then
    skip_step 05_multi_process_all_gpus "chapter 05, one rank per GPU (NCCL)" "no GPU"
  elif [[ "$gpus" -gt 1 ]]; then
    run_training 05_multi_process_all_gpus "chapter 05, mpirun -np $gpus, one rank per GPU, NCCL" \
      env "${mpi_env[@]}" "${mpirun_command[@]}" -np "$gpus" "$bin/05_multi_process" --collective nccl \
      "${chapter_options[@]}" "${multi_process_options[@]}" --out "$(out_for 05_multi_process_all_gpus)"
  else
    skip_step 05_multi_process_all_gpus "chapter 05, one rank per GPU (NCCL)" "this machine has 1 GPU"
  fi
  # No --collective here: two ranks on one GPU must fall back from the default (NCCL) to MPI
  # by themselves, which is what a student with one GPU meets first.
  local title="chapter 05, mpirun -np 2 on GPU $first_gpu (ranks share it: the default falls back to MPI)"
  if [[ "$mode" == no-gpu ]]; then
    title="chapter 05, mpirun -np 2, MPI collectives (no GPU)"
  fi
  run_training 05_multi_process_np2_1gpu "$title" \
    env "${one_gpu_env[@]}" "${mpi_env[@]}" "${mpirun_command[@]}" -np 2 "$bin/05_multi_process" \
    "${chapter_options[@]}" "${multi_process_options[@]}" --out "$(out_for 05_multi_process_np2_1gpu)"
}

# --- The PyTorch twins ---------------------------------------------------------------------
# Chapters 01 and 09 have PyTorch twins (lenet_torch.py, resnet_torch.py): the same model, data
# and recipe in PyTorch. Where python3 has PyTorch with CUDA they run on the first GPU, each beside
# the C++ run it is compared with, in the same precision: fp32 with TF32 off in PyTorch too
# (PyTorch's default lets cuDNN's convolutions use TF32), TF32, and bf16. The C++ ResNet-18 runs
# 10 epochs in fp32, the twins 3 (seconds per epoch need no more), so the fp32 row compares the
# C++ run's accuracy after as many epochs as the twin ran, from its CSV (the rate is constant).

# The value of KEY on the last result line of LOG ("" if none, or no such log: a run that failed).
result_value() {  # log key
  local line
  line=$(grep '^result: ' "$1" 2>/dev/null | tail -n 1) || true
  tr ' ' '\n' <<<"$line" | sed -n "s/^$2=//p" | head -n 1
}

# Test accuracy after epoch N, from the CSV a run's log names ("wrote .../name.csv"); "" if none.
csv_test_acc() {  # log epoch
  local csv
  csv=$(sed -n 's/^wrote \(.*\.csv\)$/\1/p' "$1" 2>/dev/null | tail -n 1) || true
  [[ -f "$csv" ]] || return 0
  awk -F, -v epoch="$2" 'NR == 1 { for (i = 1; i <= NF; ++i) if ($i == "test_acc") column = i; next }
                         column && $1 == epoch { print $column }' "$csv"
}

# A twin's run: passes when it exits with 0, prints its result line, trained on CUDA (on a GPU),
# and, in a full run, ends above min_test_acc.
run_twin() {  # name title command...
  local name=$1 title=$2
  shift 2
  selected "$name" || return 0
  listed "$name" && return 0
  run_logged "$name" "$step_time_limit" "$@"
  local log="$logs_dir/$name.log" outcome=PASS acc backend
  acc=$(result_value "$log" test_acc)
  backend=$(result_value "$log" backend)
  if [[ "$run_status" -ne 0 ]]; then
    outcome="FAIL: $(status_problem "$run_status" "$log")"
  elif ! grep -q '^result: ' "$log"; then
    outcome="FAIL: no result line"
  elif ! [[ "$acc" =~ ^[0-9]+(\.[0-9]+)?$ ]]; then
    outcome="FAIL: test_acc '$acc' is not a number"
  elif [[ "$quick" == no ]] && awk -v a="$acc" -v m="$min_test_acc" 'BEGIN { exit !(a < m) }'; then
    outcome="FAIL: test_acc $acc is below $min_test_acc (did not learn)"
  elif [[ "$mode" == gpu && "$backend" != torch-cuda ]]; then
    outcome="FAIL: ran on '$backend', not torch-cuda"
  fi
  record_step "$name" "$title" "$(command_text "$@")" "$outcome" "$run_status" "$run_seconds"
}

run_torch_twins() {
  [[ "$torch_found" == yes ]] || return 0
  local where="on GPU $first_gpu"
  [[ "$mode" == no-gpu ]] && where="(no GPU: python3 says it has CUDA)"
  # On the first GPU, as the C++ runs they are compared with. --device cuda: a twin that cannot
  # train on the GPU stops with a message instead of training on the CPU.
  run_twin 01_lenet_torch "chapter 01's PyTorch twin $where, fp32 ($(twin_precision_words fp32))" \
    "${on_one_gpu[@]}" "$torch_python" "$repo_root/chapters/01_lenet/lenet_torch.py" --device cuda --precision fp32 \
    "${chapter_options[@]}" --out "$(out_for 01_lenet_torch)"
  local precision
  for precision in fp32 tf32 bf16; do
    run_twin "09_resnet_torch_$precision" "chapter 09's PyTorch twin $where, $precision ($(twin_precision_words "$precision"))" \
      "${on_one_gpu[@]}" "$torch_python" "$repo_root/chapters/09_resnet/resnet_torch.py" --device cuda \
      --precision "$precision" "${resnet_more[@]}" --out "$(out_for "09_resnet_torch_$precision")"
  done
}

# What a twin's --precision makes PyTorch do (the twins' use_precision says why).
twin_precision_words() {
  case "$1" in
    fp32) echo "TF32 off" ;;
    tf32) echo "TF32 in matmuls and convolutions" ;;
    bf16) echo "autocast to bf16, channels_last" ;;
  esac
}

# The report's "this repository against PyTorch" table: one row per twin that ran, beside the
# C++ run of the same model and precision.
twin_comparison() {
  if [[ "$torch_found" != yes ]]; then
    echo "Not run: $torch_problem. (Where \`python3\` imports torch and torch sees a GPU, chapters 01 and 09's PyTorch twins run beside the C++ programs and this table compares them; the verdict does not depend on them.)"
    return 0
  fi
  local -a rows=()
  local spec ours twin model precision
  for spec in "01_lenet_1dev 01_lenet_torch LeNet fp32" "09_resnet_1dev 09_resnet_torch_fp32 ResNet-18 fp32" \
              "09_resnet_1dev_tf32 09_resnet_torch_tf32 ResNet-18 tf32" "09_resnet_1dev_bf16 09_resnet_torch_bf16 ResNet-18 bf16"; do
    read -r ours twin model precision <<<"$spec"
    local twin_log="$logs_dir/$twin.log" ours_log="$logs_dir/$ours.log"
    grep -q '^result: ' "$twin_log" 2>/dev/null || continue
    local epochs ours_epochs ours_acc ours_sec twin_sec ratio
    epochs=$(result_value "$twin_log" epochs)
    ours_epochs=$(result_value "$ours_log" epochs)
    ours_sec=$(result_value "$ours_log" sec_per_epoch)
    ours_acc=$(result_value "$ours_log" test_acc)
    if [[ -n "$ours_epochs" && "$ours_epochs" != "$epochs" ]]; then
      ours_acc=$(csv_test_acc "$ours_log" "$epochs")
      [[ -z "$ours_acc" ]] || ours_acc=$(printf '%.4f' "$ours_acc")
      ours_acc="${ours_acc:-?} (epoch $epochs of $ours_epochs)"
    fi
    twin_sec=$(result_value "$twin_log" sec_per_epoch)
    ratio=$(awk -v t="$twin_sec" -v o="$ours_sec" 'BEGIN { if (o + 0 > 0 && t + 0 > 0) printf "%.2f", t / o; else print "n/a" }')
    local missing="not run"  # this repository's side, where it has no result line
    [[ -f "$ours_log" ]] && missing="no result (see the step)"
    local recipe
    recipe="$precision (PyTorch: $(twin_precision_words "$precision")); batch $(result_value "$twin_log" batch), lr $(result_value "$twin_log" lr), $epochs epoch"
    [[ "$epochs" == 1 ]] || recipe+=s
    rows+=("| $model | $recipe | ${ours_sec:-$missing} | ${ours_acc:-$missing} | ${twin_sec:-?} | $(result_value "$twin_log" test_acc) | $ratio | $ours, $twin |")
  done
  if [[ "${#rows[@]}" -eq 0 ]]; then
    echo "(no twin ran: see the steps)"
    return 0
  fi
  echo "The C++ programs of this repository and their PyTorch twins on the same GPU, data, model and"
  echo "recipe, in the same precision: fp32 is fp32 in both (TF32 off in PyTorch, whose default lets"
  echo "cuDNN's convolutions use TF32); tf32 is the C++ \`--precision tf32\` beside PyTorch with TF32 in"
  echo "matmuls and convolutions; bf16 is the C++ \`--precision bf16\` beside PyTorch's autocast to bf16"
  echo "(with the channels_last layout). Seconds per epoch leave out the first epoch on both sides."
  echo "Time, PyTorch ÷ ours: above 1, this repository's run is the faster. Each side's command is in"
  echo "the steps table (the last column names the two steps)."
  echo
  echo "| model | recipe | ours: s/epoch | ours: test acc | PyTorch: s/epoch | PyTorch: test acc | time, PyTorch ÷ ours | steps |"
  echo "|---|---|---|---|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
}

run_benchmarks() {
  local bin="$build_dir/bin" sizes
  # Full: up to 64 MiB (LeNet's gradients are 504 KiB; NCCL reaches its bandwidth by then on
  # one node), 20 timed runs per size. Quick: up to 1 MiB, 5 runs.
  sizes=(--max-bytes 64M --warmup 5 --iters 20)
  if [[ "$quick" == yes ]]; then
    sizes=(--max-bytes 1M --warmup 1 --iters 5)
  fi
  if [[ "$mode" == no-gpu ]]; then
    run_benchmark 03_allreduce_bench "naive and ring, 1 and 2 devices (no GPU)" \
      "$bin/03_allreduce_bench" --devices 1,2 "${sizes[@]}" --out "$(out_for 03_allreduce_bench)"
    skip_step 04_allreduce_bench "naive, ring and NCCL on the GPUs" "no GPU"
    return 0
  fi
  # Chapter 03's benchmark places logical devices round-robin on the GPUs: with one GPU, 2
  # and 4 devices share it; with more, they spread over them.
  local counts
  counts=$(device_counts_up_to "$gpu_count")
  [[ ",$counts," == *",2,"* ]] || counts+=",2"
  [[ ",$counts," == *",4,"* ]] || counts+=",4"
  counts=$(tr ',' '\n' <<<"$counts" | sort -n | uniq | paste -sd, -)
  run_benchmark 03_allreduce_bench "naive and ring on $counts devices ($gpu_count GPU(s))" \
    "$bin/03_allreduce_bench" --devices "$counts" "${sizes[@]}" --out "$(out_for 03_allreduce_bench)"
  counts=$(device_counts_up_to "$gpu_count")
  run_benchmark 04_allreduce_bench "naive, ring and NCCL on $counts GPU(s)" \
    "$bin/04_allreduce_bench" --devices "$counts" "${sizes[@]}" --out "$(out_for 04_allreduce_bench)"
}

# --- The machine --------------------------------------------------------------------------
# Facts the report starts with; each falls back to "unknown" rather than failing the check.
machine_rows=()
topology=""
machine_row() { machine_rows+=("| $1 | ${2:-unknown} |"); }

collect_machine_facts() {
  machine_row "date" "$(date -u '+%Y-%m-%d %H:%M UTC')"
  local commit
  commit=$(git -C "$repo_root" rev-parse --short=12 HEAD 2>/dev/null || true)
  if [[ -n "$commit" && -n "$(git -C "$repo_root" status --porcelain --untracked-files=no 2>/dev/null)" ]]; then
    commit+=" (with uncommitted changes)"
  fi
  machine_row "git commit" "$commit"
  if [[ "$mode" == gpu ]]; then
    local gpus
    gpus=$(nvidia-smi --query-gpu=index,name,memory.total,pci.bus_id --format=csv,noheader 2>/dev/null |
           awk -F', ' '{ printf "%s%s: %s, %s, %s", sep, $1, $2, $3, $4; sep = "<br>" }' || true)
    machine_row "GPUs ($gpu_count used)" "$gpus"
    machine_row "NVIDIA driver" "$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n 1 || true)"
    if [[ -n "${CUDA_VISIBLE_DEVICES+set}" ]]; then
      machine_row "CUDA_VISIBLE_DEVICES" "$CUDA_VISIBLE_DEVICES"
    fi
    topology=$(nvidia-smi topo -m 2>&1 || true)
  else
    machine_row "GPUs" "none: $gpu_problem"
  fi
  machine_row "MPI" "${mpi_version:-mpirun not found}"
  local cpu_model
  cpu_model=$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -n 1 || true)
  [[ -n "$cpu_model" ]] || cpu_model=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
  machine_row "CPU" "$cpu_model, $cores cores usable"
  machine_row "PyTorch (the twins)" "$torch_note"
}

# The facts that come from the build, read once it is configured (a new build folder has no
# CMake cache before): its compiler, the NCCL its programs load, its backend and architectures.
build_facts_collected=no
collect_build_facts() {
  build_facts_collected=yes
  local nvcc
  nvcc=$(cache_value CMAKE_CUDA_COMPILER)
  [[ -x "$nvcc" ]] || nvcc=$(command -v nvcc || true)
  [[ -x "$nvcc" ]] || nvcc=/usr/local/cuda/bin/nvcc
  if [[ -x "$nvcc" ]]; then
    machine_row "CUDA (nvcc)" "$("$nvcc" --version 2>/dev/null | grep -i release | sed 's/^Cuda compilation tools, //' || true) ($nvcc)"
  else
    machine_row "CUDA (nvcc)" "not found"
  fi
  machine_row "NCCL" "$(nccl_fact)"
  if [[ ! -f "$build_dir/CMakeCache.txt" ]]; then
    machine_row "build" "$(command_text "$build_dir"): not configured (see the configure step)"
    return 0
  fi
  local backend text
  backend=$(built_backend)
  text="$(command_text "$build_dir"): backend ${backend:-unknown} (asked for: $(cache_value MGPU_BACKEND))"
  if [[ "$backend" == cuda ]]; then
    local archs
    archs=$(cache_value MGPU_BUILT_CUDA_ARCHITECTURES)
    [[ -n "$archs" ]] || archs=$(cache_value CMAKE_CUDA_ARCHITECTURES)
    text+=", CUDA architectures ${archs:-unknown (configure again to record them)}"
  fi
  machine_row "build" "$text"
}

# The NCCL the build's programs load, as tools/nccl_version finds it: the loaded library's own
# version (ncclGetVersion) and its file. The nccl.h the build compiled against is named too where
# its version differs: a header says nothing about the code that runs (PyTorch's pip wheel, for
# one, brings a libnccl.so.2 of its own).
nccl_fact() {
  case "$(built_backend)" in
    cpu) echo "not used by a cpu build"; return 0 ;;
    "") echo "unknown: no configured build"; return 0 ;;
  esac
  local program="$build_dir/bin/nccl_version" out library header text
  if [[ ! -x "$program" ]]; then
    if [[ -z "$(cache_value MGPU_NCCL_INCLUDE)" || "$(cache_value MGPU_NCCL_INCLUDE)" == *NOTFOUND ||
          "$(cache_value MGPU_NCCL_LIBRARY)" == *NOTFOUND ]]; then
      echo "not found by the build (chapter 04 is left out: see the configure report)"
    else
      echo "unknown: $(command_text "$program") was not built"
    fi
    return 0
  fi
  if ! out=$(timeout 30 "$program" 2>&1); then
    echo "unknown: $(command_text "$program") failed: $(tail -n 1 <<<"$out")"
    return 0
  fi
  library=$(sed -n 's/^library //p' <<<"$out")  # "2.28.9 /path/libnccl.so.2"
  header=$(sed -n 's/^header //p' <<<"$out")
  text="${library%% *} (${library#* })"
  if [[ "${header%% *}" != "${library%% *}" ]]; then
    text+="; the build compiled against nccl.h ${header%% *} (${header#* })"
  fi
  echo "$text"
}

# The peer-access matrix chapter 02 prints, from the widest of its runs that has one.
peer_access_matrix() {
  local name log
  for name in 02_data_parallel_all_gpus 02_data_parallel_2dev_1gpu 02_data_parallel_1dev; do
    log="$logs_dir/$name.log"
    [[ -f "$log" ]] || continue
    if grep -q '^peer access' "$log"; then
      echo "From \`gpu_check/$name.log\`:"
      echo
      echo '```'
      awk '/^peer access/ { on = 1; print; next } on && /^( |cuda:|\()/ { print; next } on { exit }' "$log"
      echo '```'
      return 0
    fi
  done
  echo "(no chapter 02 log printed one)"
}

# --- The report ---------------------------------------------------------------------------
verdict() {
  local ran=$(( ${#step_names[@]} - not_run ))
  if [[ "$failures" -gt 0 ]]; then
    echo "gpu_check: FAIL ($failures of ${#step_names[@]} steps failed)"
  elif [[ "$mode" == no-gpu ]]; then
    echo "gpu_check: NOT A GPU VALIDATION (no GPU: the $ran steps that could run passed, $not_run not run)"
  elif [[ -n "$only" ]]; then
    local parts=${only#,}
    echo "gpu_check: PASS (all $ran steps that ran passed on $gpu_count GPU(s); only the parts ${parts%,} were checked)"
  else
    echo "gpu_check: PASS (all $ran steps that ran passed on $gpu_count GPU(s))"
  fi
}

write_report() {
  local i total
  total=$(seconds_since "$check_started")
  {
    echo "# GPU check"
    echo
    if [[ "$mode" == no-gpu ]]; then
      echo "> **This is NOT a GPU validation.** No NVIDIA GPU answered ($gpu_problem). The script ran"
      echo "> with \`--allow-no-gpu\`: the steps that need a GPU are marked \"not run: no GPU\", the others"
      echo "> ran on the build's own backend (see the backend column). This report only shows that the"
      echo "> script's own parts work: its command line, running the programs, reading their result"
      echo "> lines, writing this report."
      echo
    fi
    if [[ "$quick" == yes ]]; then
      echo "Mode: **--quick** (training with \`$(command_text "${chapter_options[@]}")\`, test accuracy not judged;"
      echo "benchmarks up to 1 MiB). Times and accuracies here are not d2l's and are not to be compared with it."
    else
      echo "Mode: full (d2l's defaults: 10 epochs, batch 256, lr 0.2, all 60,000 training images; every"
      echo "training must end above test accuracy $min_test_acc). Benchmarks up to 64 MiB."
    fi
    echo
    if [[ -n "$only" ]]; then
      local parts=${only#,}
      echo "Parts: **only ${parts%,}** (\`--only\`); the other parts were not run and are not in this report."
      echo
    fi
    echo "Total time: $total s. Every step's full output is in \`gpu_check/<step>.log\` next to this file."
    echo
    echo "## Machine"
    echo
    echo "| | |"
    echo "|---|---|"
    printf '%s\n' "${machine_rows[@]}"
    if [[ -n "$configure_report" ]]; then
      echo
      echo "The build's configure report:"
      echo
      echo '```'
      echo "$configure_report"
      echo '```'
    fi
    echo
    echo "## Steps"
    echo
    echo "| step | what | outcome | exit | seconds | command |"
    echo "|---|---|---|---|---|---|"
    for i in "${!step_names[@]}"; do
      local command=${step_commands[$i]}
      if [[ -n "$command" ]]; then
        command="\`$command\`"
      fi
      echo "| ${step_names[$i]} | ${step_titles[$i]} | ${step_outcomes[$i]} | ${step_exits[$i]} | ${step_seconds[$i]} | $command |"
    done
    echo
    echo "## Training runs"
    echo
    echo "One row per \`result:\` line. Chapter 02 trains on 1 device and then on k; chapter 03 with"
    echo "chapter 02's allreduce and with the ring; chapter 04 with the ring, ncclSum and ncclAvg."
    echo "Chapter 01 trains on exactly one device, so it has no multi-device runs."
    echo
    echo "| step | run | backend | devices | epochs | test_acc | sec_per_epoch | samples_per_sec | other keys |"
    echo "|---|---|---|---|---|---|---|---|---|"
    if [[ "${#training_rows[@]}" -gt 0 ]]; then
      printf '%s\n' "${training_rows[@]}"
    fi
    echo
    echo "## This repository against PyTorch"
    echo
    twin_comparison
    echo
    echo "## Test suite"
    echo
    echo "${test_suite_section:-(not run)}"
    echo
    echo "## Peer access"
    echo
    peer_access_matrix
    if [[ -n "$topology" ]]; then
      echo
      echo "## Topology (nvidia-smi topo -m)"
      echo
      echo '```'
      echo "$topology"
      echo '```'
    fi
    echo
    echo "## Benchmarks"
    echo
    if [[ "${#benchmark_sections[@]}" -gt 0 ]]; then
      printf '%s\n\n' "${benchmark_sections[@]}"
    else
      echo "(none ran)"
      echo
    fi
    echo "## Verdict"
    echo
    verdict
  } >"$report"
}

# --- The check ----------------------------------------------------------------------------
# Ctrl-C (or a TERM) still leaves a report of what ran so far. (The functions of this script end
# with `return 0`, never a bare `return`: run from a trap, a bare return returns the status of
# the command the signal interrupted, 130 or 143, and set -e would end the report there.)
# shellcheck disable=SC2317  # (run by the trap below, which shellcheck does not follow)
interrupted() {
  echo >&2
  if [[ -n "$running_pid" ]]; then
    kill -TERM "$running_pid" 2>/dev/null || true  # timeout passes it on to the whole run
    wait "$running_pid" 2>/dev/null || true
  fi
  record_step interrupted "the check was interrupted" "" "FAIL: interrupted" "" "0.0"
  [[ "$build_facts_collected" == yes ]] || collect_build_facts
  write_report
  echo "report (incomplete): $(command_text "$report")" >&2
  exit 130
}

main() {
  if [[ "$list_steps" == yes ]]; then
    configure_and_build
    run_test_suite
    run_chapters
    run_torch_twins
    run_benchmarks
    exit 0
  fi
  rm -rf -- "$logs_dir"
  mkdir -p -- "$logs_dir"
  if [[ "$mode" == gpu ]]; then
    echo "$program_name: $gpu_count GPU(s) answer; checking $(command_text "$build_dir"), report in $(command_text "$report")"
  else
    echo "$program_name: no GPU answers ($gpu_problem); --allow-no-gpu: running the cpu-side steps on" \
         "$(command_text "$build_dir"). This is NOT a GPU validation."
  fi
  trap interrupted INT TERM
  collect_machine_facts
  configure_and_build
  collect_build_facts
  if [[ "$build_ok" == yes ]]; then
    run_test_suite
    run_chapters
    run_torch_twins
    run_benchmarks
  fi
  write_report
  echo "report: $(command_text "$report")"
  verdict
  if [[ "$failures" -gt 0 ]]; then
    local i
    for i in "${!step_names[@]}"; do
      if [[ "${step_outcomes[$i]}" == FAIL* ]]; then
        echo "  failed: ${step_names[$i]}: ${step_outcomes[$i]#FAIL: }"
      fi
    done
    exit 1
  fi
  exit 0
}

main
