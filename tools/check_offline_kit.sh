#!/usr/bin/env bash
# check_offline_kit.sh: proves that the kit tools/offline_kit.sh writes is all a build needs
# beside a compiler, CMake and the toolkit. It writes a kit, then, in a mount namespace of its
# own (unshare -m, as root), hides this machine's doctest, zlib headers, Open MPI and dataset
# (each file becomes empty, each folder an empty tmpfs), so that whatever the build or the
# programs would take from the machine instead of the kit fails. With only the kit's env.sh to
# help, it configures a cpu build, builds and runs a doctest suite, trains chapter 01 on the
# kit's dataset and chapter 05 under the kit's mpirun.
#
#   tools/check_offline_kit.sh [--work DIR]    (about 40 seconds on 2 cores)
#
# Exit status: 0 passed, 1 failed (said why), 77 cannot check here: not root, no unshare, or
# apt-get download could not reach the package registry.
set -euo pipefail

readonly program_name=check_offline_kit.sh
repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
readonly repo_root

work=""
case "${1:-}" in
  "") ;;
  --work) work=${2:?--work needs a folder} ;;
  --help | -h) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "$program_name: unknown option '$1'" >&2; exit 2 ;;
esac

not_here() { echo "$program_name: cannot check here: $1" >&2; exit 77; }
[[ "$(id -u)" -eq 0 ]] || not_here "hiding the machine's packages needs root (unshare -m and mount)"
command -v unshare >/dev/null || not_here "unshare not found (util-linux)"
unshare -m true 2>/dev/null || not_here "unshare -m is refused (a container without CAP_SYS_ADMIN?)"

own_work=no  # a folder of our own is removed after a pass; after a failure it keeps the logs
if [[ -z "$work" ]]; then
  work=$(mktemp -d)
  own_work=yes
fi
mkdir -p -- "$work"
work=$(realpath -- "$work")

if ! "$repo_root/tools/offline_kit.sh" --to "$work/kit" >"$work/kit.log" 2>&1; then
  if grep -qE 'Could not resolve|Failed to fetch|Temporary failure' "$work/kit.log"; then
    not_here "apt-get download could not reach the registry: $(grep -E 'Could not|Failed' "$work/kit.log" | head -n 1)"
  fi
  cat "$work/kit.log" >&2
  echo "$program_name: FAIL: offline_kit.sh failed" >&2
  exit 1
fi
echo "$program_name: kit written ($(du -sh "$work/kit" | cut -f 1)); checking it with the machine's copies hidden"

# What the kit replaces, as this machine has it: folders to cover, and each package's files.
hidden_folders=(/usr/include/doctest /usr/lib/cmake/doctest /usr/lib/x86_64-linux-gnu/openmpi /usr/share/openmpi
                /usr/lib/x86_64-linux-gnu/pmix2 /usr/share/datasets/fashion-mnist)
hidden_packages=(doctest-dev zlib1g-dev libopenmpi3 openmpi-bin libpmix2 libhwloc15 libevent-core-2.1-7
                 libevent-pthreads-2.1-7)

