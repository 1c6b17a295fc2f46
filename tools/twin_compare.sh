# What a chapter's compare.sh does, sourced by it (not run): run the chapter's C++ program and its
# PyTorch twin on the same flags, print their accuracy and time per epoch side by side, and draw
# both runs in one picture.
#
#   source "$(dirname "$0")/../../tools/twin_compare.sh"
#   twin_compare PROGRAM TWIN "$@"      # e.g. twin_compare 01_lenet chapters/01_lenet/lenet_torch.py "$@"
#
# A chapter that must refuse some flags before anything runs defines twin_check_flags (it may
# call twin_flag); twin_compare calls it once the prerequisites are there.
#
# A chapter whose programs are started by a launcher (torchrun, mpirun) defines twin_launch,
# called after twin_check_flags. It finds two arrays holding the plain commands, the words
# before the shared flags: twin_cpp_command=(BUILD_DIR/bin/PROGRAM) and
# twin_command=(PYTHON TWIN), and may put a launcher in front of either or add words of that
# program's own after it. Chapter 05's, for 2 processes, in essence:
#   twin_cpp_command=(mpirun -np 2 "${twin_cpp_command[@]}")
#   twin_command=(mpirun -np 2 "${twin_command[@]}" --chapter 05_multi_process)
#
# The chapter's compare.sh takes [BUILD_DIR] [-- extra flags for both programs] (run from the
# repository root). Both programs write a CSV into --out (default results/), the C++ one the file
# its "wrote ....csv" line names (<RUN>.csv, named after its settings: 01_lenet for d2l's, as
# common/report.h says), the twin the one its own "wrote" line names (<PROGRAM>_torch, then the
# same settings); the picture is <out>/<RUN>_vs_torch.png.
# The twin's interpreter: Debian's by default, which is where python3-torch is installed (a
# python3 earlier on the PATH, pyenv's say, may have no torch); MGPU_PYTHON names another, such
# as a virtual environment's with PyTorch for CUDA on a GPU machine.
twin_python=${MGPU_PYTHON:-/usr/bin/python3}

