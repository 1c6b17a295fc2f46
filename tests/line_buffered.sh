#!/usr/bin/env bash
# A program's output is line-buffered (common/program.h): a line it prints early is in its log
# while it still runs. Fully buffered, as the C library does where stdout is a file, the lines
# would wait for 4 KiB or the exit, and the log of a job killed mid-run would be empty.
#
#   tests/line_buffered.sh <program> <results folder>
#
# The program trains for 100 epochs, its output into a file; the test waits until the data
# line ("Fashion-MNIST from ...") is in that file, checks the program is still running then
# (so the line was written as printed, not at exit), and stops it. No timing is assumed: on a
# busy machine the line comes later and the test waits for it, up to 10 minutes.
set -u
program=$1
out=$2
mkdir -p "$out" || exit 1
log=$out/log
"$program" --epochs 100 --out "$out" >"$log" 2>&1 &
pid=$!
trap 'kill -KILL "$pid" 2>/dev/null' EXIT
for _ in $(seq 3000); do  # 3,000 times 0.2 s: 10 minutes
  if grep -q '^Fashion-MNIST from' "$log"; then
    if kill -0 "$pid" 2>/dev/null; then
      echo "the data line was in the log while the program still ran: output is line-buffered"
      exit 0
    fi
    echo "the program had exited before its data line was seen (a 100-epoch run ends in hours):"
    cat "$log"
    exit 1
  fi
  if ! kill -0 "$pid" 2>/dev/null; then
    # Ended without the line: the log says why (a missing dataset, or no GPU in a cuda build).
    wait "$pid"
    status=$?
    cat "$log"
    echo "the program exited with status $status before printing its data line"
    exit 1
  fi
  sleep 0.2
done
echo "no data line in the log after 10 minutes while the program ran: output is not line-buffered:"
cat "$log"
exit 1
