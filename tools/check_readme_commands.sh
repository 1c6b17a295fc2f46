#!/usr/bin/env bash
# Runs every command of every ```sh block of the repository's Markdown files as written, so that
# a reader who copies one meets no surprise. (```bash blocks quote a script's lines, ```text a
# file's: they are not commands to type and are not run.)
#
#   tools/check_readme_commands.sh BUILD_DIR [FILE.md...]   # default: every tracked *.md
#                                                         # (relative to the repository, or absolute)
#
# Each block runs in one shell of its own, in a scratch folder where build/ is BUILD_DIR (a cpu
# or cuda build of this repository, built; a cuda one is build-cuda/ too) and chapters/, tools/, tests/, data/ and common/ are
# the repository's, so results/ and any file a command writes land in the scratch folder; an
# `export` line holds for the rest of its block. A chain `a && b` is its parts, in order. By
# its first word, a command is
#   a program (build/bin/NAME ...) or mpirun/mpiexec  run as written until the run has shown it
#       works: its data line ("Fashion-MNIST from ...") and 1 s of training after it, or its end
#       (status 0; 77, "not applicable", where the program says this build cannot run it), or
#       20 s without an error for a program that loads no data. Then it is stopped: the start
#       of training is enough. A run that writes a file a later command of its block reads (a
#       path the later command names: --dump-step /tmp/step, then crosscheck.py /tmp/step) runs
#       to its end; one that writes a checkpoint so, to its first epoch line. (A later run's own
#       --out folder is where it writes, not a read: four runs into one --out are each stopped.)
#   a script of this repository (chapters/..., tools/...)  run with --help: it exists, prints its
#       usage and exits 0 (its real work takes minutes to hours; the chapters' tests run it).
#   apt-get install  not run: each package it names must be one apt knows (apt-cache show).
#   cmake, ctest  not run here: CI runs the build and test commands, and readme_first_commands
#       checks what each first command builds.
#   printf, echo, export  run.
# A command that needs what this machine lacks is skipped, saying why: a cuda build
# (build-cuda/, --preset cuda), SLURM (srun, sbatch), other machines (--hostfile, "..."), PyTorch,
# a GPU; so is one that reads a path (/tmp/step) which a skipped command of its block names.
# `sudo` fails the check: the READMEs are written for root (the top README says where a user
# puts sudo). Run as root, every command that starts programs runs again as the user
# nobody, in a scratch folder of nobody's (mpirun treats root and users differently).
#
# Prints one line per command (passed, FAILED, skipped: why); exit status 0 when none failed,
# 1 when one did, 2 for a bad command line.
set -uo pipefail
usage="usage: tools/check_readme_commands.sh BUILD_DIR [FILE.md...]"
if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then echo "$usage"; exit 0; fi
[ $# -ge 1 ] || { echo "$usage" >&2; exit 2; }
[ -d "$1/bin" ] || { echo "check_readme_commands.sh: $1/bin not found: build first" >&2; exit 2; }
build=$(cd "$1" && pwd)
shift
root=$(cd "$(dirname "$0")/.." && pwd)
if [ $# -gt 0 ]; then files=("$@"); else mapfile -t files < <(cd "$root" && git ls-files '*.md'); fi
backend=$(sed -n 's/^MGPU_BACKEND_RESOLVED:[A-Z]*=//p' "$build/CMakeCache.txt")

scratch=$(mktemp -d /tmp/readme_commands.XXXXXX)
chmod 755 "$scratch"
trap 'rm -rf "$scratch"' EXIT
passed=0 failed=0 skipped=0

# A working folder as a reader's checkout looks, for one user: owned by them, results/ inside.
# Each Markdown file gets fresh ones ($work/root, $work/user): its commands may depend on each
# other (a checkpoint, then a resume), never on another file's.
make_checkout() {
  local dir=$1
  mkdir -p "$dir"
  ln -s "$build" "$dir/build"
  [ "$backend" = cuda ] && ln -s "$build" "$dir/build-cuda"  # the READMEs' name for a cuda build
  for d in chapters tools tests data common; do ln -s "$root/$d" "$dir/$d"; done
}
as_user=""
if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null && id nobody >/dev/null 2>&1 &&
   setpriv --reuid=nobody --regid=nogroup --clear-groups test -x "$build/bin/01_lenet" 2>/dev/null; then
  as_user=yes
fi
fresh_checkouts() {
  work=$scratch/$1
  mkdir -p "$work"
  chmod 755 "$work"
  make_checkout "$work/root/checkout"
    if [ -n "$as_user" ]; then
    make_checkout "$work/user/checkout"
    chown -R nobody:nogroup "$work/user"
  fi
}

# Why this machine cannot run `cmd` (empty when it can).
why_not_here() {
  local cmd=$1
  case "$cmd" in
    *build-cuda/*|*"--preset cuda"*) [ "$backend" = cuda ] || { echo "needs the cuda build"; return; } ;;
  esac
  case "$cmd" in
    srun\ *|sbatch\ *|salloc\ *) echo "needs a SLURM cluster (chapter 05's scheduler tests run srun and sbatch)"; return ;;
    source\ *) echo "needs the offline kit that the block before writes (tools/check_offline_kit.sh runs it)"; return ;;
  esac
  case "$cmd" in *--hostfile*|*" ..."*) echo "needs other machines (tests/scheduler/hostfile_check.sh runs the two-machine form)"; return ;; esac
  case "$cmd" in
    torchrun\ *|python3\ *|/usr/bin/python3\ *)
      local interpreter=${cmd%% *}
      command -v "$interpreter" >/dev/null || { echo "$interpreter is not installed"; return; }
      # torchrun is a script: the Python that runs it is the one that must have torch.
      [ "$interpreter" = torchrun ] && interpreter=$(sed -n '1s/^#! *//p' "$(command -v torchrun)")
      $interpreter -c 'import torch' 2>/dev/null || { echo "needs PyTorch (python3-torch)"; return; } ;;
  esac
  case "$cmd" in *04_nccl*|*04_allreduce_bench*) [ "$backend" = cuda ] || echo "needs the cuda build with NCCL" ;; esac
}

# Runs one program command in folder `dir` (as `who`), stopping it once it has shown it works.
# Prints nothing; returns 0 (works), 1 (failed: the log says why), 3 (skipped: a GPU is needed).
run_program() {
  local who=$1 dir=$2 cmd=$3 log=$4 exports=$5
  local -a prefix=()
  [ "$who" = user ] && prefix=(setpriv --reuid=nobody --regid=nogroup --clear-groups env HOME="$dir")
  (cd "$dir" && exec setsid "${prefix[@]}" bash -c "$exports$cmd" </dev/null >"$log" 2>&1) &
  local pid=$! waited=0 data_seen=-1 want_epoch=no to_end=no word
  # A file this command writes that a later command of the block reads (a dump, a checkpoint):
  # the command runs to its end, or, writing a checkpoint (rewritten each epoch, atomically),
  # to its first epoch.
  for word in $cmd; do
    case "$word" in build/*|build-cuda/*|chapters/*|tools/*|tests/*|-*) continue ;; esac
    case "$word" in */*) case " $later " in *" $word "*) to_end=yes ;; esac ;; esac
  done
  case "$cmd" in *--checkpoint*) [ "$to_end" = yes ] && want_epoch=yes && to_end=no ;; esac
  while kill -0 "$pid" 2>/dev/null; do
    if [ "$want_epoch" = yes ]; then
      grep -Eq '^epoch +1/' "$log" && break
    elif [ "$data_seen" -lt 0 ] && grep -q 'Fashion-MNIST from' "$log"; then
      data_seen=$waited
    fi
    if [ "$want_epoch" = no ] && [ "$to_end" = no ]; then
      [ "$data_seen" -ge 0 ] && [ $((waited - data_seen)) -ge 10 ] && break  # 1 s
      [ "$data_seen" -lt 0 ] && [ "$waited" -ge 200 ] && break                # 20 s
    fi
    [ "$waited" -ge 6000 ] && break                                                                   # 10 min
    sleep 0.1
    waited=$((waited + 1))
  done
  if kill -0 "$pid" 2>/dev/null; then
    [ "$to_end" = yes ] && { kill -KILL -- "-$pid" 2>/dev/null; echo "(did not end within 10 minutes)" >>"$log"; return 1; }
    kill -TERM -- "-$pid" 2>/dev/null
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL -- "-$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    [ "$want_epoch" = yes ] && ! grep -Eq '^epoch +1/' "$log" && return 1
    grep -Eq '(^|: )error:' "$log" && return 1
    return 0
  fi
  wait "$pid"
  local status=$?
  [ "$status" = 0 ] && return 0
  grep -q 'no GPU answers' "$log" && return 3
  [ "$status" = 77 ] && grep -q 'not applicable' "$log" && return 0
  return 1
}

