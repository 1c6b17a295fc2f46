# shellcheck shell=bash
# The GPU check's report (sourced by tools/gpu_check.sh, whose variables it reads): everything
# in it comes from the rows the steps recorded and the logs in gpu_check/ (each "gpu" step's
# <step>.log, .row and .runs, written by run_step.cmake).

# The last line of the report and of the terminal: PASS only if every step that ran passed.
verdict() {
  local total failures not_run
  total=${#rows[@]}
  failures=$(printf '%s\n' "${rows[@]}" | grep -c '^| [^|]* | [^|]* | FAIL' || true)
  not_run=$(printf '%s\n' "${rows[@]}" | grep -c '^| [^|]* | [^|]* | not run' || true)
  if [[ "$failures" -gt 0 ]]; then
    echo "gpu_check: FAIL ($failures of $total steps failed)"
  elif [[ "$mode" == no-gpu ]]; then
    echo "gpu_check: NOT A GPU VALIDATION (no GPU: the $((total - not_run)) steps that could run passed, $not_run not run)"
  elif [[ -n "$only" ]]; then
    echo "gpu_check: PASS (all $((total - not_run)) steps that ran passed on $gpu_count GPU(s); only the parts $only were checked)"
  else
    echo "gpu_check: PASS (all $((total - not_run)) steps that ran passed on $gpu_count GPU(s))"
  fi
}

row() { echo "| $1 | ${2:-unknown} |"; }  # a row of the machine table
fact() { sed -n "s/^$1: *//p" <<<"$stamp" | head -n 1; }  # one of machine_stamp.sh's lines

# The machine: tools/machine_stamp.sh's facts (with the NCCL the build's programs load), what this
# check used, and the build. Each falls back to "unknown" rather than failing the check.
machine_table() {
  local stamp backend
  stamp=$("$repo_root/tools/machine_stamp.sh" "$build_dir" 2>/dev/null || true)
  backend=$(cache_value MGPU_BUILT_BACKEND)
  row date "$(fact date)"
  row "git commit" "$(fact commit)"
  row GPUs "$(fact gpus)"
  if [[ "$mode" == gpu ]]; then
    row "GPUs used" "$gpu_count${CUDA_VISIBLE_DEVICES+ (CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES)}"
  else
    row "GPUs used" "none: $gpu_problem"
  fi
  row CPU "$(fact cpu)"
  row MPI "$(fact mpi)"
  row BLAS "$(fact blas)"
  row "PyTorch (the twins)" "$torch_note"
  row "CUDA (nvcc)" "$(fact cuda)"
  case "$backend" in
    cpu) row NCCL "not used by a cpu build" ;;
    cuda) row NCCL "$(fact nccl)" ;;
    *) row NCCL "unknown: no configured build" ;;
  esac
  local build
  build="$(command_text "$build_dir"): backend ${backend:-unknown} (asked for: $(cache_value MGPU_BACKEND))"
  if [[ "$backend" == cuda ]]; then
    local archs
    archs=$(cache_value MGPU_BUILT_CUDA_ARCHITECTURES)
    [[ -n "$archs" ]] || archs=$(cache_value CMAKE_CUDA_ARCHITECTURES)
    build+=", CUDA architectures ${archs:-unknown (configure again to record them)}"
  fi
  row build "$build"
}

# The value of KEY on the last result line of LOG ("" if none).
result_value() {  # log key
  grep '^result: ' "$1" 2>/dev/null | tail -n 1 | tr ' ' '\n' | sed -n "s/^$2=//p" | head -n 1
}
# Test accuracy after epoch N, from the CSV a run's log names ("wrote .../name.csv").
csv_test_acc() {  # log epoch
  local csv
  csv=$(sed -n 's/^wrote \(.*\.csv\)$/\1/p' "$1" 2>/dev/null | tail -n 1)
  [[ -f "$csv" ]] || return 0
  awk -F, -v epoch="$2" 'NR == 1 { for (i = 1; i <= NF; ++i) if ($i == "test_acc") c = i; next }
                         c && $1 == epoch { printf "%.4f", $c }' "$csv"
}

