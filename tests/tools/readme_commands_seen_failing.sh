#!/usr/bin/env bash
# tools/check_readme_commands.sh on a made-up page whose block holds one command of each kind
# it must tell apart: a program run that works, one whose flag is refused, sudo, a command it
# does not know, a cuda build's program (skipped here) and a reader of what that one would have
# written (skipped too). The check must pass the first, fail the next three, skip the last two
# and exit 1.
#
#   tests/tools/readme_commands_seen_failing.sh BUILD_DIR
set -uo pipefail
build=$1
check=$(cd "$(dirname "$0")/../.." && pwd)/tools/check_readme_commands.sh
page=$(mktemp /tmp/readme_commands_page.XXXXXX.md)
trap 'rm -f "$page"' EXIT
cat >"$page" <<'PAGE'
```sh
build/bin/01_lenet --help
build/bin/01_lenet --epochs 0
sudo apt-get install jq
frobnicate --all
build-cuda/bin/09_resnet --dump-step /tmp/made_up_step
/usr/bin/python3 chapters/09_resnet/crosscheck.py /tmp/made_up_step
```
PAGE
out=$("$check" "$build" "$page")
status=$?
echo "$out"
fail() { echo "FAIL: $*"; exit 1; }
[ "$status" = 1 ] || fail "exit status $status, not 1"
grep -q '^passed.*: build/bin/01_lenet --help$' <<<"$out" || fail "the working command did not pass"
grep -q '^FAILED (as root): .*build/bin/01_lenet --epochs 0$' <<<"$out" || fail "the refused flag did not fail"
grep -q '^FAILED (sudo' <<<"$out" || fail "sudo did not fail"
grep -q '^FAILED (a command this check does not know' <<<"$out" || fail "the unknown command did not fail"
# In a cuda build the cuda program's line is a "no GPU answers" skip, or runs where a GPU answers.
grep -q '^skipped (reads /tmp/made_up_step' <<<"$out" || grep -q '^passed.*build-cuda/bin/09_resnet' <<<"$out" ||
  fail "the reader of a skipped command's output was not skipped"
echo "check_readme_commands: a working run passed; a refused flag, sudo and an unknown command failed; a skipped writer's reader skipped"
