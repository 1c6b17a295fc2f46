#!/usr/bin/env bash
# Under an ulimit -v too small for it, a program says so and ends with status 1; it never hangs
# (Debian's OpenBLAS retries a failed mapping forever: common/memory.h).
#   - 200 MB: before main(), at OpenBLAS's start-up: the refusal of common/program.cpp's
#     .preinit_array entry, even for --help;
#   - 700 MB: LeNet's first matrix product, which would need a buffer more: the refusal of
#     common/gemm.cpp, naming the room needed and the room left;
#   - unlimited: the same run trains.
# A hang is a run that is still going after 60 s (status 124 from timeout).
#   tests/address_space_limits.sh LENET OUT
set -uo pipefail
lenet=$1 out=$2
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
# limited KB ARGS...: the program under ulimit -v KB; its output in $output, its status in $status
limited() {
  local kb=$1
  shift
  status=0
  output=$(timeout 60 bash -c 'ulimit -v "$0" && exec "$@"' "$kb" "$lenet" "$@" 2>&1) || status=$?
}
rm -rf "$out"
run_args=(--epochs 1 --limit-train 512 --progress off --out "$out")

limited $((200 * 1024)) --help
[ "$status" -eq 1 ] || fail "200 MB, --help: status $status, expected 1 (124: it hung)"
grep -q "^01_lenet: error: ulimit -v leaves this program less than 320 MB of address space to start in" <<<"$output" ||
  fail "200 MB: no refusal naming the limit: $output"

limited $((700 * 1024)) "${run_args[@]}" --run-name limited_700
[ "$status" -eq 1 ] || fail "700 MB: status $status, expected 1 (124: it hung)"
grep -q "01_lenet: error: a matrix product ([0-9]* computing at once) needs room for one more OpenBLAS buffer, 136 MB of address space, and the address space ulimit -v leaves this process is [0-9]* MB" <<<"$output" ||
  fail "700 MB: no refusal naming the room needed and left: $output"

limited unlimited "${run_args[@]}" --run-name unlimited
[ "$status" -eq 0 ] || fail "unlimited: status $status: $output"
grep -q "^result: chapter=01_lenet" <<<"$output" || fail "unlimited: no result line"

if [ "$failures" -gt 0 ]; then exit 1; fi
echo "PASS: under a small ulimit -v the program says why and ends; it never hangs"
