#!/usr/bin/env bash
# Under an ulimit -v too small for it, a program says so and ends with status 1; it never hangs
# (Debian's OpenBLAS retries a failed mapping forever: common/memory.h).
#   - 200 MB: before main(), at OpenBLAS's start-up: the refusal of common/program.cpp's
#     .preinit_array entry, even for --help;
#   - 300 MB to 1 GB, every 50 MB: LeNet on 512 images trains, or ends with one of the sentences
#     the program has for too little memory; somewhere in that sweep (where depends on the
#     compiler's OpenMP runtime: 650-750 MB with GCC's, 500-650 with LLVM's) the first matrix
#     product is refused by common/gemm.cpp's check, naming the room needed and the room left;
#   - unlimited: the same run trains.
# A hang is a run still going after 60 s (status 124 from timeout). About 15 s in all.
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

product_refused=0
for mb in $(seq 300 50 1000); do
  limited $((mb * 1024)) "${run_args[@]}" --run-name "limited_$mb"
  case "$status" in
    0) grep -q "^result: chapter=01_lenet" <<<"$output" || fail "$mb MB: status 0 without a result line" ;;
    1)
      if grep -q "01_lenet: error: a matrix product ([0-9]* computing at once) needs room for one more OpenBLAS buffer, 136 MB of address space, and the address space ulimit -v leaves this process is [0-9]* MB" <<<"$output"; then
        product_refused=$((product_refused + 1))
      elif ! grep -Eq "01_lenet: error: (out of memory|ulimit -v leaves this program less than|[0-9]+ matrix product\(s\) have waited)" <<<"$output"; then
        fail "$mb MB: status 1 without a sentence about memory: $output"
      fi ;;
    124) fail "$mb MB: still running after 60 s: it hung" ;;
    *) fail "$mb MB: status $status: $output" ;;
  esac
  echo "$mb MB: status $status"
done
[ "$product_refused" -gt 0 ] || fail "no limit from 300 MB to 1 GB reached the check before the first matrix product"

limited unlimited "${run_args[@]}" --run-name unlimited
[ "$status" -eq 0 ] || fail "unlimited: status $status: $output"
grep -q "^result: chapter=01_lenet" <<<"$output" || fail "unlimited: no result line"

if [ "$failures" -gt 0 ]; then exit 1; fi
echo "PASS: under a small ulimit -v the program says why and ends; it never hangs"
