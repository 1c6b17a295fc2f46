#!/usr/bin/env bash
# Runs one command in a throwaway sandbox (bubblewrap, Debian's package bubblewrap): what the
# grader runs a student's code in. What the sandbox promises, each shown by
# tests/tools/sandbox.sh with a command that tries to break it:
#
#   - It sees only the system's programs and libraries (/usr, read-only, and the few files of
#     /etc the toolchain, the linker and MPI read), the folders given with --ro (read-only) and --rw
#     (writable), a /tmp of its own (--tmp-size, default 64 MiB, in memory) and any --tmpfs
#     folders (the same size each): not the teacher's home, repository, answer keys or the other
#     submissions, nor any file the command line does not name.
#   - No network: a network namespace of its own, with only a loopback that is down.
#   - Its own process namespace: when the command ends, or its time is up (--time, default 600
#     s), every process it started is killed with it, those that left with setsid or a double
#     fork included. Exit status 124 when the time was up (as timeout(1) says).
#   - Limits on each process (setrlimit, inherited by all it starts): address space (--memory,
#     default 4096 MiB), size of one file written (--file-size, default 256 MiB), processes of
#     its user (--processes, default 256), open files 1024.
#   - Never root: run by root, the command runs as the user --user UID (default 65534, Debian's
#     nobody). Root's own processes are exempt from the process limit (the kernel never holds
#     its first user to RLIMIT_NPROC), and root reads every file it is shown. bwrap then makes
#     no user namespace (root needs none for the others) and keeps only the capabilities to
#     change user, which setpriv drops with root's ids before the command starts. The --rw
#     folders are lent to that user for the run (chown -R) and given back to their owner after.
#     Run by another user, the command runs as that user (in a user namespace of its own).
#   - At most --output bytes (default 1 MiB) of the command's output (stdout and stderr, in one
#     stream, on stdout) come out; the command is stopped (SIGPIPE) when it writes more, and the
#     script says so and exits 125.
#
#   tools/classroom/sandbox.sh [--ro DIR]... [--rw DIR]... [--tmpfs DIR]... [--chdir DIR]
#       [--time S] [--memory MiB] [--file-size MiB] [--processes N] [--tmp-size MiB]
#       [--output BYTES] [--user UID] -- COMMAND [ARG]...
#
# Each DIR keeps its own path inside (a build folder then works where it was configured).
# Exit status: the command's; 124 when its time was up; 125 when its output was cut; 77 when no
# sandbox can be made on this machine (no bwrap, or the kernel forbids unprivileged namespaces):
# the caller decides what then; 2 for a wrong command line.
set -uo pipefail

