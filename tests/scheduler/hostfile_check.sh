#!/usr/bin/env bash
# Chapter 05 on two "machines" that are this one: mpirun with a host file of two host names,
# node-a and node-b, one slot each, and rsh_agent.sh in place of ssh (it starts Open MPI's
# daemon for each host here, under that host name where the machine allows it). Open MPI then
# believes it runs on two nodes, one rank on each, so the multi-node path is taken: rank 1 has
# local rank 0 (its machine's first rank), and the gradients cross between the "machines"
# over TCP instead of shared memory. The run must say so ("2 process(es) on 2 machine(s)",
# "rank 1: host node-b, local rank 0 of 1") and train exactly as mpirun -np 2 on one machine.
#
#   hostfile_check.sh --program <05_multi_process> --launch "<mpiexec -n 2 ...>" -- <args...>
#
# --bind-to none: each daemon believes it has the whole machine to itself and would bind its one
# rank to core 0, both ranks on the same core (the run then takes about 5 times as long).
# Skipped (status 77) where mpiexec is not Open MPI's (failed with MGPU_REQUIRE_SCHEDULER_TESTS=1).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/common.sh"
parse_command_line "$@"

# One OpenMP thread per rank in every run: under mpirun -np 2 each rank is bound to one core,
# on the two "machines" neither is, and more threads would mean another order of float additions.
export OMP_NUM_THREADS=1
# The gradients summed with MPI in both runs, in every build. On a GPU machine the two
# "machines" are one: each rank, local rank 0 of its own, takes GPU 0, and as the ranks name
# their GPUs by host name and bus id, they would not see that they share it: NCCL would be
# chosen and would refuse two ranks on one GPU.
args+=(--collective mpi)
work=$(mktemp -d "${TMPDIR:-/tmp}/mgpu-hostfile.XXXXXX")
trap 'rm -rf "$work"' EXIT

run_reference

names=yes  # whether the agent can give each daemon its own host name (a UTS namespace)
unshare --uts true 2>/dev/null || names=no
[ "$names" = yes ] || echo "note: unshare --uts is refused here: both \"machines\" keep this machine's host name"
printf 'node-a slots=1\nnode-b slots=1\n' >"$work/hostfile"
run_logged hostfile 90 "${launch_words[@]}" --hostfile "$work/hostfile" --mca plm_rsh_agent "$here/rsh_agent.sh" \
  --bind-to none -x OMP_NUM_THREADS "$program" "${args[@]}" --out "$work/out-hostfile" ||
  fail "mpirun with the host file failed"

grep -q "^05_multi_process: 2 process(es) on 2 machine(s)," "$work/hostfile.log" ||
  fail "the run should have counted 2 machines"
for rank in 0 1; do
  host='[^,]+'
  [ "$names" = yes ] && host=$([ "$rank" = 0 ] && echo node-a || echo node-b)
  grep -qE "^rank $rank: host $host, local rank 0 of 1," "$work/hostfile.log" ||
    fail "rank $rank should be alone on its machine ($host): 'rank $rank: host $host, local rank 0 of 1'"
done
echo "rank 1 is local rank 0 on its machine: $(grep '^rank 1: ' "$work/hostfile.log")"
same_curve hostfile
echo "passed: two ranks on two \"machines\" train exactly as on one"
