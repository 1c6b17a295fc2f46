// The rules of common/device.h that CUDA enforces on GPUs, checked in both builds so that the
// cpu build (the one CI runs) refuses what would fail on real GPUs:
//   - an event belongs to its device and can be recorded only there;
//   - a kernel or a copy on device d touches only d's memory (a peer copy may read its source).
// Each refusal must name the call and the devices, so a reader can find the offending line.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>  // setenv, unsetenv
#include <functional>
#include <string>
#include <vector>

#include "common/device.h"
#include "common/gemm.h"
#include "common/vector_ops.h"

namespace {

using mgpu::Buffer;
using mgpu::DeviceSet;
using mgpu::Elements;
using mgpu::Event;

TEST_CASE("devices of different DeviceSets never pass for each other") {
  const DeviceSet a(2), b(2);
  CHECK(a[0].id != a[1].id);
  CHECK(a[0].id != b[0].id);  // same index, same GPU, another device
  CHECK(a[1].id != b[1].id);
}

TEST_CASE("an event is recorded only on its own device; any device may wait for it") {
  const DeviceSet devices(3);
  Event event(devices[1]);
  SUBCASE("waiting, querying or synchronizing before any record is refused") {
    CHECK_THROWS_WITH_AS(event.make_wait(devices[0]), doctest::Contains("make_wait before Event::record"),
                         mgpu::Error);
    CHECK_THROWS_WITH_AS(event.done(), doctest::Contains("done before Event::record"), mgpu::Error);
    CHECK_THROWS_WITH_AS(event.synchronize(), doctest::Contains("synchronize before Event::record"), mgpu::Error);
  }
  SUBCASE("recorded on its owner, then waited for by every device") {
    event.record(devices[1]);
    for (int i = 0; i < devices.size(); ++i) CHECK_NOTHROW(event.make_wait(devices[i]));
    event.synchronize();
    CHECK(event.done());
  }
  SUBCASE("recorded on another device of the same set: refused, naming both") {
    CHECK_THROWS_WITH_AS(event.record(devices[0]),
                         doctest::Contains(("an event of device 1 (" + devices[1].name() + ") was recorded on device 0").c_str()),
                         mgpu::Error);
    CHECK_THROWS_AS(event.record(devices[2]), mgpu::Error);
  }
  SUBCASE("recorded on the device with the same index in another set: refused") {
    const DeviceSet others(2);
    CHECK_THROWS_AS(event.record(others[1]), mgpu::Error);
  }
  SUBCASE("the owner's device with a second stream may record it (chapter 05's copy stream)") {
    const mgpu::Device same_device_other_stream = devices[1];  // a copy keeps the device's id
    CHECK_NOTHROW(event.record(same_device_other_stream));
  }
}

TEST_CASE("an event needs a device made by a DeviceSet") {
  const mgpu::Device loose{};  // id -1: nobody owns it
  CHECK_THROWS_WITH_AS(Event{loose}, doctest::Contains("was not made by a DeviceSet"), mgpu::Error);
}

TEST_CASE("a kernel on device d may touch only d's memory") {
  const DeviceSet devices(2);
  const mgpu::Device &d0 = devices[0], &d1 = devices[1];
  Buffer<float> x0(d0, 8), y0(d0, 8), x1(d1, 8);
  x0.upload(std::vector<float>(8, 1.0f));
  y0.upload(std::vector<float>(8, 2.0f));

  SUBCASE("its own buffers, and views inside them, are fine") {
    mgpu::add_into(d0, y0.data(), x0.data(), 8);
    mgpu::add_into(d0, y0.data() + 2, x0.data() + 4, 4);  // a view of part of each buffer
    const std::vector<float> y = y0.download();
    CHECK(y[0] == 3.0f);
    CHECK(y[2] == 4.0f);  // 2 + 1 + 1
    CHECK(y[7] == 3.0f);
  }
  SUBCASE("another device's buffer as a kernel's operand: refused, naming both devices") {
    CHECK_THROWS_WITH_AS(mgpu::add_into(d1, x1.data(), x0.data(), 8),
                         doctest::Contains(("add_into (source): device 1 (" + d1.name() + ") touches memory of device 0").c_str()),
                         mgpu::Error);
    CHECK_THROWS_WITH_AS(mgpu::add_into(d0, x1.data(), x0.data(), 8),
                         doctest::Contains("add_into (destination)"), mgpu::Error);
  }
  SUBCASE("gemm checks all three matrices") {
    Buffer<float> a(d0, 4), b(d0, 4), c(d0, 4), c1(d1, 4);
    a.zero();
    b.zero();
    CHECK_NOTHROW(mgpu::gemm(d0, mgpu::Transpose::No, mgpu::Transpose::No, 2, 2, 2, 1.0f, a.data(), b.data(), 0.0f,
                             c.data()));
    CHECK_THROWS_WITH_AS(mgpu::gemm(d0, mgpu::Transpose::No, mgpu::Transpose::No, 2, 2, 2, 1.0f, a.data(), b.data(),
                                    0.0f, c1.data()),
                         doctest::Contains("gemm (C)"), mgpu::Error);
    CHECK_THROWS_WITH_AS(mgpu::gemm(d1, mgpu::Transpose::No, mgpu::Transpose::No, 2, 2, 2, 1.0f, a.data(), b.data(),
                                    0.0f, c1.data()),
                         doctest::Contains("gemm (A)"), mgpu::Error);
  }
  SUBCASE("a range that runs past its buffer is refused") {
    CHECK_THROWS_WITH_AS(mgpu::add_into(d0, y0.data() + 4, x0.data(), 8), doctest::Contains("run past the end"),
                         mgpu::Error);
  }
  SUBCASE("host memory is not any device's memory") {
    std::vector<float> host(8, 0.0f);
    CHECK_THROWS_WITH_AS(mgpu::add_into(d0, y0.data(), host.data(), 8),
                         doctest::Contains("not in any device's memory"), mgpu::Error);
  }
}

TEST_CASE("copies: a peer copy reads its source device and writes its destination device, nothing else") {
  const DeviceSet devices(2);
  const mgpu::Device &d0 = devices[0], &d1 = devices[1];
  Buffer<float> x0(d0, 6), x1(d1, 6);
  x0.upload(std::vector<float>{1, 2, 3, 4, 5, 6});
  x1.zero();
  mgpu::copy_peer(d1, x1.data(), d0, x0.data(), Elements{6});
  CHECK(x1.download() == std::vector<float>{1, 2, 3, 4, 5, 6});
  // The devices named the wrong way round: the destination is not the `to` device's memory.
  CHECK_THROWS_WITH_AS(mgpu::copy_peer(d0, x1.data(), d1, x0.data(), Elements{6}),
                       doctest::Contains("copy_peer (destination)"), mgpu::Error);
  CHECK_THROWS_WITH_AS(mgpu::copy_peer(d1, x1.data(), d1, x0.data(), Elements{6}),
                       doctest::Contains("copy_peer (source)"), mgpu::Error);
  CHECK_THROWS_WITH_AS(mgpu::zero_bytes(d1, x0.data(), 6 * sizeof(float)), doctest::Contains("zero_bytes"),
                       mgpu::Error);
  std::vector<float> host(6);
  CHECK_THROWS_WITH_AS(mgpu::copy_bytes_to_host(d1, host.data(), x0.data(), 6 * sizeof(float)),
                       doctest::Contains("copy_bytes_to_host"), mgpu::Error);
  // Nothing to copy touches nothing.
  CHECK_NOTHROW(mgpu::copy_peer(d0, x1.data(), d1, x0.data(), Elements{0}));
}

TEST_CASE("a freed buffer's memory belongs to no device any more") {
  const DeviceSet devices(1);
  const float* stale = nullptr;
  {
    Buffer<float> b(devices[0], 16);
    stale = b.data();
  }
  Buffer<float> other(devices[0], 1);  // may or may not reuse the memory: then it is this one's
  if (stale != other.data()) {
    const std::string d0 = "device 0 (" + devices[0].name() + ")";
    const std::string expected = "test: " + d0 + " was given memory of a 64-byte buffer of " + d0 + " that has been freed";
    CHECK_THROWS_WITH_AS(mgpu::check_owned(devices[0], stale, 16 * sizeof(float), "test"),
                         doctest::Contains(expected.c_str()), mgpu::Error);
  } else {
    CHECK_THROWS_WITH_AS(mgpu::check_owned(devices[0], stale, 16 * sizeof(float), "test"),
                         doctest::Contains("run past the end"), mgpu::Error);
  }
}

TEST_CASE("idle(): a synchronized device has nothing queued") {
  const DeviceSet devices(2);
  Buffer<float> b(devices[1], 1 << 16);
  b.zero();
  mgpu::synchronize(devices[1]);
  CHECK(mgpu::idle(devices[1]));
  CHECK(mgpu::idle(devices[0]));
}

// A GEMM big enough to take a while on any device: C = A A with A [m x m] all 0.5, so every
// element of C is m / 4 (exact in float).
struct SlowWork {
  SlowWork(const mgpu::Device& d, int m) : d(d), m(m), a(d, std::size_t(m) * m), c(d, std::size_t(m) * m) {
    mgpu::fill(d, a.data(), std::int64_t(m) * m, 0.5f);
  }
  void queue() {
    mgpu::gemm(d, mgpu::Transpose::No, mgpu::Transpose::No, m, m, m, 1.0f, a.data(), a.data(), 0.0f, c.data());
  }
  const mgpu::Device& d;
  int m;
  Buffer<float> a, c;
};

TEST_CASE("queuing work returns at once; the host waits only where it asks to") {
  const DeviceSet devices(1);
  SlowWork work(devices[0], 2048);  // 17 GFLOP: a third of a second on two cores, a millisecond on a GPU
  mgpu::synchronize(devices[0]);
  work.queue();
  CHECK_FALSE(mgpu::idle(devices[0]));  // queued, not yet done: the call did not wait for it
  mgpu::synchronize(devices[0]);
  CHECK(mgpu::idle(devices[0]));
  CHECK(work.c.download()[12345] == 512.0f);
}

TEST_CASE("an event orders one device's copy after another device's work") {
  const DeviceSet devices(2);
  SlowWork work(devices[1], 512);
  Buffer<float> copy(devices[0], work.c.size());
  Event made(devices[1]);
  for (int round = 0; round < 3; ++round) {
    CAPTURE(round);
    work.c.zero();
    work.queue();
    made.record(devices[1]);
    made.make_wait(devices[0]);  // device 0 copies only once device 1 is past the GEMM
    mgpu::copy_peer(devices[0], copy.data(), devices[1], work.c.data(), Elements{work.c.size()});
    const std::vector<float> got = copy.download();
    CHECK(std::count(got.begin(), got.end(), 128.0f) == std::ptrdiff_t(got.size()));
  }
}

TEST_CASE("a second stream on a device: the device's events and memory, work of its own") {
  const DeviceSet devices(1);
  const mgpu::Device& d = devices[0];
  mgpu::SideStream side(d);
  CHECK(side.device().id == d.id);
  SlowWork work(d, 512);
  mgpu::HostBuffer<float> host(work.c.size());
  Event made(d), copied(d);
  work.c.zero();
  work.queue();
  made.record(d);
  made.make_wait(side.device());  // the copy on the side stream follows the GEMM on the main one
  mgpu::copy_bytes_to_host_async(side.device(), host.data(), work.c.data(), work.c.size() * sizeof(float));
  copied.record(side.device());
  copied.synchronize();
  CHECK(std::count(host.data(), host.data() + host.size(), 128.0f) == std::ptrdiff_t(host.size()));
}

TEST_CASE("timestamps: when each device's stream passed a mark, on one clock") {
  const DeviceSet devices(2);
  SlowWork work(devices[0], 512);
  mgpu::synchronize(devices[0]);
  mgpu::Timestamp before, after, other;
  before.record(devices[0]);
  work.queue();
  after.record(devices[0]);
  other.record(devices[1]);
  CHECK(after.seconds() >= before.seconds());
  CHECK(other.seconds() > 0);
  mgpu::Timestamp never;
  CHECK_THROWS_WITH_AS(never.seconds(), doctest::Contains("before Timestamp::record"), mgpu::Error);
}

}  // namespace

