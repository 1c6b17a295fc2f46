#!/usr/bin/env bash
# Stands in for ssh when mpirun is given host names that are all this machine:
#
#   mpirun --hostfile hosts --mca plm_rsh_agent tests/scheduler/rsh_agent.sh ...
#
# Open MPI starts its daemon (orted) on every host of the host file by running
# "<agent> <host> <command>", the command being one string for the remote shell, as with ssh.
# This agent runs it here instead, as a shell on the far side would: where the machine allows
# it (root, and a kernel that lets it make namespaces), in a UTS namespace of its own whose
# host name is <host>, so that the daemon and the ranks it starts report that name. Open MPI
# counts every daemon as a machine of its own either way: the ranks of one daemon are one
# node for MPI_COMM_TYPE_SHARED, whatever its host name.
set -euo pipefail
while [ $# -gt 0 ] && [[ "$1" == -* ]]; do shift; done  # ssh-style options, should mpirun add any
[ $# -ge 2 ] || { echo "usage: rsh_agent.sh [options] <host> <command...>" >&2; exit 2; }
host=$1
shift
command="$*"  # a shell command line, "PATH=...; export PATH; ... orted ...", as ssh would hand its shell
if unshare --uts true 2>/dev/null; then
  exec unshare --uts bash -c 'hostname "$0" && eval "$1"' "$host" "$command"
fi
exec bash -c "$command"
