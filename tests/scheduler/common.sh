# shellcheck shell=bash
# Shared by slurm_check.sh and hostfile_check.sh (sourced, not run): the command line, the
# reference run with mpirun on one machine, and what two launches of the same training must
# agree on.
#
#   <check>.sh --program <05_multi_process> --launch "<mpiexec -n 2 ...>" [--script <lenet.sbatch>] -- <args...>
#
# Exit status: 0 passed, 1 failed, 77 skipped (ctest's SKIP_RETURN_CODE), always with the reason.
# Skipped where the machine lacks what a check needs, unless MGPU_REQUIRE_SCHEDULER_TESTS=1
# (see cannot_run), and where the program cannot train at all (a cuda build without a GPU).

skip() {
  echo "skipped: $*"
  exit 77
}

# cannot_run <reason>: this machine lacks what the check needs (a package, root): skipped, or,
# with MGPU_REQUIRE_SCHEDULER_TESTS=1 in the environment (CI's cpu stage, which installs all
# of it), failed: there a skip would hide a broken setup.
cannot_run() {
  if [ "${MGPU_REQUIRE_SCHEDULER_TESTS:-0}" = 1 ]; then fail "MGPU_REQUIRE_SCHEDULER_TESTS=1, but $*"; fi
  skip "$@"
}

fail() {
  echo "FAILED: $*" >&2
  exit 1
}

program="" launch="" script=""
args=()
parse_command_line() {
  while [ $# -gt 0 ]; do
    case "$1" in
      --program) program=$2; shift 2 ;;
      --launch) launch=$2; shift 2 ;;
      --script) script=$2; shift 2 ;;
      --) shift; args=("$@"); break ;;
      *) fail "unknown option '$1'" ;;
    esac
  done
  [ -x "$program" ] || fail "--program '$program' is not an executable"
  [ -n "$launch" ] || cannot_run "mpiexec not found: the tests that launch several processes cannot run"
  read -r -a launch_words <<<"$launch"
  local version
  version=$("${launch_words[0]}" --version 2>&1 || true)
  [[ $version == *"Open MPI"* || $version == *OpenRTE* ]] ||
    cannot_run "${launch_words[0]} is not Open MPI's mpirun (its --version says: $(head -n 1 <<<"$version")):" \
      "these launches use Open MPI's flags and its PMIx"
}

# run_logged <name> <seconds> <command...>: runs the command within <seconds>, keeps its output
# (stdout and stderr) in $work/<name>.log and prints it; returns the command's status.
run_logged() {
  local name=$1 seconds=$2 status=0
  shift 2
  echo "--- $name: $*"
  timeout --kill-after=10 "$seconds" "$@" >"$work/$name.log" 2>&1 || status=$?
  cat "$work/$name.log"
  echo "--- $name: exit status $status"
  return "$status"
}

# The reference: the same training started by mpirun on this one machine (--out: each run
# writes its CSV and plot in a folder of its own). In a cuda build where no GPU answers, the
# program cannot train: nothing can be compared, and the check reports itself skipped.
run_reference() {
  local status=0
  run_logged mpirun 90 "${launch_words[@]}" "$program" "${args[@]}" --out "$work/out-mpirun" || status=$?
  if grep -q "no GPU answers" "$work/mpirun.log"; then skip "no GPU answers: the program cannot train here"; fi
  [ "$status" = 0 ] || fail "the reference run (mpirun, one machine) failed with status $status"
  # Two runs that both sit at chance agree without proving anything (GUIDE: LeNet stays at
  # 0.1000 for about two epochs of the full training set): the recipe must get beyond it.
  if grep -q "^result: .* test_acc=0\.1000 " "$work/mpirun.log"; then
    fail "the reference run ended at chance (test_acc=0.1000): choose arguments that train further"
  fi
}

# curve <log>: what two launches of the same training must print alike: every epoch's line
# without its seconds, and the result line up to test_acc (the timings after it differ).
curve() {
  sed -n -E -e 's/^(epoch .*)  sec [0-9.]+$/\1/p' -e 's/^(result: .* test_acc=[0-9.]+) .*$/\1/p' "$1"
}

# world <log>: how the run saw its world: "05_multi_process: 2 process(es) on 1 machine(s), ..."
# and one line per rank, "rank 1: host vm, local rank 1 of 2, cpu, 1 OpenMP thread".
world() {
  grep -E "^(rank [0-9]+: host |05_multi_process: [0-9]+ process\(es\) on )" "$1" || true
}

# same_curve <name>: the run in $work/<name>.log trained exactly as the reference did.
same_curve() {
  local name=$1
  [ -n "$(curve "$work/mpirun.log")" ] || fail "the reference run printed no epochs and no result line"
  if [ "$(curve "$work/$name.log")" != "$(curve "$work/mpirun.log")" ]; then
    echo "mpirun (one machine):"
    curve "$work/mpirun.log"
    echo "$name:"
    curve "$work/$name.log"
    fail "$name trained differently from mpirun on one machine (above)"
  fi
  echo "$name: the same epochs and result as mpirun on one machine: $(curve "$work/$name.log" | tail -n 1)"
}
