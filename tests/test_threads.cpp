// A thread that cannot start (common/threads.h): an error that names the thread and the limits,
// and nothing left half made. The failure is real, not simulated: the address space the process
// may map (RLIMIT_AS, what `ulimit -v` sets; root is held to it too) is lowered for a moment to
// a little more than it maps already, so a new thread's 8 MiB stack cannot be mapped.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "common/check.h"
#include "common/device.h"
#include "common/threads.h"
#include "resource_limits.h"  // ScopedLimit, address_space_now

namespace {

// Runs f() while the process may map only 2 MiB more than it does: less than one thread stack.
// glibc keeps the stacks of finished threads (up to 40 MiB of them) and gives them to new
// threads without mapping anything, so 64 parked threads first take whatever it kept.
template <class F>
void with_no_room_for_a_thread(F f) {
  std::atomic<bool> release{false};
  std::vector<std::thread> parked;
  for (int i = 0; i < 64; ++i)
    parked.emplace_back([&] {
      while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    });
  {
    const testing::ScopedLimit no_room(RLIMIT_AS, testing::address_space_now() + (rlim_t(2) << 20));
    f();
  }
  release = true;
  for (std::thread& t : parked) t.join();
}

// What start_thread throws, or "" if the thread started (then it is joined).
template <class F>
std::string error_starting(F f) {
  try {
    std::thread t = mgpu::start_thread("a test thread", f);
    t.join();
  } catch (const mgpu::Error& e) {
    return e.what();
  }
  return "";
}

TEST_CASE("start_thread runs the function, and names the thread and the limits when it cannot start") {
  std::atomic<int> ran{0};
  CHECK(error_starting([&] { ran = 1; }) == "");
  CHECK(ran == 1);

  std::string error;
  with_no_room_for_a_thread([&] { error = error_starting([&] { ran = 2; }); });
  CHECK(error ==
        "cannot start a test thread: Resource temporarily unavailable (too many threads, or too little memory for "
        "another one's stack: see ulimit -u and ulimit -v)");
  CHECK(ran == 1);
}

#if !MGPU_CUDA
TEST_CASE("a cpu device whose worker thread cannot start is an error naming it, and the next one works") {
  std::string error;
  with_no_room_for_a_thread([&] {
    try {
      const mgpu::DeviceSet devices(1);
    } catch (const mgpu::Error& e) {
      error = e.what();
    }
  });
  CHECK(error.rfind("cannot start a cpu device's worker thread: ", 0) == 0);
  const mgpu::DeviceSet devices(1);  // the limit is back: a device starts as usual
  mgpu::Buffer<float> x(devices[0], 4);
  x.zero();
  CHECK(x.download() == std::vector<float>(4, 0.0f));
}
#endif

}  // namespace
