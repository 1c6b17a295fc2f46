#!/usr/bin/env bash
# Chapter 05's README quotes the core of lenet.sbatch (from "ranks=${SLURM_NTASKS" to the line
# with --checkpoint): every quoted line must be a line of the script, so that the two cannot drift.
#   tests/sbatch_quoted.sh chapters/05_multi_process
set -euo pipefail
cd "$1"
quoted=$(awk '/^ranks=\$\{SLURM_NTASKS/,/--checkpoint/' README.md)
[ -n "$quoted" ] || { echo "README.md quotes no part of lenet.sbatch (a line starting 'ranks=\${SLURM_NTASKS')"; exit 1; }
status=0
while IFS= read -r line; do
  grep -qxF -- "$line" lenet.sbatch || { echo "README.md quotes a line lenet.sbatch does not have: $line"; status=1; }
done <<<"$quoted"
[ "$status" = 0 ] && echo "README.md's quote of lenet.sbatch: $(wc -l <<<"$quoted") lines, all in the script"
exit "$status"
