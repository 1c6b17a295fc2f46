#!/usr/bin/env bash
# offline_kit.sh: gathers, on a Debian 12 machine, what building and checking this repository
# needs beside a compiler, CMake and the CUDA toolkit (doctest, CLI11, nlohmann-json, zlib's
# headers, Open MPI, the dataset) into one folder that can be copied to a GPU machine where nothing can be installed:
# a cluster node without root, a container image, a machine with no network.
#
#   tools/offline_kit.sh                    writes offline-kit/ in the repository
#   tools/offline_kit.sh --to DIR --no-mpi  elsewhere, without Open MPI
#
# Then, on the GPU machine, from the repository root (the kit can live anywhere):
#
#   source offline-kit/env.sh && tools/gpu_check.sh
#
# How it works: `apt-get download` fetches the Debian packages (no root needed) and
# `dpkg-deb -x` unpacks them into the kit's root/ instead of /. Nothing is installed; env.sh
# points CMake (CMAKE_PREFIX_PATH), the loader (LD_LIBRARY_PATH), the shell (PATH), Open MPI
# (OPAL_PREFIX: it finds its plugins and help files relative to it) and the programs
# (FASHION_MNIST_DIR) at the kit. The kit's MANIFEST lists the packages and the shared
# libraries its programs take from the machine itself (the C library and such).
#
# Exit status: 0 the kit is written, 1 something failed (said why), 2 a bad command line.
set -euo pipefail

readonly program_name=offline_kit.sh
repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
readonly repo_root

# What the build and the check need that a machine with only the CUDA toolkit lacks.
readonly base_packages=(
  doctest-dev             # the tests (header-only, with its CMake package)
  nlohmann-json3-dev      # every run's JSON (header-only, with its CMake package)
  libcli11-dev            # every program's command line (header-only, with its CMake package)
  zlib1g-dev zlib1g       # the dataset loader reads gzip with zlib: its header and libz.so
  dataset-fashion-mnist   # the four .gz files
)
# Open MPI for chapter 05, with the libraries libmpi, mpirun and orted load.
readonly mpi_packages=(
  libopenmpi-dev libopenmpi3 openmpi-bin openmpi-common
  libpmix2 libhwloc15 libevent-2.1-7 libevent-core-2.1-7 libevent-pthreads-2.1-7 libltdl7 libnuma1
  libudev1                # hwloc's; most machines have it, a minimal container may not
)

usage() {
  cat <<EOF
usage: $program_name [options]
  gathers doctest, CLI11, nlohmann-json, zlib's headers, Open MPI and Fashion-MNIST from Debian's packages into one
  folder, to build and check this repository on a machine where nothing can be installed;
  there: source DIR/env.sh, then build as usual (or run tools/gpu_check.sh)

options:
  --to DIR    where to write the kit (default offline-kit in the repository); it must not
              exist yet, or be a kit this script wrote before (it is then written anew): a
              kit carries the file .offline_kit, and a folder without it is never touched
  --no-mpi    leave Open MPI out (chapter 05 is then not built)
  --help      this text

needs: a Debian 12 (bookworm) machine with apt-get and dpkg-deb, and its package lists
(apt-get update); the kit's programs run on x86-64 Linux with glibc 2.36 or newer
EOF
}

refuse_command_line() {
  echo "$program_name: $1" >&2
  usage >&2
  exit 2
}

fail() {
  echo "$program_name: $1" >&2
  exit 1
}

# What this script writes carries a marker, a file whose first line names the script and the
# kit's format. It replaces or deletes a folder only when that marker proves the folder its own:
# a MANIFEST alone proves nothing (many folders have one).
readonly marker_name=.offline_kit
readonly marker_first_line="offline_kit.sh kit, format 1"
is_ours() {  # folder -> status 0 when it carries the marker (a kit, or one being written)
  local first=""
  [[ -d "$1" && ! -L "$1" && -f "$1/$marker_name" ]] || return 1
  IFS= read -r first <"$1/$marker_name" || true
  [[ "$first" =~ ^offline_kit\.sh\ kit,\ format\ [0-9]+$ ]]
}

