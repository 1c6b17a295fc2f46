// main() for the suites that run code on a device (the layers, LeNet, training).
//
// A cuda build can be compiled on a machine with no GPU (a CI runner, a laptop); there these
// suites cannot run, and passing them would be a lie. They exit with mgpu::kExitNotApplicable
// (77) instead, which the tests' CMakeLists.txt tells ctest (SKIP_RETURN_CODE) to report as
// "skipped".
// The cpu build always has its device: the host.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <string>

#include "common/backend.h"
#include "common/device.h"

int main(int argc, char** argv) {
  if (mgpu::kCudaBackend && mgpu::gpu_count() == 0) {
    std::string suite = argc > 0 ? argv[0] : "this suite";
    suite = suite.substr(suite.find_last_of('/') + 1);  // the program's name, without its folder
    std::printf("no GPU answers: skipping %s\n", suite.c_str());
    return mgpu::kExitNotApplicable;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
