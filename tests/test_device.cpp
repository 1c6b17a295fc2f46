// The rules of common/device.h that CUDA enforces on GPUs, checked in both builds so that the
// cpu build (the one CI runs) refuses what would fail on real GPUs:
//   - an event belongs to its device and can be recorded only there;
//   - a kernel or a copy on device d touches only d's memory (a peer copy may read its source).
// Each refusal must name the call and the devices, so a reader can find the offending line.
#include <doctest/doctest.h>

#include <vector>

#include "chapters/01_lenet/layers.h"
#include "common/device.h"
#include "common/gemm.h"

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
    lenet::add_into(d0, y0.data(), x0.data(), 8);
    lenet::add_into(d0, y0.data() + 2, x0.data() + 4, 4);  // a view of part of each buffer
    const std::vector<float> y = y0.download();
    CHECK(y[0] == 3.0f);
    CHECK(y[2] == 4.0f);  // 2 + 1 + 1
    CHECK(y[7] == 3.0f);
  }
  SUBCASE("another device's buffer as a kernel's operand: refused, naming both devices") {
    CHECK_THROWS_WITH_AS(lenet::add_into(d1, x1.data(), x0.data(), 8),
                         doctest::Contains(("add_into (source): device 1 (" + d1.name() + ") touches memory of device 0").c_str()),
                         mgpu::Error);
    CHECK_THROWS_WITH_AS(lenet::add_into(d0, x1.data(), x0.data(), 8),
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
    CHECK_THROWS_WITH_AS(lenet::add_into(d0, y0.data() + 4, x0.data(), 8), doctest::Contains("run past the end"),
                         mgpu::Error);
  }
  SUBCASE("host memory is not any device's memory") {
    std::vector<float> host(8, 0.0f);
    CHECK_THROWS_WITH_AS(lenet::add_into(d0, y0.data(), host.data(), 8),
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
    CHECK_THROWS_AS(mgpu::check_owned(devices[0], stale, 16 * sizeof(float), "test"), mgpu::Error);
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

}  // namespace
