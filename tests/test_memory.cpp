// How much memory a run may still allocate (common/memory.h), and the refusal that names it.
#include <doctest/doctest.h>
#include <sys/resource.h>

#include <fstream>
#include <string>

#include "common/device.h"
#include "common/memory.h"

namespace {

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST_CASE("host memory: MemAvailable, or less where ulimit -v leaves this process less") {
  const mgpu::MemoryAvailable free = mgpu::host_memory_available();
  CHECK(free.bytes > 0);
  CHECK((free.source == "MemAvailable in /proc/meminfo" || free.source == "physical memory" ||
         free.source == "the address space ulimit -v leaves this process"));

  // Lower the address space to 64 MiB more than is mapped now: that is what is left.
  std::size_t mapped = 0;
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmSize:", 0) == 0) mapped = std::stoull(line.substr(7)) * 1024;
  REQUIRE(mapped > 0);
  rlimit saved{};
  REQUIRE(getrlimit(RLIMIT_AS, &saved) == 0);
  rlimit tight = saved;
  tight.rlim_cur = mapped + (std::size_t(64) << 20);
  REQUIRE(setrlimit(RLIMIT_AS, &tight) == 0);
  const mgpu::MemoryAvailable limited = mgpu::host_memory_available();
  REQUIRE(setrlimit(RLIMIT_AS, &saved) == 0);
  CHECK(limited.source == "the address space ulimit -v leaves this process");
  CHECK(limited.bytes <= (std::size_t(64) << 20));
  CHECK(limited.bytes > (std::size_t(32) << 20));  // the probe itself maps little
}

#if !MGPU_CUDA
TEST_CASE("memory_refusal: devices sharing the host need their bytes together, with the figures said") {
  const mgpu::DeviceSet devices(2);
  CHECK(mgpu::memory_refusal(devices, 1 << 20, "a small run", "do less") == "");
  const std::string why =
      mgpu::memory_refusal(devices, std::size_t(1) << 50, "a run of a pebibyte a device", "lower --width");
  INFO(why);
  CHECK(contains(why, "a run of a pebibyte a device needs 2097152.0 GiB of host memory (1048576.0 GiB for each of "
                      "the 2 devices sharing it), and "));
  CHECK(contains(why, " is available ("));
  CHECK(contains(why, "): lower --width"));
}
#endif

}  // namespace
