#include "memory.h"

#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>  // program_invocation_short_name
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <new>
#include <thread>

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

namespace {

// Products computing now, the most that ever did at once (OpenBLAS has a buffer for each), and
// when one last began or ended: what BlasRoom counts, under a finite ulimit -v only.
struct BlasProducts {
  std::mutex mutex;
  int running = 0, most = 0;
  std::chrono::steady_clock::time_point last_change;
};
BlasProducts blas_products;

bool address_space_limited() {
  static const bool limited = [] {
    rlimit limit{};
    return getrlimit(RLIMIT_AS, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY;
  }();
  return limited;
}

// The safety net under the check in BlasRoom, for what its count of buffers misses (a mapping
// made by another thread between the check and OpenBLAS's own): a thread that looks once a
// second, and where products are running, none has begun or ended for 10 s and the address
// space left has no room for one more buffer, takes it for OpenBLAS's endless retry, says so
// and ends the program (status 1) instead of leaving it hanging.
void watch_for_a_product_stuck_in_openblas() {
  std::thread([] {
    for (;;) {
      std::this_thread::sleep_for(std::chrono::seconds(1));
      int running = 0;
      double quiet_s = 0;
      {
        std::lock_guard<std::mutex> lock(blas_products.mutex);
        running = blas_products.running;
        quiet_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - blas_products.last_change).count();
      }
      if (running == 0 || quiet_s < 10) continue;
      const MemoryAvailable left = host_memory_available();
      if (left.bytes >= kBlasBufferBytes) continue;
      std::fprintf(stderr,
                   "%s: error: %d matrix product(s) have waited %.0f s inside OpenBLAS, and %s is %zu MB: "
                   "too little for its %zu MB buffers, which Debian's OpenBLAS 0.3.21 then waits for forever "
                   "(OpenMathLib/OpenBLAS#5289); raise ulimit -v, or run fewer --devices\n",
                   program_invocation_short_name, running, quiet_s, left.source.c_str(), left.bytes >> 20,
                   kBlasBufferBytes >> 20);
      std::_Exit(1);  // the stuck thread cannot be stopped, nor exit() run past it
    }
  }).detach();
}

}  // namespace

BlasRoom::BlasRoom() {
  if (!address_space_limited()) return;
  static std::once_flag watching;
  std::call_once(watching, watch_for_a_product_stuck_in_openblas);
  std::lock_guard<std::mutex> lock(blas_products.mutex);
  if (blas_products.running + 1 > blas_products.most) {
    const std::size_t bytes = kBlasBufferBytes;
    void* room = mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (room == MAP_FAILED) {
      const MemoryAvailable left = host_memory_available();
      throw Error("a matrix product (" + std::to_string(blas_products.running + 1) +
                  " computing at once) needs room for one more OpenBLAS buffer, " + std::to_string(bytes >> 20) +
                  " MB of address space, and " + left.source + " is " + std::to_string(left.bytes >> 20) +
                  " MB (OpenBLAS waits forever where it cannot map it: Debian's OpenBLAS 0.3.21, " +
                  "OpenMathLib/OpenBLAS#5289); raise ulimit -v, or run fewer --devices");
    }
    munmap(room, bytes);
    blas_products.most = blas_products.running + 1;
  }
  ++blas_products.running;
  blas_products.last_change = std::chrono::steady_clock::now();
  counted_ = true;
}

BlasRoom::~BlasRoom() {
  if (!counted_) return;
  std::lock_guard<std::mutex> lock(blas_products.mutex);
  --blas_products.running;
  blas_products.last_change = std::chrono::steady_clock::now();
}

std::string gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GiB", bytes / double(1 << 30));
  return buf;
}

std::string mib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", bytes / double(1 << 20));
  return buf;
}

namespace {
// The end of every out-of-memory sentence: what this process could still get, and what to shrink.
std::string what_is_left() {
  const MemoryAvailable host = host_memory_available();
  return "this process could still get about " + gib(double(host.bytes)) + " (" + host.source +
         "): a smaller run (--batch-size, --limit-train, --width, fewer --devices) needs less";
}
}  // namespace

std::string out_of_memory(const std::string& what, std::size_t bytes) {
  return "out of memory: " + what + " of " + mib(double(bytes)) + " could not be allocated; " + what_is_left();
}

std::string error_text(const std::exception& e) {
  if (!dynamic_cast<const std::bad_alloc*>(&e)) return e.what();
  return "out of memory: an allocation failed (std::bad_alloc); " + what_is_left();
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