# One row per twin that ran, beside the C++ run of the same model and precision. The C++ fp32
# ResNet-18 runs 10 epochs, its twin 3: that row reads the C++ accuracy at the twin's epoch from
# its CSV (the rate is constant: the first 3 of 10 epochs are a 3-epoch run).
twin_comparison() {
  if [[ "$torch_found" != yes ]]; then
    echo "Not run: $torch_note. (Where \`python3\` imports torch and torch sees a GPU, chapters 01 and 09's PyTorch twins run beside the C++ programs and this table compares them; the verdict does not depend on them.)"
    return 0
  fi
  local spec ours_step twin model precision ours twin_log epochs acc ours_sec twin_sec words lines=""
  for spec in "01_lenet_1dev 01_lenet_torch LeNet fp32" "09_resnet_1dev 09_resnet_torch_fp32 ResNet-18 fp32" \
              "09_resnet_1dev_tf32 09_resnet_torch_tf32 ResNet-18 tf32" "09_resnet_1dev_bf16 09_resnet_torch_bf16 ResNet-18 bf16"; do
    read -r ours_step twin model precision <<<"$spec"
    ours=$logs_dir/$ours_step.log twin_log=$logs_dir/$twin.log
    grep -q '^result: ' "$twin_log" 2>/dev/null || continue
    epochs=$(result_value "$twin_log" epochs)
    acc=$(result_value "$ours" test_acc) ours_sec=$(result_value "$ours" sec_per_epoch)
    if [[ -n "$acc" && "$(result_value "$ours" epochs)" != "$epochs" ]]; then
      acc="$(csv_test_acc "$ours" "$epochs") (epoch $epochs of $(result_value "$ours" epochs))"
    fi
    [[ -f "$ours" ]] || acc="not run" ours_sec="not run"
    twin_sec=$(result_value "$twin_log" sec_per_epoch)
    case "$precision" in
      fp32) words="TF32 off" ;;
      tf32) words="TF32 in matmuls and convolutions" ;;
      bf16) words="autocast to bf16, channels_last" ;;
    esac
    lines+="| $model | $precision (PyTorch: $words); batch $(result_value "$twin_log" batch), lr $(result_value "$twin_log" lr), $epochs epoch$([[ "$epochs" == 1 ]] || echo s)"
    lines+=" | ${ours_sec:-no result (see the step)} | ${acc:-no result (see the step)} | $twin_sec | $(result_value "$twin_log" test_acc)"
    lines+=" | $(awk -v t="$twin_sec" -v o="$ours_sec" 'BEGIN { if (o + 0 > 0 && t + 0 > 0) printf "%.2f", t / o; else print "n/a" }')"
    lines+=" | $ours_step, $twin |"$'\n'
  done
  if [[ -z "$lines" ]]; then echo "(no twin ran: see the steps)"; return 0; fi
  cat <<'EOF'
The C++ programs of this repository and their PyTorch twins on the same GPU, data, model and
recipe, in the same precision: fp32 is fp32 in both (TF32 off in PyTorch, whose default lets
cuDNN's convolutions use TF32); tf32 is the C++ `--precision tf32` beside PyTorch with TF32 in
matmuls and convolutions; bf16 is the C++ `--precision bf16` beside PyTorch's autocast to bf16
(with the channels_last layout). Seconds per epoch leave out the first epoch on both sides.
Time, PyTorch ÷ ours: above 1, this repository's run is the faster. Each side's command is in
the steps table (the last column names the two steps).

| model | recipe | ours: s/epoch | ours: test acc | PyTorch: s/epoch | PyTorch: test acc | time, PyTorch ÷ ours | steps |
|---|---|---|---|---|---|---|---|
EOF
  printf '%s' "$lines"
}