#if !MGPU_CUDA
TEST_CASE("a cpu build refuses the GPUs of a SLURM job, naming them; no GPUs, or none given, it runs") {
  // As a job step with GPUs sees it; each variable alone is enough.
  for (const char* name : {"SLURM_GPUS_ON_NODE", "SLURM_JOB_GPUS", "SLURM_STEP_GPUS"}) {
    CAPTURE(name);
    setenv(name, "2", 1);
    std::string error;
    try {
      const mgpu::DeviceSet devices(1);
    } catch (const mgpu::Error& e) {
      error = e.what();
    }
    unsetenv(name);
    CHECK(error.rfind(std::string("this is a cpu build, and SLURM gave this job GPUs (") + name + "=2): ", 0) == 0);
    CHECK(error.find("-DMGPU_BACKEND=cuda") != std::string::npos);
  }
  setenv("SLURM_GPUS_ON_NODE", "0", 1);  // a job without GPUs: a cpu build is what it wants
  CHECK_NOTHROW(mgpu::DeviceSet(1));
  unsetenv("SLURM_GPUS_ON_NODE");
}
#endif

#if !MGPU_CUDA
// The cpu backend's stream itself (common/cpu_stream.h): order, errors, lanes.
#include <atomic>
#include <stdexcept>

#include "common/cpu_stream.h"

