// How much memory a run may still allocate (common/memory.h), and the refusal that names it.
#include <doctest/doctest.h>

#include <new>
#include <string>

#include "common/device.h"
#include "common/memory.h"
#include "resource_limits.h"  // ScopedLimit, AddressSpaceHeadroom, address_space_now

namespace {

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST_CASE("host memory: MemAvailable, or less where ulimit -v leaves this process less") {
  const mgpu::MemoryAvailable free = mgpu::host_memory_available();
  CHECK(free.bytes > 0);
  CHECK((free.source == "MemAvailable in /proc/meminfo" || free.source == "physical memory" ||
         free.source == "the address space ulimit -v leaves this process"));

  // Lower the address space to 64 MiB more than is mapped now: that is what is left.
  const rlim_t mapped = testing::address_space_now();
  REQUIRE(mapped > 0);
  mgpu::MemoryAvailable limited;
  {
    const testing::ScopedLimit tight(RLIMIT_AS, mapped + (rlim_t(64) << 20));
    limited = mgpu::host_memory_available();
  }
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

TEST_CASE("error_text: an exception's own words, but a sentence with the figures for std::bad_alloc") {
  const mgpu::Error error("--data-dir x: no such directory");
  CHECK(mgpu::error_text(error) == "--data-dir x: no such directory");
  // A real failed allocation, not a made-up one: more than this process may map.
  if (testing::kSanitized) {
    MESSAGE("built with a sanitizer: no capped address space, no failed allocation to look at");
    return;
  }
  std::string text;
  {
    const testing::AddressSpaceHeadroom cap(std::size_t(256) << 20);
    // Through a volatile pointer: a compiler may leave out an allocation nothing reads (clang
    // does, for a vector that is only written), but not a call it cannot see.
    void* (*volatile allocate)(std::size_t) = ::operator new;
    try {
      void* huge = allocate(std::size_t(1) << 33);  // 8 GiB
      ::operator delete(huge);
    } catch (const std::exception& e) {
      text = mgpu::error_text(e);
    }
  }
  CHECK(text.find("out of memory: an allocation failed (std::bad_alloc)") != std::string::npos);
  CHECK(text.find("this process could still get about ") != std::string::npos);
  CHECK(text.find("ulimit -v") != std::string::npos);  // the limit, as the source of the figure
}

TEST_CASE("a device buffer that cannot be allocated says for which device, how large, and what is left") {
#if MGPU_CUDA
  if (mgpu::gpu_count() == 0) {
    MESSAGE("no GPU answers: the cuda build's message is not looked at here");
    return;
  }
  mgpu::DeviceSet devices(1);
  const std::size_t huge = std::size_t(1) << 50;  // 1 PiB: more than any GPU has
#else
  mgpu::DeviceSet devices(1);
  if (testing::kSanitized) {
    MESSAGE("built with a sanitizer: no capped address space, no failed allocation to look at");
    return;
  }
  const testing::AddressSpaceHeadroom cap(std::size_t(256) << 20);
  const std::size_t huge = std::size_t(1) << 33;  // 8 GiB
#endif
  std::string text;
  try {
    mgpu::Buffer<char> buffer(devices[0], huge);
  } catch (const mgpu::Error& e) {
    text = e.what();
  }
  INFO(text);
#if MGPU_CUDA
  CHECK(text.find("out of memory on GPU ") != std::string::npos);
  CHECK(text.find("a buffer of 1073741824.0 MiB for device 0") != std::string::npos);
#else
  CHECK(text.find("out of memory: a buffer for cpu device 0 of 8192.0 MiB could not be allocated") != std::string::npos);
  CHECK(text.find("ulimit -v") != std::string::npos);
#endif
}
