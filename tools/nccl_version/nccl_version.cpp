// nccl_version: which NCCL the programs of this build load, and which nccl.h they were compiled
// against. The two can differ: the build finds a header (say /usr/include/nccl.h) and a library,
// and at run time the dynamic loader may take another libnccl.so.2 (the build's RUNPATH, or
// LD_LIBRARY_PATH: PyTorch's pip wheel brings its own). The header's version says nothing about
// the code that runs; ncclGetVersion, asked of the loaded library, does.
//
//   build/bin/nccl_version
//   library 2.28.9 /opt/venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2
//   header 2.28.3 /usr/include/nccl.h
//
// tools/gpu_check.sh puts the library's version into its report (and the header's where it
// differs). Needs no GPU: ncclGetVersion only reads a number. Built only where CMake found NCCL.
#include <dlfcn.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "common/nccl.h"

namespace {

// ncclGetVersion's code is major*10000 + minor*100 + patch since NCCL 2.9, major*1000 +
// minor*100 + patch before it (NCCL_VERSION in nccl.h).
std::string version_text(int code) {
  const int major = code >= 10000 ? code / 10000 : code / 1000;
  const int minor = code >= 10000 ? code % 10000 / 100 : code % 1000 / 100;
  const int patch = code % 100;
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
}

// The file the loader took ncclGetVersion from. dlsym finds the definition itself (in a
// non-PIE program, &ncclGetVersion could be a stub inside the program), dladdr names its file.
std::string loaded_library() {
  void* symbol = dlsym(RTLD_DEFAULT, "ncclGetVersion");
  Dl_info info{};
  if (symbol == nullptr || dladdr(symbol, &info) == 0 || info.dli_fname == nullptr) return "(path unknown)";
  return info.dli_fname;
}

void usage(std::FILE* to) {
  std::fprintf(to,
               "usage: nccl_version\n"
               "  prints the version and path of the NCCL library this build loads (ncclGetVersion),\n"
               "  then those of the nccl.h it was compiled against:\n"
               "    library <version> <path>\n"
               "    header <version> <path>\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && (std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0)) {
    usage(stdout);
    return 0;
  }
  if (argc > 1) {
    std::fprintf(stderr, "nccl_version: unknown option '%s'\n", argv[1]);
    usage(stderr);
    return 2;
  }
  try {
    int code = 0;
    MGPU_CHECK_NCCL(ncclGetVersion(&code));
    std::printf("library %s %s\n", version_text(code).c_str(), loaded_library().c_str());
    std::printf("header %s %s\n", version_text(NCCL_VERSION_CODE).c_str(), MGPU_NCCL_HEADER);
  } catch (const mgpu::Error& e) {
    std::fprintf(stderr, "nccl_version: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