kit="$repo_root/offline-kit"
with_mpi=yes
while [[ $# -gt 0 ]]; do
  case "$1" in
    --help | -h) usage; exit 0 ;;
    --to)
      [[ $# -ge 2 && -n "$2" && "$2" != --* ]] || refuse_command_line "--to needs a folder"
      kit=$2
      shift
      ;;
    --no-mpi) with_mpi=no ;;
    *) refuse_command_line "unknown option '$1'" ;;
  esac
  shift
done
kit=$(realpath -m -- "$kit")
# Open MPI's compiler wrappers print their include paths unquoted, and CMake's FindMPI reads
# them as a shell would, splitting at spaces and dropping quotes and backslashes: in a kit whose
# path has one of those, CMake would look for MPI's headers somewhere else.
unsafe_for_mpi="[[:space:]\"'\\]"
if [[ "$with_mpi" == yes && "$kit" =~ $unsafe_for_mpi ]]; then
  refuse_command_line "--to: '$kit' has a space, quote or backslash in it, which Open MPI's compiler wrappers cannot pass on to CMake; choose another folder (or --no-mpi)"
fi

# The folders it would replace, checked before anything is fetched: the kit, and the folder
# beside it where the kit is put together (DIR.partial), which a run that was stopped leaves.
partial="$kit.partial"
not_ours_because() {  # folder -> why it is not taken for this script's
  if [[ -L "$1" ]]; then
    echo "it is a symbolic link"
  elif [[ ! -d "$1" ]]; then
    echo "it is not a folder"
  elif [[ ! -e "$1/$marker_name" ]]; then
    echo "it has no $marker_name file"
  else
    echo "its $marker_name does not begin with the line '$marker_first_line'"
  fi
}
if [[ -e "$kit" || -L "$kit" ]] && ! is_ours "$kit"; then
  old=""
  if [[ -f "$kit/MANIFEST" ]] && head -n 1 "$kit/MANIFEST" | grep -q '^offline kit for the mgpu repository, written '; then
    old="; if it is a kit an older offline_kit.sh wrote (its MANIFEST says so; those had no marker), remove it yourself (rm -rf -- '$kit') and run again"
  fi
  fail "$kit exists and is not a kit this script wrote ($(not_ours_because "$kit")): nothing in it was touched; choose another --to, or move it away yourself$old"
fi
if [[ -e "$partial" || -L "$partial" ]] && ! is_ours "$partial"; then
  fail "$partial is in the way (this script puts the kit together there first) and it is not this script's ($(not_ours_because "$partial")): nothing in it was touched; move it away or remove it yourself, or choose another --to"
fi

for tool in apt-get dpkg-deb; do
  command -v "$tool" >/dev/null || fail "$tool not found: this script runs on Debian 12 (or a derivative with its packages)"
done

packages=("${base_packages[@]}")
[[ "$with_mpi" == yes ]] && packages+=("${mpi_packages[@]}")

# The kit is put together in a folder beside it and takes its name only when it is complete.
# That folder is removed when this run fails or is stopped (the trap below): only when this run
# made it. One a run left that could not clean up (killed, the machine down) carries the
# marker, and is removed here.
final_kit=$kit
kit=$partial
if [[ -e "$kit" || -L "$kit" ]]; then
  is_ours "$kit" || fail "$kit is not this script's ($(not_ours_because "$kit")): nothing in it was touched"
  echo "$program_name: removing $kit, left unfinished by an earlier run" >&2
  rm -rf -- "$kit"
fi
made_partial=no
remove_own_partial() {
  if [[ "$made_partial" == yes && -d "$kit" ]]; then
    rm -rf -- "$kit"
    echo "$program_name: removed the unfinished $kit" >&2
  fi
}
trap remove_own_partial EXIT
trap 'exit 129' HUP
trap 'exit 130' INT
trap 'exit 143' TERM
mkdir -p -- "$(dirname -- "$kit")"
mkdir -- "$kit" || fail "cannot make $kit"
made_partial=yes
printf '%s\n%s\n' "$marker_first_line" \
  "Written by tools/offline_kit.sh of the mgpu repository, which replaces or deletes this folder only while this file is in it." \
  >"$kit/$marker_name"
mkdir -p -- "$kit/debs" "$kit/root"

echo "$program_name: downloading ${#packages[@]} packages into $kit/debs"
# apt-get download writes into the current folder. As root it warns that its sandbox user
# cannot write there; the download is the same, so that one warning is not passed on.
(cd "$kit/debs" && apt-get download -q "${packages[@]}") 2> >(grep -v 'unsandboxed as root' >&2) ||
  fail "apt-get download failed (run apt-get update first; are the package names those of Debian 12?)"

