#!/usr/bin/env bash
# What a figure was measured on: prints a few "key: value" lines (the CPU and its cores, the
# GPUs and their driver, the CUDA, NCCL, MPI and BLAS versions found, the commit, the date), so
# that a results file says where its numbers come from. The results scripts write it beside
# their CSVs as NAME.stamp.txt. A tree with changes its commit has not (tools/source_changes.sh)
# gets a WARNING line at the top, the changed paths, and "+ UNCOMMITTED CHANGES" after the commit.
#
#   tools/machine_stamp.sh [BUILD_DIR]
# With BUILD_DIR, NCCL's version is the one that build's programs load (its bin/nccl_version,
# where it has one): the loader may take another libnccl than the header's.
# (The backend of a run is in its result line.)
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

value() { [ -n "$2" ] && printf '%-9s %s\n' "$1:" "$2"; }

# The commit first: a stamp of a tree with changes says so on its first line, loudly. (The figure
# scripts refuse such a tree unless MGPU_FIGURES_ALLOW_DIRTY=1: tools/figures_common.sh.)
commit=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || true)
changes=""
count=0
if [ -n "$commit" ]; then
  changes=$("$root/tools/source_changes.sh" 2>/dev/null || true)
  [ -n "$changes" ] && count=$(printf '%s\n' "$changes" | wc -l)
fi
if [ -z "$commit" ]; then
  value WARNING "NOT MADE FROM A COMMIT: $root is not a git checkout"
elif [ "$count" -gt 0 ]; then
  value WARNING "NOT MADE FROM A COMMIT: $count uncommitted change(s) on top of $commit (listed below)"
fi

cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo 2>/dev/null | head -n 1)
value cpu "${cpu:-unknown} ($(nproc) cores available)"
if command -v nvidia-smi >/dev/null && gpus=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null) &&
   [ -n "$gpus" ]; then
  value gpus "$(echo "$gpus" | awk -F', ' '{n[$1]++; d=$2} END {for (g in n) printf "%s%d x %s", s, n[g], g; s=", "; printf " (driver %s)", d}')"
else
  value gpus "none"
fi
nvcc=/usr/local/cuda/bin/nvcc
command -v nvcc >/dev/null && nvcc=$(command -v nvcc)
[ -x "$nvcc" ] && value cuda "$("$nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')"
loaded=""
if [ -n "${1:-}" ] && [ -x "$1/bin/nccl_version" ]; then
  loaded=$("$1/bin/nccl_version" 2>/dev/null | awk '$1 == "library" {print $2 " (" $3 ", loaded)"}')
fi
if [ -n "$loaded" ]; then
  value nccl "$loaded"
else
  for header in /usr/local/cuda/include/nccl.h /usr/include/nccl.h; do
    if [ -f "$header" ]; then
      value nccl "$(awk '/#define NCCL_(MAJOR|MINOR|PATCH) /{v = v (v ? "." : "") $3} END {print v}' "$header") (header $header)"
      break
    fi
  done
fi
command -v mpirun >/dev/null && value mpi "$(mpirun --version 2>/dev/null | head -n 1)"
blas=$(dpkg-query -W -f '${Package} ${Version}\n' 'libopenblas0*' 2>/dev/null | awk '$2 != "" {print; exit}')
value blas "$blas"
# A figure script notes the commit its runs began at (tools/figures_common.sh): that is the code
# that ran, though HEAD may have moved on since (figures committed between two scripts).
moved=""
if [ -n "${MGPU_FIGURES_COMMIT:-}" ] && [ -n "$commit" ] && [ "$MGPU_FIGURES_COMMIT" != "$commit" ]; then
  moved=$commit
  commit=$MGPU_FIGURES_COMMIT
fi
if [ -n "$commit" ]; then
  if [ -n "$changes" ]; then
    value changed "$(printf '%s\n' "$changes" | head -n 5 | sed 's/^...//' | paste -sd ' ')$([ "$count" -gt 5 ] && echo " ...")"
    commit="$commit + UNCOMMITTED CHANGES"
  fi
  value commit "$commit"
  [ -n "$moved" ] && value moved "HEAD is at $moved now; the runs began at the commit above"
fi
value date "$(date -u '+%Y-%m-%d %H:%M UTC')"
