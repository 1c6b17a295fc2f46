#!/usr/bin/env bash
# Chapter 05 under a real SLURM: a one-node cluster on this machine, started here and stopped
# at the end whatever happens (munged, slurmctld and slurmd from Debian's slurm-wlm, run as
# daemons of this script, all their configuration, state and logs in one temporary folder,
# their ports chosen free). On it:
#
#   - srun -n 2 --gpus-per-task=1 prints each task's launch variables: SLURM_PROCID,
#     SLURM_LOCALID, SLURM_NTASKS and CUDA_VISIBLE_DEVICES must be what the README says
#     (the node has two stand-in "GPUs" for this; the program runs never ask for them);
#   - srun --mpi=pmix -n 2 runs the program: it must find the same world (ranks, local ranks)
#     and train exactly as mpirun -np 2 does;
#   - mpirun inside an allocation (salloc -n 2 mpirun, no -np): the same;
#   - rank 1 kills itself under srun --kill-on-bad-exit=1: every rank stops, srun fails, soon;
#   - the chapter's sbatch script (chapters/05_multi_process/lenet.sbatch), unchanged, submitted
#     with its #SBATCH settings adapted to this one node on sbatch's command line (--nodes=1
#     --ntasks-per-node=2 --gpus-per-node=0 --cpus-per-task=1): it sizes the batch and the rate
#     from the job's 2 tasks, the same curve again, and the checkpoint it asks for is written.
#
#   slurm_check.sh --program <05_multi_process> --launch "<mpiexec -n 2 ...>" --script <lenet.sbatch> -- <args...>
#
# Skipped (status 77, with the reason) where SLURM cannot start here: not installed (apt-get
# install slurmctld slurmd slurm-client munge), not root, fewer than 2 CPUs, no Open MPI; with
# MGPU_REQUIRE_SCHEDULER_TESTS=1 (CI) these fail instead. Once it is installed and this is root,
# a cluster that does not come up is a failure, with its logs.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/common.sh"
parse_command_line "$@"
[ -f "$script" ] || fail "--script '$script': no such file"

PATH=$PATH:/usr/sbin:/sbin  # the daemons live in sbin, which a user's PATH may lack
[ "$(id -u)" = 0 ] || cannot_run "slurmd must run as root to start job steps, and this is user $(id -un)"
for command in munged mungekey munge slurmctld slurmd srun sbatch salloc sinfo squeue scancel; do
  command -v "$command" >/dev/null ||
    cannot_run "$command not found: SLURM is not installed (apt-get install slurmctld slurmd slurm-client munge)"
done
[ "$(nproc)" -ge 2 ] || cannot_run "2 tasks of one CPU each need 2 CPUs, and this machine has $(nproc)"

# Nothing of a SLURM job this script may itself run in must reach our cluster's commands.
for variable in $(compgen -e | grep -E '^(SLURM|SBATCH|SRUN|SALLOC)_' || true); do unset "$variable"; done
# One OpenMP thread per rank in every run: how many threads a rank gets depends on how the
# launcher binds it (mpirun binds 2 ranks to a core each; SLURM to its --cpus-per-task), and
# more threads mean more lanes, another order of float additions and another curve.
export OMP_NUM_THREADS=1

work=$(mktemp -d "${TMPDIR:-/tmp}/mgpu-slurm.XXXXXX")
chmod 755 "$work"  # munged wants every folder above its socket open to all (the key stays 0600)
mkdir -m 700 "$work/munge"
mkdir "$work/state" "$work/spool" "$work/spool/node1" "$work/log" "$work/job" "$work/tmp"
munged_pid="" slurmctld_pid="" slurmd_pid=""

# stop <pid>...: SIGTERM, up to 15 s to exit, then SIGKILL. Only this script's own daemons.
stop() {
  local pid left
  for pid in "$@"; do kill -TERM "$pid" 2>/dev/null || true; done
  for _ in $(seq 30); do
    left=""
    for pid in "$@"; do if kill -0 "$pid" 2>/dev/null; then left="$left $pid"; fi; done
    [ -z "$left" ] && return 0
    sleep 0.5
  done
  for pid in $left; do kill -KILL "$pid" 2>/dev/null || true; done
}

