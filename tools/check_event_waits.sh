#!/usr/bin/env bash
# Every event wait in the allreduces is needed, and the tests know it: this script deletes each
# `make_wait(` line of chapter 02's allreduce, chapter 03's ring and chapter 05's overlap path,
# one at a time, in a scratch copy of the repository, rebuilds the cpu backend and runs the
# suites that use them (with their chaos-mode runs). Each deletion must make a test fail.
#
#   tools/check_event_waits.sh            # one to two minutes per wait on two cores
#
# Prints one line per wait, "caught" or "NOT CAUGHT", and exits 1 if any deletion went
# unnoticed. Lines only the cuda build compiles (chapter 05's NCCL path) are listed as such:
# the cpu build cannot run them. Needs what the README's test command needs, and git.
set -euo pipefail

if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
  sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'
  exit 0
fi
if [ $# -gt 0 ]; then
  echo "check_event_waits.sh: unknown argument '$1' (try --help)" >&2
  exit 2
fi

root=$(cd "$(dirname "$0")/.." && pwd)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

# The tracked files as they are now (uncommitted edits included), without any build folders.
(cd "$root" && git ls-files -z | xargs -0 tar -cf - 2>/dev/null) | (cd "$scratch" && tar -xf -)
echo "building the cpu backend in $scratch ..."
cmake -S "$scratch" -B "$scratch/build" -DMGPU_BACKEND=cpu >/dev/null
cmake --build "$scratch/build" -j"$(nproc)" >/dev/null

suites='^(test_data_parallel|test_ring_allreduce|test_multi_process_np2|test_multi_process_np3)(_chaos[0-9]+)?$'
files=(chapters/02_data_parallel/data_parallel.cpp chapters/03_ring_allreduce/ring.cpp
       chapters/05_multi_process/collective.cpp)
missed=0
for file in "${files[@]}"; do
  original="$scratch/$file.original"
  cp "$scratch/$file" "$original"
  # Line numbers of the waits, and whether each sits inside the NCCL-only block.
  while IFS=: read -r -u 3 line where; do  # (fd 3: the builds and tests below must not eat the list)
    text=$(sed -n "${line}p" "$original" | sed 's/^ *//')
    if [ "$where" = nccl ]; then
      printf '%-45s %-60s cuda build only (NCCL), not run here\n' "$file:$line" "$text"
      continue
    fi
    sed "${line}d" "$original" >"$scratch/$file"
    if ! cmake --build "$scratch/build" -j"$(nproc)" >/dev/null 2>&1; then
      printf '%-45s %-60s does not compile without it\n' "$file:$line" "$text"
    elif ctest --test-dir "$scratch/build" -R "$suites" -j"$(nproc)" >"$scratch/ctest.log" 2>&1; then
      printf '%-45s %-60s NOT CAUGHT\n' "$file:$line" "$text"
      missed=$((missed + 1))
    else
      failed=$(grep -c '[*][*][*]Failed' "$scratch/ctest.log" || true)
      printf '%-45s %-60s caught (%s failing tests)\n' "$file:$line" "$text" "$failed"
    fi
    cp "$original" "$scratch/$file"
  done 3< <(awk '/^#if MGPU_CUDA && MGPU_HAVE_NCCL/ {nccl = 1} /^#endif/ {nccl = 0}
                /make_wait\(/ {print NR ":" (nccl ? "nccl" : "cpu")}' "$original")
done
cmake --build "$scratch/build" -j"$(nproc)" >/dev/null  # (the originals back, for a clean end)
if [ "$missed" -gt 0 ]; then
  echo "$missed event wait(s) can be deleted without any test failing"
  exit 1
fi
echo "every event wait the cpu build runs is needed: deleting any one fails a test"