TEST_CASE("cpu stream: work runs in the order it was queued, on the worker, while the host goes on") {
  mgpu::cpu::Stream stream(1, 0);
  std::vector<int> order;  // written by the worker only, read after wait()
  for (int i = 0; i < 3000; ++i) stream.submit([&order, i] { order.push_back(i); });  // more than the queue holds
  stream.wait();
  CHECK(stream.idle());
  REQUIRE(order.size() == 3000);
  for (int i = 0; i < 3000; ++i) CHECK(order[i] == i);
}

TEST_CASE("cpu stream: a failure is reported at the host's next wait, later work is skipped, marks still pass") {
  mgpu::cpu::Stream stream(1, 0);
  std::atomic<int> ran{0}, marks{0};
  stream.submit([] { throw mgpu::Error("kernel failed"); });
  stream.submit([&] { ++ran; });
  stream.submit_marker([&] { ++marks; });
  CHECK_THROWS_WITH_AS(stream.wait(), "kernel failed", mgpu::Error);
  CHECK(ran == 0);
  CHECK(marks == 1);  // an event's mark: another device may be waiting for it
  CHECK_THROWS_WITH_AS(stream.wait(), "kernel failed", mgpu::Error);  // sticky, as a CUDA fault is
  stream.wait_quietly();
}