# twin_flag NAME DEFAULT: the value of --NAME in the extra flags (the last one wins), else DEFAULT.
twin_flag() {
  local value=$2 i
  for ((i = 0; i < ${#twin_extra[@]}; i++)); do
    case ${twin_extra[i]} in
      "--$1") value=${twin_extra[i + 1]-$2} ;;
      "--$1="*) value=${twin_extra[i]#--$1=} ;;
    esac
  done
  printf '%s\n' "$value"
}

# twin_wrote_csv LOG WHO: the last CSV that WHO's output in LOG names ("wrote ....csv"); where it
# names none, says so and fails (under set -e, the caller's assignment stops the script).
twin_wrote_csv() {
  local csv
  csv=$(sed -n 's/^wrote \(.*\.csv\)$/\1/p' "$1" | tail -n 1)
  if [[ -z $csv ]]; then
    echo "error: the output of $2 names no CSV ('wrote ....csv')" >&2
    return 1
  fi
  printf '%s\n' "$csv"
}

# twin_field FILE KEY: the value of KEY=... on the last "result:" line of FILE.
twin_field() {
  local line
  line=$(grep '^result:' "$1" | tail -n 1) || true
  if [[ -z $line ]]; then
    echo "error: no 'result:' line in the output of ${1##*/}" >&2
    exit 1
  fi
  sed -n "s/.*[[:space:]]$2=\([^[:space:]]*\).*/\1/p" <<<"$line"
}

twin_compare() {
  local program=$1 twin=$2
  shift 2
  local build_dir=build
  local usage="usage: $0 [BUILD_DIR] [-- extra flags passed to both programs]"
  if [[ ${1:-} == -h || ${1:-} == --help ]]; then
    echo "$usage"
    exit 0
  fi
  if [[ $# -gt 0 && $1 != -- ]]; then
    build_dir=$1
    shift
  fi
  if [[ $# -gt 0 ]]; then
    if [[ $1 != -- ]]; then
      echo "$usage" >&2
      exit 2
    fi
    shift
  fi
  twin_extra=("$@")
  local cpp_bin=$build_dir/bin/$program

  # Check both prerequisites before spending minutes on the first run.
  if [[ ! -x $cpp_bin ]]; then
    echo "error: $cpp_bin not found; build it first:" >&2
    echo "  cmake -S . -B $build_dir && cmake --build $build_dir -j" >&2
    exit 1
  fi
  if ! "$twin_python" -c 'import torch' 2>/dev/null; then
    echo "error: $twin_python cannot import torch; install it with:" >&2
    echo "  apt-get install python3-torch" >&2
    exit 1
  fi
  if declare -F twin_check_flags >/dev/null; then
    twin_check_flags
  fi
  twin_cpp_command=("$cpp_bin")
  twin_command=("$twin_python" "$twin")
  if declare -F twin_launch >/dev/null; then
    twin_launch
  fi

  local logs
  logs=$(mktemp -d)
  # shellcheck disable=SC2064  # the folder's name is fixed now, on purpose
  trap "rm -rf '$logs'" EXIT
  # tee shows progress live and keeps a copy for parsing; with pipefail a failing program still
  # stops the script. (The ${a[@]+...} form keeps "set -u" quiet on older bash without flags.)
  echo "== C++: ${twin_cpp_command[*]} ${twin_extra[*]-}"
  "${twin_cpp_command[@]}" ${twin_extra[@]+"${twin_extra[@]}"} | tee "$logs/cpp.txt"
  echo
  echo "== PyTorch twin: ${twin_command[*]} ${twin_extra[*]-}"
  "${twin_command[@]}" ${twin_extra[@]+"${twin_extra[@]}"} | tee "$logs/torch.txt"
  echo

  local cpp_backend cpp_acc cpp_sec py_backend py_acc py_sec
  cpp_backend=$(twin_field "$logs/cpp.txt" backend)
  cpp_acc=$(twin_field "$logs/cpp.txt" test_acc)
  cpp_sec=$(twin_field "$logs/cpp.txt" sec_per_epoch)
  py_backend=$(twin_field "$logs/torch.txt" backend)
  py_acc=$(twin_field "$logs/torch.txt" test_acc)
  py_sec=$(twin_field "$logs/torch.txt" sec_per_epoch)
  printf '%-17s %-11s %-9s %s\n' program backend test_acc sec/epoch
  printf '%-17s %-11s %-9s %s\n' "$program" "$cpp_backend" "$cpp_acc" "$cpp_sec"
  printf '%-17s %-11s %-9s %s\n' "pytorch twin" "$py_backend" "$py_acc" "$py_sec"
  # bash has no floating point; awk does the division.
  awk -v py="$py_sec" -v cpp="$cpp_sec" 'BEGIN {
    if (cpp + 0 > 0) printf "PyTorch / C++ time per epoch: %.2fx\n", py / cpp
    else print "PyTorch / C++ time per epoch: n/a (C++ time is zero)"
  }'

  local cpp_csv py_csv png
  cpp_csv=$(twin_wrote_csv "$logs/cpp.txt" "$cpp_bin")
  py_csv=$(twin_wrote_csv "$logs/torch.txt" "the PyTorch twin")
  png=${cpp_csv%.csv}_vs_torch.png
  if ! command -v gnuplot >/dev/null; then
    echo "warning: gnuplot not found (apt-get install gnuplot-nox): no plot, the CSVs have the numbers" >&2
    return
  fi
  # The paths and names reach gnuplot as values (ARG1..ARG6 of `gnuplot -c`), never as script
  # text: a quote or a backquote in --out cannot end a string or run a command. ('PLOT' is
  # quoted, so bash expands nothing in the script either.)
  if gnuplot -c /dev/stdin "$png" "$cpp_csv" "$py_csv" "$cpp_backend" "$py_backend" "$program" <<'PLOT'
set terminal pngcairo size 1000,400 font 'sans,10' noenhanced
set output ARG1
set datafile separator ','
set key bottom right
set grid
set xlabel 'epoch'
set multiplot layout 1,2 title sprintf('%s (C++, %s) and its PyTorch twin (%s)', ARG6, ARG4, ARG5)
set ylabel 'test accuracy'
set yrange [0:1]
plot ARG2 using 1:4 with linespoints title 'C++', \
     ARG3 using 1:4 with linespoints title 'PyTorch'
set ylabel 'seconds per epoch'
set yrange [0:*]
plot ARG2 using 1:5 with linespoints title 'C++', \
     ARG3 using 1:5 with linespoints title 'PyTorch'
unset multiplot
PLOT
  then
    echo "wrote $png"
  else
    echo "warning: gnuplot failed: no plot, the CSVs have the numbers" >&2
  fi
}