# Checks one command (a part of a chain); prints its line. `exports`: the block's exports so far.
check_command() {
  local file=$1 cmd=$2 exports=$3
  local shown="$file: $cmd"
  [ ${#shown} -gt 150 ] && shown="${shown:0:147}..."
  local reason word
  reason=$(why_not_here "$cmd")
  # A file that a skipped command of the block would have written (crosscheck.py reading the
  # step that --dump-step did not dump) is not there to read.
  for word in $cmd; do
    case " $unwritten " in *" $word "*) reason="reads $word, which a skipped command before it writes" ;; esac
  done
  if [ -n "$reason" ]; then
    echo "skipped ($reason): $shown"; skipped=$((skipped + 1)); return
  fi
  local first=${cmd%% *}
  case "$first" in
    sudo)
      echo "FAILED (sudo: the READMEs' commands are written for root; the top README says where a user adds sudo): $shown"
      failed=$((failed + 1)) ;;
    apt-get)
      if ! apt-cache show cmake >/dev/null 2>&1; then
        echo "skipped (apt has no package lists here: apt-get update): $shown"; skipped=$((skipped + 1)); return
      fi
      local bad=""
      for word in ${cmd#apt-get }; do
        case "$word" in -*|install|update|"&&") continue ;; esac
        apt-cache show "$word" >/dev/null 2>&1 || bad="$bad $word"
      done
      if [ -n "$bad" ]; then echo "FAILED (unknown package(s):$bad): $shown"; failed=$((failed + 1))
      else echo "passed (packages known, not installed here): $shown"; passed=$((passed + 1)); fi ;;
    cmake|ctest)
      echo "skipped (a build or test command: CI runs them; readme_first_commands checks the first ones): $shown"
      skipped=$((skipped + 1)) ;;
    printf|echo|export|mkdir)
      (cd "$work/root/checkout" && bash -c "$exports$cmd") >/dev/null 2>&1 || { echo "FAILED: $shown"; failed=$((failed + 1)); return; }
      echo "passed: $shown"; passed=$((passed + 1)) ;;
    chapters/*|tools/*)
      local script=${first}
      if [ ! -x "$root/$script" ]; then echo "FAILED ($script is not an executable of the repository): $shown"; failed=$((failed + 1)); return; fi
      if (cd "$work/root/checkout" && "$script" --help) >"$scratch/log" 2>"$scratch/err" && [ -s "$scratch/log" ]; then
        echo "passed (--help: its work is the chapter's figures or a long check): $shown"; passed=$((passed + 1))
      else
        echo "FAILED ($script --help did not print its usage and exit 0):"; sed 's/^/    /' "$scratch/log" "$scratch/err" | head -5; failed=$((failed + 1))
      fi ;;
    build/bin/*|build-cuda/bin/*|mpirun|mpiexec|torchrun|python3|/usr/bin/python3)
      local who status started=$SECONDS
      for who in root ${as_user:+user}; do
        [ "$who" = user ] && [ "$first" != mpirun ] && [ "$first" != mpiexec ] && continue
        run_program "$who" "$work/$who/checkout" "$cmd" "$scratch/log" "$exports"
        status=$?
        if [ "$status" = 3 ]; then echo "skipped (no GPU answers): $shown"; skipped=$((skipped + 1)); return; fi
        if [ "$status" != 0 ]; then
          echo "FAILED (as $who): $shown"; tail -5 "$scratch/log" | sed 's/^/    /'; failed=$((failed + 1)); return
        fi
      done
      if [ -n "$as_user" ] && { [ "$first" = mpirun ] || [ "$first" = mpiexec ]; }; then
        echo "passed (as root and as nobody, $((SECONDS - started)) s): $shown"
      else
        echo "passed ($((SECONDS - started)) s): $shown"
      fi
      passed=$((passed + 1)) ;;
    *)
      echo "FAILED (a command this check does not know how to run; teach it, or quote the text as \`\`\`text): $shown"
      failed=$((failed + 1)) ;;
  esac
}

file_number=0
for file in "${files[@]}"; do
  path=$root/$file
  case "$file" in /*) path=$file ;; esac
  [ -f "$path" ] || { echo "check_readme_commands.sh: no file $file" >&2; exit 2; }
  file_number=$((file_number + 1))
  fresh_checkouts "file$file_number"
  # The blocks: one command per line, a backslash at the end continuing it, comments dropped.
  blocks=$(awk '
    /^```sh[[:space:]]*$/ { inside = 1; next }
    /^```/ { if (inside) print "\x1e"; inside = 0; next }
    inside {
      line = $0
      if (cont != "") { line = cont " " line; cont = "" }
      if (line ~ /\\$/) { sub(/\\$/, "", line); cont = line; next }
      sub(/[[:space:]]+#.*$/, "", line)     # a comment after the command
      if (line ~ /^[[:space:]]*(#|$)/) next  # a comment line, a blank line
      gsub(/^[[:space:]]+|[[:space:]]+$/, "", line); gsub(/[[:space:]]+/, " ", line)
      print line
    }' "$path")
  [ -n "$blocks" ] || continue
  while IFS= read -r -d $'\x1e' block; do
    exports=""
    unwritten=""  # the paths named by the block's skipped commands (outside the checkout)
    line_number=0
    while IFS= read -r line; do
      line_number=$((line_number + 1))
      [ -n "$line" ] || continue
      # What the block runs after this line, less the folders later runs write into (--out DIR):
      # a run whose folder the next run also writes to is not read by it, and need not run to its end.
      later=" $(tail -n +$((line_number + 1)) <<<"$block" | tr '\n' ' ' | sed -E 's/--out(=| )[^ ]+//g') "
      # A chain a && b && c: its parts in order.
      rest=$line
      while [ -n "$rest" ]; do
        part=${rest%% && *}
        if [ "$part" = "$rest" ]; then rest=""; else rest=${rest#* && }; fi
        before=$skipped
        check_command "$file" "$part" "$exports"
        if [ "$skipped" != "$before" ]; then
          for word in $part; do case "$word" in /*) unwritten="$unwritten $word" ;; esac; done
        fi
        case "$part" in export\ *) exports="$exports$part; " ;; esac
      done
    done <<<"$block"
  done <<<"$blocks"
done
echo "readme commands: $passed passed, $failed failed, $skipped skipped"
[ "$failed" = 0 ]
