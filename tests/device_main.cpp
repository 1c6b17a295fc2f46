// main() for the suites that run code on a device (the layers, LeNet, training).
//
// A cuda build can be compiled on a machine with no GPU (a CI runner, a laptop); there these
// suites cannot run, and passing them would be a lie. They exit with mgpu::kExitNotApplicable
// (77) instead, which the tests' CMakeLists.txt tells ctest (SKIP_RETURN_CODE) to report as
// "skipped".
// The cpu build always has its device: the host.
//
// `--needs-gpus=N` (first argument) skips the same way where fewer than N GPUs answer: a check of
// a collective over one GPU (NCCL's, one rank per GPU) sums one term and would pass whatever
// the collective did, so a check that means two GPUs says so instead of passing.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "common/backend.h"
#include "common/device.h"

int main(int argc, char** argv) {
  std::string suite = argc > 0 ? argv[0] : "this suite";
  suite = suite.substr(suite.find_last_of('/') + 1);  // the program's name, without its folder
  int needs = 1;
  std::vector<char*> args(argv, argv + argc);
  const std::string flag = "--needs-gpus=";
  if (args.size() > 1 && std::string(args[1]).rfind(flag, 0) == 0) {
    const std::string value = std::string(args[1]).substr(flag.size());
    if (value.empty() || value.find_first_not_of("0123456789") != std::string::npos || value.size() > 3) {
      std::fprintf(stderr, "%s: --needs-gpus wants a GPU count, got '%s'\n", suite.c_str(), value.c_str());
      return 2;
    }
    needs = std::stoi(value);
    args.erase(args.begin() + 1);
  }
  if (mgpu::kCudaBackend && mgpu::gpu_count() < needs) {
    if (needs == 1)
      std::printf("no GPU answers: skipping %s\n", suite.c_str());
    else
      std::printf("needs %d GPUs, %d answer: skipping %s\n", needs, mgpu::gpu_count(), suite.c_str());
    return mgpu::kExitNotApplicable;
  }
  doctest::Context context(static_cast<int>(args.size()), args.data());
  return context.run();
}