versions=()  # "package version", for the MANIFEST
for package in "${packages[@]}"; do
  deb=$(compgen -G "$kit/debs/${package}_*.deb" | head -n 1) ||
    fail "apt-get download did not fetch $package"
  versions+=("$(dpkg-deb -f "$deb" Package) $(dpkg-deb -f "$deb" Version)")
  dpkg-deb -x "$deb" "$kit/root"
done

# Debian 12 unpacks some libraries into /lib/x86_64-linux-gnu (zlib's) and others into
# /usr/lib/x86_64-linux-gnu: the kit keeps them all in the second, the one env.sh names.
readonly arch_libs=usr/lib/x86_64-linux-gnu
if [[ -d "$kit/root/lib/x86_64-linux-gnu" ]]; then
  mkdir -p "$kit/root/$arch_libs"
  cp -a "$kit/root/lib/x86_64-linux-gnu/." "$kit/root/$arch_libs/"
  rm -rf "$kit/root/lib"
fi

# A symbolic link that names an absolute path (zlib1g-dev's libz.so -> /lib/.../libz.so.1.2.13)
# would reach out of the kit into the machine: point it at the kit's own copy instead.
while IFS= read -r -d '' link; do
  target=$(readlink "$link")
  inside="$kit/root${target/#\/lib\//\/usr\/lib\/}"
  if [[ -e "$inside" ]]; then
    ln -sfn "$(realpath --relative-to="$(dirname "$link")" "$inside")" "$link"
  else
    echo "$program_name: note: ${link#"$kit"/} points outside the kit, to $target" >&2
  fi
done < <(find "$kit/root" -type l -lname '/*' -print0)

# A CMake package file that names the prefix it was installed under (doctest's targets file:
# set(_IMPORT_PREFIX "/usr")) would send CMake to the machine's /usr: compute it from the
# file's own place in the kit instead.
while IFS= read -r -d '' config; do
  up=$(realpath --relative-to="$(dirname "$config")" "$kit/root/usr")  # ../../.. or so
  sed -i "s|^set(_IMPORT_PREFIX \"/usr\")\$|get_filename_component(_IMPORT_PREFIX \"\${CMAKE_CURRENT_LIST_DIR}/$up\" ABSOLUTE)|" "$config"
done < <(grep -rlZ --include='*.cmake' '^set(_IMPORT_PREFIX "/usr")$' "$kit/root" || true)

# The commands Debian makes through its alternatives system (links in /etc/alternatives,
# written when a package is installed, which unpacking does not do).
if [[ "$with_mpi" == yes ]]; then
  for name in mpirun mpiexec; do ln -sfn orterun "$kit/root/usr/bin/$name"; done
  for name in mpicc mpicxx mpic++; do ln -sfn opal_wrapper "$kit/root/usr/bin/$name"; done
fi

# The dataset where env.sh's FASHION_MNIST_DIR points; documentation and manual pages dropped.
mv "$kit/root/usr/share/datasets/fashion-mnist" "$kit/fashion-mnist"
rm -rf "$kit/root/usr/share/datasets" "$kit/root/usr/share/doc" "$kit/root/usr/share/man" "$kit/debs"
# Neither static libraries nor Open MPI's Fortran modules are used by this repository.
find "$kit/root" -name '*.a' -delete
rm -rf "$kit/root/$arch_libs/fortran"

cat >"$kit/env.sh" <<'EOF'
# Source this file from bash to build and run the repository with the kit:
#   source offline-kit/env.sh
# It only sets environment variables, each put in front of what was there.
mgpu_kit=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mgpu_kit_libs="$mgpu_kit/root/usr/lib/x86_64-linux-gnu"
export PATH="$mgpu_kit/root/usr/bin${PATH:+:$PATH}"
export LD_LIBRARY_PATH="$mgpu_kit_libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export CMAKE_PREFIX_PATH="$mgpu_kit/root/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
export FASHION_MNIST_DIR="$mgpu_kit/fashion-mnist"
if [ -d "$mgpu_kit_libs/openmpi" ]; then
  # Open MPI was built for /usr: OPAL_PREFIX moves it, plugins and help texts included.
  export OPAL_PREFIX="$mgpu_kit/root/usr"
  # Its plugins for InfiniBand, UCX and libfabric need libraries the kit leaves out; on one
  # machine it does not use them, so their failing to load is not worth a warning each run.
  export OMPI_MCA_mca_base_component_show_load_errors=0