usage="usage: tools/classroom/sandbox.sh [--ro DIR]... [--rw DIR]... [--tmpfs DIR]... [--chdir DIR] [--time S] [--memory MiB] [--file-size MiB] [--processes N] [--tmp-size MiB] [--output BYTES] [--user UID] -- COMMAND [ARG]..."
binds=() targets=() rw_dirs=() tmpfs_dirs=() chdir=/ time=600 memory=4096 file_size=256 processes=256 tmp_size=64 output=1048576
user=65534
whole() { [[ $2 =~ ^[1-9][0-9]*$ ]] || { echo "sandbox.sh: $1 '$2': a whole number, at least 1" >&2; exit 2; }; }
folder() { [ -d "$2" ] || { echo "sandbox.sh: $1 $2: no such folder" >&2; exit 2; }; }
absolute() { [[ $2 == /* ]] || { echo "sandbox.sh: $1 $2: not an absolute path" >&2; exit 2; }; }
while [ "$#" -gt 0 ]; do
  case "$1" in
    -h|--help) echo "$usage"; exit 0 ;;
    --) shift; break ;;
    --ro|--rw|--tmpfs|--chdir|--time|--memory|--file-size|--processes|--tmp-size|--output|--user)
      [ "$#" -ge 2 ] || { echo "sandbox.sh: $1 needs a value" >&2; exit 2; }
      case "$1" in
        --ro) folder "$1" "$2"; dir=$(realpath "$2"); binds+=(--ro-bind "$dir" "$dir"); targets+=("$dir") ;;
        --rw) folder "$1" "$2"; dir=$(realpath "$2"); binds+=(--bind "$dir" "$dir"); rw_dirs+=("$dir"); targets+=("$dir") ;;
        --tmpfs) absolute "$1" "$2"; tmpfs_dirs+=("$2"); targets+=("$2") ;;  # made in the sandbox where it is not
        --chdir) absolute "$1" "$2"; chdir=$2 ;;
        --time) whole "$1" "$2"; time=$2 ;;
        --memory) whole "$1" "$2"; memory=$2 ;;
        --file-size) whole "$1" "$2"; file_size=$2 ;;
        --processes) whole "$1" "$2"; processes=$2 ;;
        --tmp-size) whole "$1" "$2"; tmp_size=$2 ;;
        --output) whole "$1" "$2"; output=$2 ;;
        --user) whole "$1" "$2"; user=$2 ;;  # not 0: root is what it replaces
      esac
      shift 2 ;;
    *) echo "sandbox.sh: unknown option '$1'" >&2; echo "$usage" >&2; exit 2 ;;
  esac
done
[ "$#" -ge 1 ] || { echo "$usage" >&2; exit 2; }
command -v bwrap >/dev/null || { echo "sandbox.sh: no bwrap here (Debian's package bubblewrap): no sandbox" >&2; exit 77; }
# The folders above each one given, made in the sandbox (in its /tmp, or its root) open to all
# (0755): left to bwrap, root's sandbox makes them 0700, and --user could not pass through.
parents=()
while IFS= read -r dir; do
  [ -n "$dir" ] && parents+=(--perms 0755 --dir "$dir")
done < <(for target in "${targets[@]}"; do
           dir=$(dirname "$target")
           while [ "$dir" != / ]; do echo "$dir"; dir=$(dirname "$dir"); done
         done | sort -u)
# The --tmpfs folders go over the binds (a build's Testing/ inside a read-only copy); like /tmp,
# anyone may write in them (the sticky bit: only into what is one's own).
for dir in "${tmpfs_dirs[@]}"; do binds+=(--perms 01777 --size $((tmp_size * 1024 * 1024)) --tmpfs "$dir"); done

# /etc: only what the toolchain, the dynamic linker and MPI read (Debian's alternatives: c++,
# cc, libblas.so.3 are links through /etc/alternatives), and the users and hosts (not
# /etc/shadow, nor anything else).
etc=()
for f in /etc/alternatives /etc/ld.so.cache /etc/ld.so.conf /etc/ld.so.conf.d /etc/openmpi /etc/passwd /etc/group \
  /etc/hosts; do
  [ -e "$f" ] && etc+=(--ro-bind "$f" "$f")
done
# /usr-merged Debian: /bin, /lib, /lib64 and /sbin are links into /usr.
links=()
for l in bin lib lib64 sbin; do
  if [ -L "/$l" ]; then links+=(--symlink "$(readlink "/$l")" "/$l"); elif [ -d "/$l" ]; then links+=(--ro-bind "/$l" "/$l"); fi
done

# The namespaces, and who runs the command (see "Never root" above).
namespaces=(--unshare-all) as_user=()
if [ "$(id -u)" -eq 0 ]; then
  namespaces=(--unshare-ipc --unshare-pid --unshare-net --unshare-uts --unshare-cgroup-try
              --cap-add CAP_SETUID --cap-add CAP_SETGID)
  as_user=(setpriv --reuid="$user" --regid="$user" --clear-groups --inh-caps=-all --bounding-set=-all --)
fi

# Can a sandbox be made here at all? (A container may forbid user namespaces.)
if ! bwrap "${namespaces[@]}" --ro-bind /usr /usr "${links[@]}" -- "${as_user[@]}" /usr/bin/true 2>/dev/null; then
  echo "sandbox.sh: bwrap cannot make namespaces on this machine (unprivileged user namespaces off?): no sandbox" >&2
  exit 77
fi

limits=(prlimit --as=$((memory * 1024 * 1024)) --fsize=$((file_size * 1024 * 1024)) --nproc="$processes" --nofile=1024 --)
status_file=$(mktemp "${TMPDIR:-/tmp}/sandbox-status.XXXXXX") || exit 2
owners=()  # each --rw folder's owner (uid:gid), where they are lent to --user
give_back() {
  local i
  for i in "${!owners[@]}"; do chown -R "${owners[$i]}" "${rw_dirs[$i]}"; done
  rm -f "$status_file"
}
trap give_back EXIT
if [ "${#as_user[@]}" -gt 0 ]; then
  for dir in "${rw_dirs[@]}"; do
    owners+=("$(stat -c %u:%g "$dir")")
    chown -R "$user:$user" "$dir" || { echo "sandbox.sh: --rw $dir could not be lent to user $user" >&2; exit 2; }
  done
fi
# timeout(1) outside bwrap: at the limit bwrap gets SIGTERM (SIGKILL 2 s later), and with it
# the sandbox's process namespace goes, every process in it (--die-with-parent: the same when
# whoever runs this script dies first). The output: at most $output bytes pass; one byte more
# and the pipe is closed, so that the command's next write kills it (SIGPIPE).
{
  timeout --kill-after=2 "$time" bwrap "${namespaces[@]}" --die-with-parent --new-session \
    --ro-bind /usr /usr "${links[@]}" "${etc[@]}" --proc /proc --dev /dev \
    --perms 01777 --size $((tmp_size * 1024 * 1024)) --tmpfs /tmp "${parents[@]}" "${binds[@]}" \
    --setenv HOME /tmp --setenv TMPDIR /tmp --chdir "$chdir" \
    -- "${as_user[@]}" "${limits[@]}" "$@"
  echo "$?" >"$status_file"
} 2>&1 | {
  head -c "$output"
  if [ "$(head -c 1 | wc -c)" -ne 0 ]; then
    printf '\nsandbox.sh: the output went past %d bytes: the rest was dropped, the command stopped\n' "$output"
    exit 1
  fi
}
cut=${PIPESTATUS[1]}
status=$(cat "$status_file")
[ "$status" -eq 137 ] && status=124  # killed 2 s after the TERM: its time was up all the same
[ "$cut" -ne 0 ] && [ "$status" -ne 124 ] && status=125
exit "$status"
