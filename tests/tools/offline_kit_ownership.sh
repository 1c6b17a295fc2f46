#!/usr/bin/env bash
# tools/offline_kit.sh replaces or deletes only what it can prove it wrote (its marker,
# .offline_kit, whose first line names the script and the kit's format):
#   - a folder that is not its kit (a MANIFEST of someone else's, other files) is refused and
#     left as it was; so are an old kit without the marker and a marker with another first line;
#   - a DIR.partial that is not its own is refused and left as it was;
#   - a kit it wrote is replaced by the next run; a DIR.partial it left (a run that was killed)
#     is removed by the next run;
#   - a run that fails, or is stopped (SIGTERM), removes the DIR.partial it made, and keeps the
#     kit that was there.
#
#   offline_kit_ownership.sh      (a few seconds)
#
# Nothing is downloaded: the refusals come before any download, and every run here finds a
# stand-in apt-get first on PATH, which builds one tiny package with dpkg-deb for each name it
# is asked for (or fails, with FAKE_APT_FAIL=1), so the real script runs each of its steps on
# them (FAKE_APT_STARTED=FILE: it touches FILE, then takes a second). Exit status 0 passed, 1 failed, 77 cannot check here (no dpkg-deb).
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
tool="$repo_root/tools/offline_kit.sh"
command -v dpkg-deb >/dev/null || { echo "cannot check here: dpkg-deb not found"; exit 77; }

work=$(mktemp -d "${TMPDIR:-/tmp}/mgpu-offline-kit.XXXXXX")
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

mkdir "$work/bin"
cat >"$work/bin/apt-get" <<'APT'
#!/usr/bin/env bash
# A stand-in for `apt-get download -q PACKAGE...`: PACKAGE_1.0_all.deb for each, built here.
set -euo pipefail
[ "${1:-}" = download ] || { echo "stand-in apt-get: only 'download'" >&2; exit 100; }
shift
if [ -n "${FAKE_APT_FAIL:-}" ]; then echo "E: stand-in apt-get fails, as asked" >&2; exit 100; fi
if [ -n "${FAKE_APT_STARTED:-}" ]; then touch "$FAKE_APT_STARTED"; sleep 1; fi  # time to be stopped
for package in "$@"; do
  case "$package" in -*) continue ;; esac
  tree=$(mktemp -d)
  mkdir -p "$tree/DEBIAN"
  printf 'Package: %s\nVersion: 1.0\nArchitecture: all\nMaintainer: nobody <nobody@example.invalid>\nDescription: stand-in\n' \
    "$package" >"$tree/DEBIAN/control"
  if [ "$package" = dataset-fashion-mnist ]; then
    mkdir -p "$tree/usr/share/datasets/fashion-mnist"
    echo stand-in >"$tree/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz"
  else
    mkdir -p "$tree/usr/share/doc/$package"
    echo stand-in >"$tree/usr/share/doc/$package/copyright"
  fi
  dpkg-deb --build --root-owner-group "$tree" "${package}_1.0_all.deb" >/dev/null
  rm -rf "$tree"
done
APT
chmod +x "$work/bin/apt-get"

# offline_kit NAME ARGS...: runs the script (stand-in apt-get first on PATH), its output in
# $work/NAME.out, its status in $status.
offline_kit() {
  local name=$1
  shift
  status=0
  PATH="$work/bin:$PATH" "$tool" "$@" >"$work/$name.out" 2>&1 || status=$?
}
# snapshot FOLDER: every path, its type and size, and every file's checksum.
snapshot() {
  (cd "$1" && find . -printf '%p %y %s\n' | sort && find . -type f -print0 | sort -z | xargs -0 -r sha256sum)
}
expect() {  # NAME STATUS REGEX: the last run ended with STATUS and printed REGEX
  if [ "$status" -ne "$2" ]; then fail "$1: status $status, expected $2"; cat "$work/$1.out"; return; fi
  grep -Eq "$3" "$work/$1.out" || { fail "$1: the output does not say '$3'"; cat "$work/$1.out"; }
}
intact() {  # NAME FOLDER BEFORE: FOLDER is as BEFORE (a snapshot) says
  [ "$(snapshot "$2")" = "$3" ] || fail "$1: $2 was changed"
}

echo "-- a folder with someone else's MANIFEST and other files: refused, left intact"
mkdir -p "$work/theirs/sub"
echo "their own manifest" >"$work/theirs/MANIFEST"
echo "their notes" >"$work/theirs/notes.txt"
echo "more" >"$work/theirs/sub/data"
before=$(snapshot "$work/theirs")
offline_kit foreign_manifest --no-mpi --to "$work/theirs"
expect foreign_manifest 1 "theirs exists and is not a kit this script wrote \(it has no .offline_kit file\): nothing in it was touched"
intact foreign_manifest "$work/theirs" "$before"
[ ! -e "$work/theirs.partial" ] || fail "foreign_manifest: theirs.partial was made"