cleanup() {
  local status=$?
  set +e
  if [ -n "$slurmctld_pid" ]; then
    # Jobs first, so that no job step (a slurmstepd and its ranks) outlives slurmd.
    scancel --quiet --user "$(id -un)" 2>/dev/null
    for _ in $(seq 40); do
      [ -z "$(squeue --noheader 2>/dev/null)" ] && break
      sleep 0.5
    done
    if [ -n "$(squeue --noheader 2>/dev/null)" ]; then
      echo "jobs still listed after scancel:"
      squeue
    fi
  fi
  # slurmd first, while slurmctld and munged still answer the job steps it winds up.
  for pid in "$slurmd_pid" "$slurmctld_pid" "$munged_pid"; do [ -n "$pid" ] && stop "$pid"; done
  if [ "$status" != 0 ] && [ "$status" != 77 ]; then
    for log in "$work"/log/*; do
      [ -s "$log" ] && { echo "--- the last lines of $log:"; tail -n 25 "$log"; }
    done
  fi
  rm -rf "$work"
  exit "$status"
}
trap cleanup EXIT
trap 'exit 143' TERM INT HUP

# 1. The reference: mpirun -np 2 on this machine (before anything of SLURM starts: where the
#    program cannot train at all, say a cuda build without a GPU, the check skips at once).
run_reference

# 2. munge: SLURM's daemons and commands prove who they are with credentials that munged signs
#    with a key they share. A key of our own, and our own socket, which slurm.conf names.
mungekey --create --keyfile="$work/munge/munge.key"
socket=$work/munge.socket
munged --foreground --key-file="$work/munge/munge.key" --socket="$socket" --pid-file="$work/munged.pid" \
  --seed-file="$work/munge/seed" >"$work/log/munged.log" 2>&1 &
munged_pid=$!
for _ in $(seq 40); do
  munge --socket="$socket" --no-input 2>/dev/null | unmunge --socket="$socket" >/dev/null 2>&1 && break
  kill -0 "$munged_pid" 2>/dev/null || fail "munged stopped at once (its log follows)"
  sleep 0.25
done
munge --socket="$socket" --no-input | unmunge --socket="$socket" >/dev/null || fail "munged does not answer"

# 3. Two free ports (slurmctld's and slurmd's), found by trying: a port something listens on
#    takes a connection. Started from a number drawn from this process, away from the defaults.
port_taken() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
port=$((20000 + ($$ % 5000) * 2))
while port_taken "$port" || port_taken "$((port + 1))"; do port=$((port + 2)); done

# 4. Two stand-in GPUs: device files with /dev/null's numbers, which SLURM can hand out as
#    "gpu" resources, so that srun sets CUDA_VISIBLE_DEVICES per task as on a GPU cluster. Where
#    this machine refuses mknod, the node has none and that part of the check is left out.
gres=""
mkdir "$work/dev"
if mknod "$work/dev/gpu0" c 1 3 2>/dev/null && mknod "$work/dev/gpu1" c 1 3 2>/dev/null; then
  gres="Gres=gpu:2"
  echo "NodeName=node1 Name=gpu File=$work/dev/gpu[0-1]" >"$work/gres.conf"
else
  echo "note: mknod is refused here, so the node has no stand-in GPUs and CUDA_VISIBLE_DEVICES is not checked"
fi

# 5. The cluster: one node, "node1", that is this machine (its CPUs as slurmd -C finds them).
#    Everything in $work; no cgroups (proctrack/linuxproc), tasks bound to their CPUs
#    (task/affinity, as on most clusters), no accounting.
node=$(slurmd -C | head -n 1 | sed -E 's/^NodeName=[^ ]+/NodeName=node1 NodeAddr=127.0.0.1/')
export SLURM_CONF=$work/slurm.conf
cat >"$SLURM_CONF" <<EOF
ClusterName=mgputest
SlurmctldHost=$(hostname -s)(127.0.0.1)
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$socket
CredType=cred/munge
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool/%n
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.pid
TmpFS=$work/tmp
PlugStackConfig=$work/plugstack.conf
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SwitchType=switch/none
MpiDefault=none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
ReturnToService=2
SlurmdParameters=config_overrides
GresTypes=gpu
$node $gres State=UNKNOWN
PartitionName=test Nodes=node1 Default=YES MaxTime=INFINITE State=UP
EOF
: >"$work/plugstack.conf"  # none of the system's SPANK plugins
echo "--- $SLURM_CONF:"
cat "$SLURM_CONF"
slurmctld -D -c >"$work/log/slurmctld.log" 2>&1 &
slurmctld_pid=$!
slurmd -D -N node1 >"$work/log/slurmd.log" 2>&1 &
slurmd_pid=$!
state=""
for _ in $(seq 60); do
  state=$(sinfo --noheader --nodes=node1 --format=%T 2>/dev/null || true)
  [ "$state" = idle ] && break
  kill -0 "$slurmctld_pid" 2>/dev/null || fail "slurmctld stopped at once (its log follows)"
  kill -0 "$slurmd_pid" 2>/dev/null || fail "slurmd stopped at once (its log follows)"
  sleep 0.5
done
[ "$state" = idle ] || fail "node1 did not become idle within 30 s (it is '$state')"
srun --mpi=list 2>&1 | grep -qw pmix || fail "this SLURM has no pmix plugin (srun --mpi=list)"
echo "SLURM is up: node1 idle, slurmctld on port $port, slurmd on port $((port + 1))"

# 6. The launch variables, task by task.
gpus=()
[ -n "$gres" ] && gpus=(--gpus-per-task=1)
run_logged variables 60 srun --ntasks=2 "${gpus[@]}" bash -c \
  'echo "task $SLURM_PROCID: SLURM_PROCID=$SLURM_PROCID SLURM_LOCALID=$SLURM_LOCALID SLURM_NTASKS=$SLURM_NTASKS CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-unset}"' ||
  fail "srun could not start 2 tasks"
for task in 0 1; do
  devices="unset"
  [ -n "$gres" ] && devices=$task
  expected="task $task: SLURM_PROCID=$task SLURM_LOCALID=$task SLURM_NTASKS=2 CUDA_VISIBLE_DEVICES=$devices"
  grep -qxF "$expected" "$work/variables.log" || fail "srun should have printed '$expected'"
done

# 7. srun starts the ranks itself; Open MPI's MPI_Init finds them through SLURM's PMIx.
run_logged srun 90 srun --mpi=pmix --ntasks=2 "$program" "${args[@]}" --out "$work/out-srun" ||
  fail "srun --mpi=pmix -n 2 failed"
if [ "$(world "$work/srun.log")" != "$(world "$work/mpirun.log")" ]; then
  echo "mpirun:"; world "$work/mpirun.log"
  echo "srun:"; world "$work/srun.log"
  fail "under srun the ranks saw another world than under mpirun (above)"
fi
same_curve srun

# 8. mpirun inside an allocation (salloc), without -np: Open MPI reads the job's nodes and task
#    count from SLURM (on other nodes than its own it would start its daemons with srun).
run_logged salloc 90 salloc --nodes=1 --ntasks=2 "${launch_words[0]}" "$program" "${args[@]}" \
  --out "$work/out-salloc" || fail "mpirun inside salloc --ntasks=2 failed"
if [ "$(world "$work/salloc.log")" != "$(world "$work/mpirun.log")" ]; then
  fail "under salloc and mpirun the ranks saw another world than under mpirun alone"
fi
same_curve salloc

# 9. A rank that dies: SLURM must stop the other (--kill-on-bad-exit=1, as in the README's
#    script) and srun must end non-zero, within 60 s, the dead rank's last words printed.
status=0 started=$SECONDS
run_logged fault 60 srun --mpi=pmix --kill-on-bad-exit=1 --ntasks=2 "$program" "${args[@]}" --out "$work/out-fault" \
  --fail-rank 1 --fail-at-step 3 --fail-how kill || status=$?
took=$((SECONDS - started))
if [ "$status" = 0 ] || [ "$took" -ge 60 ]; then
  fail "srun should have ended non-zero within 60 s when rank 1 was killed (status $status after $took s)"
fi
grep -q "rank 1: injected fault at step 3" "$work/fault.log" || fail "rank 1 should have said that it kills itself"
echo "a rank killed: srun stopped every rank and exited with status $status after $took s"

# 10. The chapter's sbatch script, as committed, submitted from a folder where
#    build/bin/05_multi_process is the program under test. sbatch's own options override the
#    script's #SBATCH lines: one node, 2 tasks of one CPU, no GPU, 2 minutes. The script sizes
#    the run from the job (2 ranks: --batch-size 512 --lr 0.4); the arguments after its name reach
#    the program after its own, and a later flag wins, so the recipe is the one mpirun ran.
cp "$script" "$work/job/lenet.sbatch"
echo "--- the sbatch script:"
cat "$work/job/lenet.sbatch"
mkdir -p "$work/job/build/bin"
ln -s "$program" "$work/job/build/bin/05_multi_process"
status=0
(cd "$work/job" && run_logged submit 150 sbatch --wait --nodes=1 --ntasks-per-node=2 --gpus-per-node=0 \
  --cpus-per-task=1 --time=00:02:00 --output="$work/sbatch-job.log" lenet.sbatch "${args[@]}" \
  --out "$work/out-sbatch") || status=$?
echo "--- the job's output ($work/sbatch-job.log):"
cat "$work/sbatch-job.log" 2>/dev/null || true
[ "$status" = 0 ] || fail "the sbatch job failed (status $status)"
cp "$work/sbatch-job.log" "$work/sbatch.log"
if [ "$(world "$work/sbatch.log")" != "$(world "$work/mpirun.log")" ]; then
  fail "in the sbatch job the ranks saw another world than under mpirun"
fi
same_curve sbatch
grep -q "^lenet.sbatch: 2 ranks on 1 node(s): --batch-size 512 --lr 0.4$" "$work/sbatch-job.log" ||
  fail "the script should have sized 2 ranks as --batch-size 512 --lr 0.4 (its job log above)"
[ -f "$work/job/lenet.ckpt" ] || fail "the job should have written \$SLURM_SUBMIT_DIR/lenet.ckpt"
echo "the job wrote its checkpoint to \$SLURM_SUBMIT_DIR/lenet.ckpt"
echo "passed: srun, mpirun in an allocation and the chapter's sbatch script train exactly as mpirun does"