TEST_CASE("cpu stream: lanes run their own queued work at once; events and host waits are refused in a lane") {
  mgpu::cpu::Stream stream(2, 0), other(1, 0);
  std::vector<int> seen(4, 0);
  mgpu::cpu::run_lanes(stream, 2, [&](int lane) {
    for (int j = lane; j < 4; j += 2) stream.submit([&seen, j] { seen[j] = j + 1; });
  });
  stream.wait();
  CHECK(seen == std::vector<int>{1, 2, 3, 4});
  const auto in_a_lane = [&](const std::function<void()>& f) { mgpu::cpu::run_lanes(stream, 2, [&](int) { f(); }); };
  CHECK_THROWS_WITH_AS(in_a_lane([&] { stream.wait(); }), doctest::Contains("a host wait (synchronize, download, upload) inside for_each_lane"),
                       mgpu::Error);
  CHECK_THROWS_WITH_AS(in_a_lane([&] { stream.submit_marker([] {}); }),
                       doctest::Contains("an event's record or wait inside for_each_lane"), mgpu::Error);
  CHECK_THROWS_WITH_AS(in_a_lane([&] { other.submit([] {}); }), doctest::Contains("a lane queued work on another device"),
                       mgpu::Error);
  stream.wait();  // nothing of the refused lanes was queued
}
#endif