echo "-- a kit of an older offline_kit.sh (no marker): refused, left intact, what to do said"
mkdir "$work/old"
printf 'offline kit for the mgpu repository, written 2026-01-01 00:00 UTC on Debian\n' >"$work/old/MANIFEST"
before=$(snapshot "$work/old")
offline_kit old_kit --no-mpi --to "$work/old"
expect old_kit 1 "remove it yourself \(rm -rf -- '$work/old'\)"
intact old_kit "$work/old" "$before"

echo "-- a marker file with another first line: refused, left intact"
mkdir "$work/forged"
echo "something else" >"$work/forged/.offline_kit"
before=$(snapshot "$work/forged")
offline_kit forged_marker --no-mpi --to "$work/forged"
expect forged_marker 1 "its .offline_kit does not begin with the line 'offline_kit.sh kit, format 1'"
intact forged_marker "$work/forged" "$before"

echo "-- someone else's DIR.partial: refused, left intact, DIR not made"
mkdir "$work/kit2.partial"
echo "their work" >"$work/kit2.partial/MANIFEST"
before=$(snapshot "$work/kit2.partial")
offline_kit foreign_partial --no-mpi --to "$work/kit2"
expect foreign_partial 1 "kit2.partial is in the way .* it is not this script's \(it has no .offline_kit file\): nothing in it was touched"
intact foreign_partial "$work/kit2.partial" "$before"
[ ! -e "$work/kit2" ] || fail "foreign_partial: kit2 was made"

echo "-- a DIR.partial that is a file: refused, left intact"
echo "a file" >"$work/kit3.partial"
offline_kit partial_file --no-mpi --to "$work/kit3"
expect partial_file 1 "kit3.partial is in the way .*\(it is not a folder\)"
[ "$(cat "$work/kit3.partial")" = "a file" ] || fail "partial_file: kit3.partial was changed"

echo "-- a kit is written (stand-in packages), with its marker"
offline_kit write --no-mpi --to "$work/kit"
expect write 0 "wrote $work/kit "
[ "$(head -n 1 "$work/kit/.offline_kit" 2>/dev/null)" = "offline_kit.sh kit, format 1" ] || fail "write: the kit has no marker"
for file in MANIFEST env.sh fashion-mnist/t10k-labels-idx1-ubyte.gz; do
  [ -f "$work/kit/$file" ] || fail "write: the kit has no $file"
done
[ ! -e "$work/kit.partial" ] || fail "write: kit.partial is left"

echo "-- the kit is written anew by the next run"
echo stale >"$work/kit/stale"
offline_kit rewrite --no-mpi --to "$work/kit"
expect rewrite 0 "wrote $work/kit "
[ ! -e "$work/kit/stale" ] || fail "rewrite: the old kit was not replaced"
[ -f "$work/kit/.offline_kit" ] || fail "rewrite: the new kit has no marker"

echo "-- a run that fails removes its DIR.partial and keeps the kit that was there"
before=$(snapshot "$work/kit")
FAKE_APT_FAIL=1 offline_kit failed --no-mpi --to "$work/kit"
expect failed 1 "apt-get download failed"
[ ! -e "$work/kit.partial" ] || fail "failed: kit.partial is left"
intact failed "$work/kit" "$before"
FAKE_APT_FAIL=1 offline_kit failed_new --no-mpi --to "$work/new"
expect failed_new 1 "apt-get download failed"
[ ! -e "$work/new.partial" ] || fail "failed_new: new.partial is left"
[ ! -e "$work/new" ] || fail "failed_new: new was made"

echo "-- a run stopped by SIGTERM removes its DIR.partial"
rm -f "$work/started"
FAKE_APT_STARTED="$work/started" PATH="$work/bin:$PATH" "$tool" --no-mpi --to "$work/stopped" >"$work/stopped.out" 2>&1 &
pid=$!
for _ in $(seq 100); do [ -e "$work/started" ] && break; sleep 0.1; done
[ -d "$work/stopped.partial" ] || fail "stopped: stopped.partial was not made"
kill -TERM "$pid"
status=0
wait "$pid" || status=$?
expect stopped 143 "removed the unfinished $work/stopped.partial"
[ ! -e "$work/stopped.partial" ] || fail "stopped: stopped.partial is left"

echo "-- a DIR.partial a stopped run left (it has the marker): removed, the kit written"
cp -a "$work/kit" "$work/kit.partial"  # what the script had put together when it was stopped
echo half >"$work/kit.partial/half-unpacked"
offline_kit leftover --no-mpi --to "$work/kit"
expect leftover 0 "removing $work/kit.partial, left unfinished by an earlier run"
[ ! -e "$work/kit.partial" ] || fail "leftover: kit.partial is left"
[ ! -e "$work/kit/half-unpacked" ] || fail "leftover: the leftover's files came into the kit"

if [ "$failures" -gt 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "PASS: offline_kit.sh touched only what it wrote"
