#!/usr/bin/env bash
# tools/classroom/sandbox.sh keeps each of its promises, each tried by a command that means to
# break it: a file outside its folders is unreadable, a folder given read-only is not written,
# the network is unreachable, a process started with setsid dies with the sandbox, the time
# limit kills (status 124), the output is cut (status 125), /tmp is as large as asked and no
# larger, the address space is bounded, the processes are counted (and the command never runs as
# root), and a wrong command line is refused (status 2).
# Exit status 77 (ctest: skipped) where no sandbox can be made on this machine, saying why.
#
#   tests/tools/sandbox.sh      (a few seconds)
set -uo pipefail
sandbox=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/tools/classroom/sandbox.sh
work=$(mktemp -d "${TMPDIR:-/tmp}/mgpu-sandbox.XXXXXX")
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

why=$("$sandbox" -- true 2>&1)
case $? in
  0) ;;
  77) echo "skipped: $why"; exit 77 ;;
  *) echo "FAIL: the sandbox does not run 'true': $why"; exit 1 ;;
esac

mkdir -p "$work/ro" "$work/rw" "$work/outside"
echo "the secret" >"$work/outside/secret"
echo "given" >"$work/ro/given"
run() {  # EXPECTED_STATUS ARGS...: sandbox.sh ARGS, its output in $out
  local expected=$1 status=0
  shift
  out=$("$sandbox" "$@" 2>&1) || status=$?
  [ "$status" -eq "$expected" ] || fail "sandbox.sh $*: status $status, expected $expected; it said: $(head -c 300 <<<"$out")"
}

echo "-- it sees what it is given, and nothing else"
run 0 --ro "$work/ro" --rw "$work/rw" -- sh -c "cat '$work/ro/given'; cat '$work/outside/secret' 2>&1; ls / | tr '\n' ' '; ls /etc | tr '\n' ' '"
grep -q '^given$' <<<"$out" || fail "the --ro folder's file could not be read: $out"
! grep -q 'the secret' <<<"$out" || fail "a file outside the folders given was read"
! grep -qw 'shadow' <<<"$out" || fail "/etc/shadow is in the sandbox's /etc"
for top in home root var opt srv mnt media; do  # the host's folders: none is there
  ! grep -qw "$top" <<<"$(sed -n 3p <<<"$out")" || fail "/$top is in the sandbox: $(sed -n 3p <<<"$out")"
done
run 0 --ro "$work/ro" --rw "$work/rw" -- sh -c "echo x >'$work/rw/made' && echo wrote"
[ -f "$work/rw/made" ] || fail "the --rw folder could not be written"
run 0 --ro "$work/ro" -- sh -c "echo x >'$work/ro/made' 2>/dev/null || echo refused; echo x >'$work/outside/made' 2>/dev/null || echo refused"
[ ! -e "$work/ro/made" ] || fail "the --ro folder was written"
[ ! -e "$work/outside/made" ] || fail "a folder not given was written"

echo "-- no network"
run 0 -- bash -c "exec 3<>/dev/tcp/127.0.0.1/22 2>/dev/null && echo reached || echo unreachable; exec 4<>/dev/tcp/1.1.1.1/80 2>/dev/null && echo reached || echo unreachable"
[ "$(grep -cx unreachable <<<"$out")" -eq 2 ] || fail "a connection was made: $out"

echo "-- nothing outlives it"
# A process that leaves with setsid, and one left behind by a subshell, each meant to write into
# the --rw folder a second after the command ended: a survivor would (its view of the folder
# lives as long as it does).
run 0 --rw "$work/rw" -- sh -c "setsid sh -c 'sleep 1; echo late >$work/rw/late1' >/dev/null 2>&1 &
  (sh -c 'sleep 1; echo late >$work/rw/late2' >/dev/null 2>&1 &); echo started"
sleep 2
[ ! -e "$work/rw/late1" ] || fail "a process started with setsid outlived the sandbox"
[ ! -e "$work/rw/late2" ] || fail "a process left behind by a subshell outlived the sandbox"

echo "-- the limits: time (124), output (125), /tmp's size, address space, file size"
start=$(date +%s)
run 124 --time 2 -- sh -c 'sleep 30'
[ $(($(date +%s) - start)) -le 6 ] || fail "the time limit of 2 s took $(($(date +%s) - start)) s"
run 125 --output 1000 -- sh -c 'head -c 100000 /dev/zero | tr "\0" x; echo done'
came=$(head -n 1 <<<"$out" | tr -cd x | wc -c)  # the command's x's: the line before the script's note
[ "$came" -eq 1000 ] || fail "$came bytes of the command's came out, not 1000"
grep -q 'the output went past 1000 bytes' <<<"$out" || fail "the cut output does not say so: $(tail -c 200 <<<"$out")"
run 0 --tmp-size 4 -- sh -c 'head -c 8000000 /dev/zero >/tmp/fill 2>/dev/null; wc -c </tmp/fill'
[ "$(tail -n 1 <<<"$out")" -le $((4 * 1024 * 1024)) ] || fail "/tmp took $(tail -n 1 <<<"$out") bytes, more than 4 MiB"
run 0 --memory 64 -- sh -c 'dd if=/dev/zero of=/dev/null bs=100M count=1 2>&1; dd if=/dev/zero of=/dev/null bs=8M count=1 2>&1'
grep -q 'memory exhausted' <<<"$out" || fail "a buffer of 100 MiB was had under a 64 MiB address space: $out"
grep -q '^8388608 bytes' <<<"$out" || fail "a buffer of 8 MiB was refused under a 64 MiB address space: $out"
run 0 --file-size 1 -- sh -c 'head -c 3000000 /dev/zero >/tmp/big 2>/dev/null; wc -c </tmp/big'
[ "$(tail -n 1 <<<"$out")" -le $((1024 * 1024)) ] || fail "a file of $(tail -n 1 <<<"$out") bytes was written under --file-size 1"

echo "-- processes: at most --processes of its user's, and that user never root"
# The limit counts every process of the user the command runs as (root's sandbox runs it as
# --user, 65534 by default): room for 10 more than that user has now, and 100 asked for.
[ "$(id -u)" -eq 0 ] && as=65534 || as=$(id -u)
limit=$(($(ps -U "$as" --no-headers | wc -l) + 10))
run 0 --rw "$work/rw" --processes "$limit" -- sh -c "id -u; sh -c 'for i in \$(seq 100); do sleep 2 & done; echo started all' 2>/dev/null; echo x >'$work/rw/by_user'"
[ "$(head -n 1 <<<"$out")" = "$as" ] || fail "the command ran as user $(head -n 1 <<<"$out"), not $as"
! grep -q 'started all' <<<"$out" || fail "100 processes were started under --processes $limit"
[ -f "$work/rw/by_user" ] || fail "the --rw folder could not be written by user $as"
owner=$(stat -c %u "$work/rw/by_user")
[ "$owner" -eq "$(id -u)" ] || fail "the --rw folder's files were not given back: owned by $owner, not $(id -u)"

echo "-- a wrong command line"
run 2 --time 0 -- true
run 2 --ro "$work/none" -- true
run 2 --bogus -- true
run 2 --tmpfs relative/path -- true
run 2 --chdir relative/path -- true
run 2 --user 0 -- true
run 2

if [ "$failures" -gt 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "PASS: the sandbox keeps what it promises"