# ctest's summary for the suite step, and the tests that failed or did not run.
test_suite_section() {
  local log=$logs_dir/ctest.log list
  [[ -f "$log" ]] || { echo "(not run)"; return 0; }
  if [[ "$mode" == no-gpu ]]; then
    echo "No GPU: only a fast subset ran (the tests named *_help), to check that ctest's report is read right. This is not the test suite's verdict."
  else
    echo "The whole suite but the \`gpu\` tests (the steps above), this script's own tests (\`gpu_check\`), the PyTorch comparisons (\`torch\`: they run \`/usr/bin/python3\`), the runs under SLURM (\`scheduler\`) and the offline kit's check (\`offline_kit\`)$([[ "$gpu_count" -ge 2 ]] || echo ", and with one GPU the checks that need two (\`multi_gpu\`)"); on a GPU machine no test may fail or be skipped."
  fi
  echo
  echo "\`$(command_text "${suite_command[@]}")\`: $(grep -E 'tests passed, [0-9]+ tests? failed out of' "$log" || echo "no summary line")"
  for heading in "The following tests FAILED:" "The following tests did not run:"; do
    list=$(lines_after "$heading" "$log")
    [[ -z "$list" ]] || printf '\n%s\n\n```\n%s\n```\n' "$heading" "$list"
  done
}

# The peer-access matrix chapter 02 prints, from the widest of its runs that has one.
peer_access() {
  local name log
  for name in 02_data_parallel_all_gpus 02_data_parallel_2dev_1gpu 02_data_parallel_1dev; do
    log=$logs_dir/$name.log
    if grep -q '^peer access' "$log" 2>/dev/null; then
      printf 'From `gpu_check/%s.log`:\n\n```\n' "$name"
      awk '/^peer access/ { on = 1; print; next } on && /^( |cuda:|\()/ { print; next } on { exit }' "$log"
      echo '```'
      return 0
    fi
  done
  echo "(no chapter 02 log printed one)"
}

# The kernel tables of the --profile on runs, and the benchmarks' tables as they were printed
# (each from its "# allreduce, ..." heading to the next empty line, with what was checked).
benchmarks() {
  local step start log any=no
  for step in "01_lenet_1dev kernel by kernel" "09_resnet_1dev kernels [(]"; do
    read -r step start <<<"$step"
    log=$logs_dir/$step.log
    [[ -f "$log" ]] || continue
    any=yes
    printf '### %s: one training step, kernel by kernel\n\n```\n' "$step"
    awk -v start="$start" '$0 ~ start { on = 1 } on { print } /the same step without/ { on = 0 }' "$log"
    printf '```\n\n'
  done
  for step in 03_allreduce_bench 04_allreduce_bench; do
    log=$logs_dir/$step.log
    if [[ ! -f "$log" ]] || grep -q ' | not run: ' "$logs_dir/$step.row"; then continue; fi
    any=yes
    printf '### %s\n\n`%s` (log: `gpu_check/%s.log`)\n\n```\n' "$step" "$(head -n 1 "$log" | cut -c 3-)" "$step"
    awk '/^# allreduce/ { on = 1 } on && /^$/ { on = 0; print ""; next } on || /checked|no nccl column/' "$log"
    printf '```\n\n'
  done
  # Chapter 10's table: each kernel and shape, chapter 09's kernel and the raw one, against the
  # copy rate it measured first.
  log=$logs_dir/10_fast_kernels.log
  if [[ -f "$log" ]] && ! grep -q ' | not run: ' "$logs_dir/10_fast_kernels.row" 2>/dev/null; then
    any=yes
    printf '### 10_fast_kernels\n\n`%s` (log: `gpu_check/10_fast_kernels.log`)\n\n```\n' "$(head -n 1 "$log" | cut -c 3-)"
    awk '/^copy rate:/ { on = 1 } on' "$log"
    printf '```\n\n'
  fi
  [[ "$any" == yes ]] || printf '(none ran)\n\n'
}

write_report() {
  local step
  {
    echo "# GPU check"
    echo
    if [[ "$mode" == no-gpu ]]; then
      echo "> **This is NOT a GPU validation.** No NVIDIA GPU answered ($gpu_problem). The script ran"
      echo "> with \`--allow-no-gpu\`: the steps that need a GPU are marked \"not run: no GPU\", the others"
      echo "> ran on the build's own backend (see the backend column). This report only shows that the"
      echo "> script's own parts work: its command line, running the steps, reading their result"
      echo "> lines, writing this report."
      echo
    fi
    if [[ "$quick" == yes ]]; then
      echo "Mode: **--quick** (short runs: each step's command says how short; test accuracy not judged;"
      echo "benchmarks up to 1 MiB). Times and accuracies here are not d2l's and are not to be compared with it."
    else
      echo "Mode: full (d2l's defaults: 10 epochs, batch 256, lr 0.2, all 60,000 training images; every"
      echo "training must end above test accuracy 0.50). Benchmarks up to 64 MiB."
    fi
    echo
    [[ -z "$only" ]] || printf 'Parts: **only %s** (`--only`); the other parts were not run and are not in this report.\n\n' "$only"
    echo "Total time: $(seconds_since "$check_started") s. Every step's full output is in \`gpu_check/<step>.log\` next to this file."
    printf '\n## Machine\n\n| | |\n|---|---|\n'
    machine_table
    if grep -q 'mgpu configuration' "$logs_dir/configure.log" 2>/dev/null; then
      printf "\nThe build's configure report:\n\n\`\`\`\n"
      awk '/mgpu configuration/ { on = 1 } on && /^-- *$/ { exit } on { sub(/^-- /, ""); print }' "$logs_dir/configure.log"
      echo '```'
    fi
    printf '\n## Steps\n\n| step | what | outcome | exit | seconds | command |\n|---|---|---|---|---|---|\n'
    printf '%s\n' "${rows[@]}"
    echo
    echo "## Training runs"
    echo
    echo "One row per \`result:\` line. Chapter 02 trains on 1 device and then on k; chapter 03 with"
    echo "chapter 02's allreduce and with the ring; chapter 04 with the ring, ncclSum and ncclAvg."
    echo "Chapter 01 trains on exactly one device, so it has no multi-device runs."
    printf '\n| step | run | backend | devices | epochs | test_acc | sec_per_epoch | samples_per_sec | other keys |\n'
    echo "|---|---|---|---|---|---|---|---|---|"
    while IFS=$'\t' read -r step _; do
      cat "$logs_dir/$step.runs" 2>/dev/null || true
    done < <(cmake -P "$here/steps.cmake" 2>&1)
    printf '\n## This repository against PyTorch\n\n'
    twin_comparison
    printf '\n## Test suite\n\n'
    test_suite_section
    printf '\n## Peer access\n\n'
    peer_access
    if [[ "$mode" == gpu ]]; then
      printf '\n## Topology (nvidia-smi topo -m)\n\n```\n%s\n```\n' "$(nvidia-smi topo -m 2>&1 || true)"
    fi
    printf '\n## Benchmarks\n\n'
    benchmarks
    printf '## Verdict\n\n'
    verdict
  } >"$report"
}
