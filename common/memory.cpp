#include "memory.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <new>

#include "backend.h"
#include "check.h"

namespace mgpu {

namespace {

// The first number on the line of `file` that starts with `key` ("MemAvailable:   22096464 kB"),
// in kB; 0 when there is none.
std::size_t kilobytes_in(const char* file, const std::string& key) {
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);)
    if (line.rfind(key, 0) == 0) return std::strtoull(line.c_str() + key.size(), nullptr, 10);
  return 0;
}

}  // namespace

MemoryAvailable host_memory_available() {
  MemoryAvailable m;
  if (const std::size_t kb = kilobytes_in("/proc/meminfo", "MemAvailable:"); kb > 0)
    m = {kb * 1024, "MemAvailable in /proc/meminfo"};
  else
    m = {std::size_t(sysconf(_SC_PHYS_PAGES)) * std::size_t(sysconf(_SC_PAGE_SIZE)), "physical memory"};
  rlimit limit{};
  if (getrlimit(RLIMIT_AS, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) {
    const std::size_t mapped = kilobytes_in("/proc/self/status", "VmSize:") * 1024;
    const std::size_t left = limit.rlim_cur > mapped ? limit.rlim_cur - mapped : 0;
    if (left < m.bytes) m = {left, "the address space ulimit -v leaves this process"};
  }
  return m;
}

MemoryAvailable gpu_memory_available([[maybe_unused]] int gpu) {
#if MGPU_CUDA
  std::size_t free = 0, total = 0;
  MGPU_CHECK_CUDA(cudaSetDevice(gpu));
  MGPU_CHECK_CUDA(cudaMemGetInfo(&free, &total));
  return {free, "cudaMemGetInfo"};
#else
  throw Error("gpu_memory_available: this is not a cuda build");
#endif
}

std::string gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GiB", bytes / double(1 << 30));
  return buf;
}

std::string error_text(const std::exception& e) {
  if (!dynamic_cast<const std::bad_alloc*>(&e)) return e.what();
  const MemoryAvailable host = host_memory_available();
  return "out of memory: an allocation failed (std::bad_alloc); this process could still get about " +
         gib(double(host.bytes)) + " (" + host.source + "): a smaller run (--batch-size, --limit-train, --width, " +
         "fewer --devices) needs less";
}

std::string memory_refusal(const DeviceSet& devices, std::size_t bytes_per_device, const std::string& what,
                           const std::string& advice) {
  // Devices by the memory they draw on: -1 for the host's, else the GPU's ordinal.
  std::map<int, int> sharing;
  for (int i = 0; i < devices.size(); ++i) ++sharing[devices[i].gpu];
  for (const auto& [gpu, count] : sharing) {
    const MemoryAvailable there = gpu < 0 ? host_memory_available() : gpu_memory_available(gpu);
    const double needed = double(bytes_per_device) * count;
    if (needed > double(there.bytes)) {
      const std::string where = gpu < 0 ? "host memory" : "memory on GPU " + std::to_string(gpu);
      const std::string each = count > 1 ? " (" + gib(double(bytes_per_device)) + " for each of the " +
                                               std::to_string(count) + " devices sharing it)"
                                         : "";
      return what + " needs " + gib(needed) + " of " + where + each + ", and " + gib(double(there.bytes)) +
             " is available (" + there.source + "): " + advice;
    }
  }
  return "";
}

}  // namespace mgpu