# The check itself, run inside the namespace. Its arguments: the work folder, the repository.
inside() {
  set -euo pipefail
  local work=$1 repo=$2 folder file
  for folder in "${hidden_folders[@]}"; do
    [[ -d "$folder" ]] && mount -t tmpfs -o size=1m mgpu-hidden "$folder"
  done
  # Regular files only: a link's target may be another package's (libz.so -> the runtime).
  while IFS= read -r file; do
    [[ -f "$file" && ! -L "$file" ]] && mount --bind /dev/null "$file"
  done < <(dpkg -L "${hidden_packages[@]}" 2>/dev/null | sort -u)
  # The repository's own data folder (the build's fallback) is hidden too.
  [[ -d "$repo/data/fashion-mnist" ]] && mount -t tmpfs -o size=1m mgpu-hidden "$repo/data/fashion-mnist"

  # First without the kit: CMake must find none of what the kit brings, or the hiding failed
  # and the check below would prove nothing.
  echo "-- configure without the kit (nothing may be found)"
  cmake -S "$repo" -B "$work/build-without" -DMGPU_BACKEND=cpu -DMGPU_FETCH_DATA=OFF >"$work/configure-without.log" 2>&1 ||
    { cat "$work/configure-without.log"; echo "FAIL: configure without the kit"; return 1; }
  local without
  without=$(sed -n '/mgpu configuration/,/dataset/p' "$work/configure-without.log")
  if grep -E "(MPI|doctest|dataset) +[^ ]" <<<"$without" | grep -v "not found"; then
    echo "FAIL: with the machine's copies hidden, CMake still found the above"
    return 1
  fi
  echo "   doctest, MPI and the dataset: not found"

  # shellcheck source=/dev/null
  source "$work/kit/env.sh"
  local build=$work/build
  echo "-- configure"
  cmake -S "$repo" -B "$build" -DMGPU_BACKEND=cpu -DCMAKE_BUILD_TYPE=Release >"$work/configure.log" 2>&1 ||
    { cat "$work/configure.log"; echo "FAIL: configure"; return 1; }
  local report
  report=$(sed -n '/mgpu configuration/,/dataset/p' "$work/configure.log")
  echo "$report"
  grep -q "doctest    doctest" <<<"$report" || { echo "FAIL: CMake did not find the kit's doctest"; return 1; }
  # CLI11 and nlohmann-json are not hidden (every configure needs them): the kit's must be the one found, before the machine's.
  grep -q "^CLI11_DIR:PATH=$work/kit/" "$build/CMakeCache.txt" || { echo "FAIL: CMake did not take the kit's CLI11"; return 1; }
  # nlohmann-json likewise (every run writes a JSON).
  grep -q "^nlohmann_json_DIR:PATH=$work/kit/" "$build/CMakeCache.txt" ||
    { echo "FAIL: CMake did not take the kit's nlohmann-json"; return 1; }
  grep -q "MPI        MPI" <<<"$report" || { echo "FAIL: CMake did not find the kit's MPI"; return 1; }
  grep -q "dataset    $work/kit/fashion-mnist" <<<"$report" || { echo "FAIL: the dataset is not the kit's"; return 1; }
  echo "-- build"
  cmake --build "$build" -j"$(nproc)" --target test_cli 01_lenet 05_multi_process >"$work/build.log" 2>&1 ||
    { tail -n 30 "$work/build.log"; echo "FAIL: build"; return 1; }
  echo "-- a doctest suite"
  "$build/tests/test_cli" >"$work/test_cli.log" 2>&1 || { tail -n 20 "$work/test_cli.log"; echo "FAIL: test_cli"; return 1; }
  tail -n 2 "$work/test_cli.log"
  local short=(--epochs 1 --limit-train 512 --batch-size 64 --out "$work/results")
  echo "-- chapter 01 on the kit's dataset"
  (cd "$repo" && "$build/bin/01_lenet" "${short[@]}") >"$work/01.log" 2>&1 ||
    { tail -n 20 "$work/01.log"; echo "FAIL: 01_lenet"; return 1; }
  grep '^result: ' "$work/01.log"
  echo "-- chapter 05 under the kit's mpirun, 2 ranks"
  local mpirun
  mpirun=$(command -v mpirun)
  [[ "$mpirun" == "$work/kit/"* ]] || { echo "FAIL: mpirun is $mpirun, not the kit's"; return 1; }
  (cd "$repo" && OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none \
     "$mpirun" -np 2 --oversubscribe "$build/bin/05_multi_process" --collective mpi "${short[@]}") >"$work/05.log" 2>&1 ||
    { tail -n 30 "$work/05.log"; echo "FAIL: 05_multi_process under mpirun"; return 1; }
  grep '^result: ' "$work/05.log"
  echo "PASS"
}

export -f inside
export hidden_folders_list="${hidden_folders[*]}" hidden_packages_list="${hidden_packages[*]}"
if unshare -m bash -c 'read -ra hidden_folders <<<"$hidden_folders_list"; read -ra hidden_packages <<<"$hidden_packages_list"; inside "$@"' \
     bash "$work" "$repo_root" 2>&1 | tee "$work/check.log" && tail -n 1 "$work/check.log" | grep -qx PASS; then
  echo "$program_name: PASS: the kit alone was enough"
  [[ "$own_work" == yes ]] && rm -rf -- "$work"
  exit 0
fi
echo "$program_name: FAIL (see above; logs in $work)" >&2
exit 1
