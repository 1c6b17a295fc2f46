#!/usr/bin/env bash
# tools/gpu_check.sh stopped by a TERM (as by Ctrl-C), then by a HUP (a closed terminal or ssh
# session), while a step runs: it must still write its whole report, ending in its verdict (FAIL,
# with the step "interrupted"), exit with 130, and leave no process of its own running.
# (A bare `return` in a function the trap calls returned the interrupted wait's 143, and set -e
# ended the report halfway: this test would have caught it.)
#   tests/gpu_check_interrupted.sh GPU_CHECK BUILD_DIR OUT_DIR
set -uo pipefail
script=$1 build=$2 out=$3
if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU [0-9]*:'; then
  echo "gpu_check test skipped: a GPU answers (nvidia-smi -L); there, run tools/gpu_check.sh itself"
  exit 0
fi
for signal in TERM HUP; do
  rm -rf -- "$out"
  "$script" --allow-no-gpu --skip-build --quick --build-dir "$build" --out "$out" &
  pid=$!
  sleep 10  # well inside the sequence (a minute or more), and after the trap is set
  kill -"$signal" "$pid"
  wait "$pid"
  status=$?
  report=$out/gpu_check.md
  fail() { echo "gpu_check_interrupted ($signal): $1"; [[ -f "$report" ]] && cat "$report"; exit 1; }
  [[ "$status" -eq 130 ]] || fail "exit status $status, expected 130"
  [[ -f "$report" ]] || fail "no report at $report"
  grep -q '^| interrupted | the check was interrupted | FAIL: interrupted |' "$report" || fail "no 'interrupted' step in the report"
  last=$(tail -n 1 "$report")
  [[ "$last" == "gpu_check: FAIL ("* ]] || fail "the report's last line is '$last', not the verdict 'gpu_check: FAIL (...)'"
  # Nothing of the check outlives it: no step's program, no ctest it started, still runs.
  sleep 1
  if pgrep -f -- "--out $out" >/dev/null || pgrep -f -- "$out/" >/dev/null; then
    fail "a process of the check still runs after it exited: $(pgrep -af -- "$out" | head -n 3)"
  fi
  echo "$signal after 10 s: exit status 130, the report ends with '$last'"
done