fi
# NCCL: the CUDA toolkit's where it has one; else the one pip's nvidia-nccl wheel brings
# (PyTorch's), which CMake is pointed at through NCCL_ROOT (cmake/Backend.cmake).
mgpu_cuda=$(dirname "$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")
if [ -z "${NCCL_ROOT:-}" ] && [ ! -f "$mgpu_cuda/include/nccl.h" ]; then
  mgpu_nccl=$(python3 -c 'import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])' 2>/dev/null || true)
  if [ -n "$mgpu_nccl" ] && [ -f "$mgpu_nccl/include/nccl.h" ]; then
    export NCCL_ROOT="$mgpu_nccl"
    export LD_LIBRARY_PATH="$NCCL_ROOT/lib:$LD_LIBRARY_PATH"
  fi
fi
# CMake's default generator runs make; a machine with ninja and no make (pip's ninja, say)
# builds with ninja instead.
if [ -z "${CMAKE_GENERATOR:-}" ] && ! command -v make >/dev/null 2>&1 && command -v ninja >/dev/null 2>&1; then
  export CMAKE_GENERATOR=Ninja
fi
unset mgpu_kit mgpu_kit_libs mgpu_cuda mgpu_nccl
EOF

# What the kit's programs still take from the machine: each library ldd resolves outside the
# kit. For the programs and libmpi that should be the C library and its kin and the compiler's
# runtimes; the rest belong to optional plugins (InfiniBand, UCX, libfabric) that Open MPI
# skips where they do not load.
libraries_from_machine() {  # files...
  { LD_LIBRARY_PATH="$kit/root/$arch_libs" ldd "$@" 2>/dev/null || true; } |
    awk -v kit="$kit" '$2 == "=>" && $3 != "" && index($3, kit) != 1 { print $1 }' | sort -u | paste -sd ' ' -
}
mapfile -d '' core < <(find "$kit/root/usr/bin" "$kit/root/$arch_libs" -maxdepth 1 -type f \
                         \( -name 'orte*' -o -name opal_wrapper -o -name 'libmpi.so.*' \) -print0)
mapfile -d '' all < <(find "$kit/root/usr/bin" "$kit/root/$arch_libs" -maxdepth 1 -type f -name '*.so*' -print0)
from_machine_core=""
from_machine_plugins=""
if [[ "${#core[@]}" -gt 0 ]]; then
  from_machine_core=$(libraries_from_machine "${core[@]}")
  from_machine_plugins=$(comm -13 <(tr ' ' '\n' <<<"$from_machine_core" | sort) \
                              <(libraries_from_machine "${all[@]}" | tr ' ' '\n' | sort) | paste -sd ' ' -)
fi
{
  echo "offline kit for the mgpu repository, written $(date -u '+%Y-%m-%d %H:%M UTC') on $(. /etc/os-release && echo "$PRETTY_NAME")"
  echo
  echo "packages (unpacked into root/):"
  printf '  %s\n' "${versions[@]}"
  echo
  echo "shared libraries that mpirun, orted, the MPI compiler wrappers and libmpi take from the"
  echo "machine they run on (it must have them):"
  echo "  ${from_machine_core:-none}"
  echo "and that only Open MPI's optional plugins take (where missing, the plugin is skipped):"
  echo "  ${from_machine_plugins:-none}"
} >"$kit/MANIFEST"

# Checked again: the folder may have changed during the minutes of the download.
if [[ -e "$final_kit" || -L "$final_kit" ]]; then
  is_ours "$final_kit" ||
    fail "$final_kit is no longer a kit this script wrote ($(not_ours_because "$final_kit")): nothing in it was touched; the new kit was not kept"
  rm -rf -- "$final_kit"
fi
mv -- "$kit" "$final_kit"
made_partial=no
echo "$program_name: wrote $final_kit ($(du -sh "$final_kit" | cut -f 1)); on the GPU machine, from the repository root:"
printf '  source %q/env.sh && tools/gpu_check.sh\n' "$(realpath --relative-to="$repo_root" "$final_kit")"
