// Chapter 03: the flat bucket, the ring allreduce (every element, every device, awkward
// sizes), the benchmark's own check and command line, the cost model's arithmetic, and
// training with the ring against training with chapter 02's allreduce.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/allreduce_bench.h"
#include "common/cost_model.h"
#include "../chapters/03_ring_allreduce/ring.h"
#include "common/random.h"
#include "data_parallel_checks.h"
#include "helpers.h"

namespace {

using mgpu::Elements;
using testing::random_floats;


TEST_CASE("chunk_of cuts n elements into k chunks that tile [0, n), the first n % k one longer") {
  for (int k = 1; k <= 8; ++k)
    for (std::size_t n : {0, 1, 2, 5, 7, 8, 9, 64, 1009, 129068}) {
      CAPTURE(k);
      CAPTURE(n);
      std::size_t next = 0;
      for (int c = 0; c < k; ++c) {
        const mgpu::Chunk chunk = mgpu::chunk_of(Elements{n}, k, c);
        CHECK(chunk.begin == next);
        CHECK(chunk.count == n / k + (std::size_t(c) < n % k ? 1 : 0));
        next = chunk.begin + chunk.count;
      }
      CHECK(next == n);
    }
  CHECK(mgpu::chunk_of(Elements{2}, 4, 3).count == 0);  // fewer elements than devices: empty chunks
}

// One buffer of n floats per device, device i's holding host_of(i), and the pointers an
// allreduce takes (data_parallel_checks.h).
using testing::OnDevices;

// The halves alone, for k = 1..5 devices and sizes below, at and above k. bench::input's small
// integers again, so sums are exact in any order.
TEST_CASE("reduce_scatter: device i ends with the whole sum of chunk (i + 1) mod k") {
  for (int k = 1; k <= 5; ++k)
    for (std::size_t n : {std::size_t(3), std::size_t(13), std::size_t(1009)}) {
      CAPTURE(k);
      CAPTURE(n);
      mgpu::DeviceSet devices(k);
      std::vector<float> sum(n, 0.0f);
      OnDevices on(devices, n, [&](int i) {
        std::vector<float> host(n);
        for (std::size_t j = 0; j < n; ++j) host[j] = bench::input(i, j), sum[j] += host[j];
        return host;
      });
      ring::RingAllreduce allreduce(devices, n);
      allreduce.reduce_scatter(on.data, Elements{n});
      testing::check_reduced_chunks(on.buffers, sum);
    }
}

TEST_CASE("reduce_scatter: rounds queued back to back, each device's complete chunk exact every round") {
  for (int k = 2; k <= 5; ++k) testing::check_reduce_scatter_rounds(k, 4099, 4, /*seed=*/0, /*seed_step=*/3);
}

TEST_CASE("all_gather: every device ends with chunk (i + 1) mod k of each device i, everywhere") {
  for (int k = 1; k <= 5; ++k)
    for (std::size_t n : {std::size_t(3), std::size_t(13), std::size_t(1009)}) {
      CAPTURE(k);
      CAPTURE(n);
      mgpu::DeviceSet devices(k);
      std::vector<float> expected(n);
      for (std::size_t j = 0; j < n; ++j) expected[j] = bench::input(7, j);
      // Device i holds only its own chunk; everything else is -1, which no input is.
      OnDevices on(devices, n, [&](int i) {
        const mgpu::Chunk own = mgpu::chunk_of(Elements{n}, k, (i + 1) % k);
        std::vector<float> host(n, -1.0f);
        for (std::size_t j = own.begin; j < own.begin + own.count; ++j) host[j] = expected[j];
        return host;
      });
      ring::RingAllreduce allreduce(devices, n);
      allreduce.all_gather(on.data, Elements{n});
      for (int i = 0; i < k; ++i) testing::check_equal(on.buffers[i].download(), expected, "device " + std::to_string(i));
    }
}

// Every element of every device's buffer must be the sum over devices of random inputs
// (compared with a double-precision sum: the ring adds in another order than a loop does).
void check_ring(int k, std::size_t n) {
  testing::check_allreduce_sums(k, n, 1000 + 17 * k + n, [n](const mgpu::DeviceSet& devices) -> testing::AllreduceRun {
    auto ring = std::make_shared<ring::RingAllreduce>(devices, n);
    return [ring](const std::vector<float*>& data, Elements count) { ring->run(data, count); };
  });
}

TEST_CASE("ring allreduce: every element on every device is the sum, k = 1..8, awkward sizes") {
  for (int k = 1; k <= 8; ++k) {
    const std::size_t uk = k;
    // 0, 1, k-1, k, k+1 (fewer elements than devices, exactly one each, one left over), primes,
    // and LeNet's 129,068 gradients.
    for (std::size_t n : {std::size_t(0), std::size_t(1), uk - 1, uk, uk + 1, std::size_t(13), std::size_t(1009),
                          std::size_t(129068)})
      check_ring(k, n);
  }
}

TEST_CASE("ring allreduce of the benchmark's inputs is exact, and repeated runs stay correct") {
  // bench::input gives small integers: their sums are exact in float in any order, so the
  // result must be equal, not merely close. Three runs in a row on the same buffers check that
  // the ring leaves nothing behind that spoils the next run.
  const int k = 5;
  const std::size_t n = 4099;
  mgpu::DeviceSet devices(k);
  std::vector<mgpu::Buffer<float>> buffers;
  std::vector<float*> data;
  for (int i = 0; i < k; ++i) buffers.emplace_back(devices[i], n), data.push_back(buffers.back().data());
  ring::RingAllreduce allreduce(devices, n);
  for (int run = 0; run < 3; ++run) {
    CAPTURE(run);
    std::vector<float> expected(n, 0.0f);
    for (int i = 0; i < k; ++i) {
      std::vector<float> host(n);
      for (std::size_t j = 0; j < n; ++j) host[j] = bench::input(i + run, j), expected[j] += host[j];
      buffers[i].upload(host);
    }
    allreduce.run(data, Elements{n});
    devices.synchronize();
    for (int i = 0; i < k; ++i) testing::check_equal(buffers[i].download(), expected, "device " + std::to_string(i));
  }
}

TEST_CASE("ring allreduce refuses too many elements, a wrong buffer count and per-tensor gradients") {
  mgpu::DeviceSet devices(2);
  mgpu::Buffer<float> a(devices[0], 16), b(devices[1], 16);
  ring::RingAllreduce small(devices, 8);
  CHECK_THROWS_WITH_AS(small.run({a.data(), b.data()}, Elements{16}), doctest::Contains("exceed"), mgpu::Error);
  CHECK_THROWS_WITH_AS(small.run({a.data()}, Elements{4}), doctest::Contains("one buffer per device"), mgpu::Error);

  // Replicas that store their gradients tensor by tensor have no flat bucket to hand it.
  std::vector<dp::Replica> per_tensor;
  per_tensor.reserve(2);
  for (int i = 0; i < 2; ++i) per_tensor.emplace_back(devices[i], lenet::init_params(1), 1, lenet::Layout::PerTensor);
  CHECK_THROWS_WITH_AS(dp::flat_gradients(per_tensor), doctest::Contains("tensor by tensor"), mgpu::Error);
}

TEST_CASE("the flat bucket: 129,068 parameters at aligned offsets, eight views, writes seen both ways") {
  CHECK(lenet::parameter_count() == 129068);
  // Each tensor starts on a multiple of 64 floats (256 bytes), right after the one before.
  const std::int64_t want[] = {0, 192, 256, 25280, 25344, 127744, 127872, 129152, 129216};
  for (int t = 0; t <= lenet::kParamTensors; ++t) {
    CAPTURE(t);
    CHECK(lenet::offset_of(t) == want[t]);
    CHECK(lenet::offset_of(t) % lenet::kFlatAlignment == 0);
    if (t > 0) {
      const std::int64_t end_of_previous = lenet::offset_of(t - 1) + lenet::kParams[t - 1].count;
      CHECK(lenet::offset_of(t) >= end_of_previous);
      CHECK(lenet::offset_of(t) - end_of_previous < lenet::kFlatAlignment);
    }
  }
  CHECK(lenet::flat_count() == lenet::offset_of(lenet::kParamTensors));
  mgpu::DeviceSet devices(1);
  const mgpu::Device& d = devices[0];
  lenet::Params p = lenet::zero_params(d, lenet::Layout::Flat);
  REQUIRE(p.layout() == lenet::Layout::Flat);
  for (int t = 0; t < lenet::kParamTensors; ++t) CHECK(p.tensors[t] == p.flat() + lenet::offset_of(t));

  // Through the views: upload distinct tensors, read the flat buffer.
  const lenet::HostParams host = lenet::init_params(3, 0.5f);
  p.upload(host);
  std::vector<float> flat(lenet::flat_count());
  mgpu::copy_bytes_to_host(d, flat.data(), p.flat(), flat.size() * sizeof(float));
  for (int t = 0; t < lenet::kParamTensors; ++t) {
    CAPTURE(lenet::kParams[t].name);
    const std::vector<float> part(flat.begin() + lenet::offset_of(t), flat.begin() + lenet::offset_of(t) + host[t].size());
    testing::check_equal(part, host[t], "flat buffer at the view's offset");
  }
  // The padding between the tensors holds zeros (summing or updating it changes nothing).
  int nonzero_padding = 0;
  for (int t = 0; t < lenet::kParamTensors; ++t)
    for (std::int64_t j = lenet::offset_of(t) + lenet::kParams[t].count; j < lenet::offset_of(t + 1); ++j)
      nonzero_padding += flat[j] != 0.0f;
  CHECK(nonzero_padding == 0);
  // Through the flat buffer: write it whole, read each view.
  for (std::size_t j = 0; j < flat.size(); ++j) flat[j] = float(j);
  mgpu::copy_bytes_to_device(d, p.flat(), flat.data(), flat.size() * sizeof(float));
  const lenet::HostParams back = p.download();
  for (int t = 0; t < lenet::kParamTensors; ++t) {
    CAPTURE(lenet::kParams[t].name);
    CHECK(back[t].front() == float(lenet::offset_of(t)));
    CHECK(back[t].back() == float(lenet::offset_of(t) + lenet::kParams[t].count - 1));
  }
  // One memset zeroes all eight.
  p.zero();
  CHECK(p.download() == lenet::init_params(3, 0.0f));
  // Per-tensor parameters have no flat buffer to give.
  lenet::Params separate = lenet::zero_params(d);
  CHECK_THROWS_AS(separate.flat(), mgpu::Error);
}

// 4 steps of 13 random images on k devices, gradients stored as `layout` says and summed by the
// allreduce that make_allreduce builds; every device's final parameters.
std::vector<lenet::HostParams> train_steps(
    int k, lenet::Layout layout,
    const std::function<std::unique_ptr<mgpu::Collective>(const mgpu::DeviceSet&)>& make_allreduce) {
  const int batch = 13, steps = 4;
  mgpu::Rng rng(77);
  const mgpu::LabeledImages set = testing::random_set(batch * steps, rng);
  mgpu::DeviceSet devices(k);
  const std::unique_ptr<mgpu::Collective> allreduce = make_allreduce(devices);
  return testing::train_steps(devices, *allreduce, layout, set, batch, steps, 0.5f);
}

TEST_CASE("training with the ring takes the steps that training with chapter 02's allreduce takes") {
  const lenet::HostParams init = lenet::init_params(7, 0.1f);
  for (int k : {2, 3}) {
    CAPTURE(k);
    const lenet::Layout per_tensor = lenet::Layout::PerTensor, flat = lenet::Layout::Flat;
    const auto naive = train_steps(k, per_tensor, [&](const mgpu::DeviceSet& d) {
      return std::make_unique<dp::Allreduce>(d, dp::largest_gradient_sum(per_tensor));
    });
    const auto ring = train_steps(k, flat, [&](const mgpu::DeviceSet& d) {
      return std::make_unique<ring::RingAllreduce>(d, dp::largest_gradient_sum(flat));
    });
    // Same sums in another order: equal to float rounding (and every ring replica agrees).
    for (int i = 0; i < k; ++i) testing::check_same_training(ring[i], naive[0], init, "ring device " + std::to_string(i));
  }
}

TEST_CASE("the benchmark's check counts wrong elements: a broken allreduce is caught") {
  mgpu::DeviceSet devices(3);
  bench::Settings s;
  s.min_bytes = 4;
  s.max_bytes = 1 << 12;
  s.warmup = 1;
  s.iters = 1;
  bench::Contenders naive_and_ring;  // as 03_allreduce_bench compares them
  naive_and_ring.add_collectives = [](mgpu::CollectiveMenu& menu, const mgpu::DeviceSet& d) {
    dp::add_collectives(menu, d);
    ring::add_collectives(menu, d);
  };
  naive_and_ring.names = {"naive", "ring", "not on the menu"};  // a name the menu lacks is left out
  auto results = bench::run_benchmark(devices, s, naive_and_ring);
  REQUIRE(results.size() == 2 * 11);  // 4 B .. 4 KiB, two algorithms
  for (const bench::Measurement& m : results) {
    CAPTURE(m.algorithm);
    CAPTURE(m.bytes);
    CHECK(m.wrong == 0);
    CHECK(m.count * sizeof(float) == m.bytes);
    CHECK(m.busbw == doctest::Approx(m.algbw * 2.0 * 2 / 3));
  }
  // An "allreduce" that loses the last device's input before summing: every device ends wrong.
  class Broken : public mgpu::Collective {
   public:
    Broken(const mgpu::DeviceSet& d, std::size_t max) : devices_(d), ring_(d, max) {}
    std::string name() const override { return "broken"; }
    void run(const mgpu::DeviceBuffers& data, Elements n) override {
      std::vector<float> zero(n.count, 0.0f);
      mgpu::copy_bytes_to_device(devices_[2], data[2], zero.data(), n.count * sizeof(float));
      ring_.run(data, n);
    }

   private:
    const mgpu::DeviceSet& devices_;
    ring::RingAllreduce ring_;
  };
  bench::Contenders broken;
  broken.add_collectives = [](mgpu::CollectiveMenu& menu, const mgpu::DeviceSet& d) {
    menu.add("broken", [&d](std::size_t max) { return std::make_unique<Broken>(d, max); });
  };
  broken.names = {"broken"};
  results = bench::run_benchmark(devices, s, broken);
  REQUIRE(results.size() == 11);  // 4 B .. 4 KiB, one algorithm: the loop below must check them
  for (const bench::Measurement& m : results) {
    CAPTURE(m.bytes);
    const std::size_t nonzero_inputs = [&] {  // elements where device 2's input is not 0
      std::size_t c = 0;
      for (std::size_t j = 0; j < m.count; ++j) c += bench::input(2, j) != 0;
      return c;
    }();
    CHECK(m.wrong == 3 * nonzero_inputs);  // wrong on all three devices, wherever it mattered
  }
}

TEST_CASE("the benchmark's command line: nccl-tests' flags, and the old names as aliases") {
  using bench::parse_settings;
  const bench::ParsedSettings defaults = parse_settings({});
  CHECK(defaults.error.empty());
  CHECK(defaults.settings.device_counts == std::vector<int>{2, 4, 8});
  CHECK(defaults.settings.max_bytes == std::size_t(256) << 20);
  CHECK(defaults.settings.step_factor == 2);

  // nccl-tests' short and long names: -g/--ngpus, -b/--minbytes, -e/--maxbytes, -f/--stepfactor,
  // -n/--iters, -w/--warmup_iters.
  const auto p = parse_settings({"-g", "2,3", "-b", "1K", "-e", "64M", "-f", "4", "-n", "7", "-w", "2"});
  REQUIRE(p.error.empty());
  CHECK(p.settings.device_counts == std::vector<int>{2, 3});
  CHECK(p.settings.min_bytes == 1024);
  CHECK(p.settings.max_bytes == std::size_t(64) << 20);
  CHECK(p.settings.step_factor == 4);
  CHECK(p.settings.iters == 7);
  CHECK(p.settings.warmup == 2);
  const auto l = parse_settings({"--ngpus=4", "--minbytes=8", "--maxbytes=1G", "--stepfactor=8", "--warmup_iters=0",
                                 "--iters=3"});
  REQUIRE(l.error.empty());
  CHECK(l.settings.device_counts == std::vector<int>{4});
  CHECK(l.settings.max_bytes == std::size_t(1) << 30);
  CHECK(l.settings.step_factor == 8);
  CHECK(l.settings.warmup == 0);
  // The names of before still work.
  const auto old = parse_settings({"--devices", "1,2", "--min-bytes", "4", "--max-bytes", "4K", "--warmup", "1"});
  REQUIRE(old.error.empty());
  CHECK(old.settings.device_counts == std::vector<int>{1, 2});
  CHECK(old.settings.max_bytes == 4096);
  CHECK(old.settings.warmup == 1);

  // Sizes as nccl-tests reads them: K, M, G in either case, and fractions of them.
  CHECK(parse_settings({"-e", "1.5k"}).settings.max_bytes == 1536);
  CHECK(parse_settings({"-e", "2m"}).settings.max_bytes == std::size_t(2) << 20);
  CHECK(parse_settings({"-e", "1.1"}).error.find("--maxbytes: needs a byte count") == 0);
  CHECK(parse_settings({"-e", "12X"}).error.find("--maxbytes: needs a byte count") == 0);
  CHECK(parse_settings({"-e", "+4K"}).error.find("--maxbytes: needs a byte count") == 0);
  // A size is a whole number of floats: 1023 bytes is not rounded down to 1020 without a word.
  CHECK(parse_settings({"-e", "1023"}).error == "--maxbytes: 1023 is not a multiple of 4: the messages are floats, 4 bytes each");
  CHECK(parse_settings({"-b", "6"}).error.find("--minbytes: 6 is not a multiple of 4") == 0);
  CHECK(parse_settings({"-b", "2"}).error == "--minbytes: must be at least 4 (one float), got 2");
  CHECK(parse_settings({"-b", "1M", "-e", "1K"}).error == "--minbytes 1048576 is larger than --maxbytes 1024");

  // The sizes measured: times -f, or plus -i.
  CHECK(bench::message_sizes(parse_settings({"-b", "1K", "-e", "64K", "-f", "4"}).settings) ==
        std::vector<std::size_t>{1024, 4096, 16384, 65536});
  CHECK(bench::message_sizes(parse_settings({"-b", "4", "-e", "20", "-i", "8"}).settings) ==
        std::vector<std::size_t>{4, 12, 20});
  CHECK(bench::message_sizes(defaults.settings).size() == 27);  // 4 B to 256 MiB, doubling
  CHECK(parse_settings({"-f", "1"}).error == "--stepfactor: must be at least 2, got 1");
  CHECK(parse_settings({"-f", "4", "-i", "1K"}).error.find("--stepfactor and --stepbytes") == 0);
  CHECK(parse_settings({"-b", "4", "-e", "1M", "-i", "4"}).error.find("--stepbytes 4 makes more than 1000 sizes") == 0);

  const std::string counts = "--ngpus: needs a comma-separated list of device counts from 1 to 64, got ";
  CHECK(parse_settings({"-g", "2,,4"}).error == counts + "'2,,4'");
  CHECK(parse_settings({"-g", "2,"}).error == counts + "'2,'");
  CHECK(parse_settings({"-g", "0"}).error == counts + "'0'");
  CHECK(parse_settings({"-g", "65"}).error == counts + "'65'");
  CHECK(parse_settings({"-n", "-1"}).error == "--iters: must be zero or more, got -1");
  CHECK(parse_settings({"--alpha-us", "x"}).error == "--alpha-us: needs a number, got 'x'");
  CHECK(parse_settings({"--bogus", "1"}).error == "unknown option '--bogus'");
  CHECK(parse_settings({"-w"}).error == "--warmup_iters needs a value");
  CHECK(parse_settings({"--help"}).help);
  CHECK(parse_settings({"-h"}).help);
  CHECK(parse_settings({"--out", ""}).error == "--out: needs a directory");
  CHECK(parse_settings({"-g", "2", "stray"}).error.find("stray") != std::string::npos);

  // Real values are checked after conversion, and within what the cost model can print.
  CHECK(parse_settings({"--alpha-us", "1e300"}).error == "--alpha-us: must be at most 1000000, got 1e300");
  CHECK(parse_settings({"--alpha-us", "-1"}).error == "--alpha-us: must be zero or more, got -1");
  CHECK(parse_settings({"--alpha-us", "0"}).error.empty());

  // -n 0 picks the count from the warmup's time, so it needs a warmup to time.
  CHECK(parse_settings({"-w", "0"}).error.find("--iters 0 ") == 0);
  CHECK(parse_settings({"-w", "0", "-n", "5"}).error.empty());
}

TEST_CASE("the benchmark's memory check") {
  // The memory a run takes, counted before it starts (a run that does not fit is refused): at
  // 1 MiB on 4 devices, a buffer each (4 MiB), the ring's staging (a quarter each, 1 MiB), the
  // naive allreduce's (1 MiB, device 0), and the check's two host copies (2 MiB).
  const std::size_t MiB = std::size_t(1) << 20;
  bench::Settings s;
  s.max_bytes = MiB;
  const bench::MemoryNeed cpu = bench::memory_needed(s, 4, 0);
  CHECK(cpu.gpu_bytes.empty());
  CHECK(cpu.host_bytes == 8 * MiB);
  const bench::MemoryNeed two_gpus = bench::memory_needed(s, 4, 2);  // devices 0, 2 on GPU 0; 1, 3 on GPU 1
  CHECK(two_gpus.gpu_bytes == std::vector<std::size_t>{MiB * 7 / 2, MiB * 5 / 2});
  CHECK(two_gpus.host_bytes == 2 * MiB);
  CHECK(bench::memory_needed(s, 1, 8).gpu_bytes == std::vector<std::size_t>{3 * MiB});
}

TEST_CASE("the cost model: the ring's bandwidth term is 2(k-1)/k S/B, the naive one grows with k") {
  // With alpha = 0 and adds free, only the link term is left.
  const cost::Interconnect link{"test", 0.0, 1e9, 1e300, ""};
  const double S = 1e9;  // one second over the link
  for (int k = 2; k <= 8; ++k) {
    CAPTURE(k);
    CHECK(cost::ring_seconds(link, k, S) == doctest::Approx(2.0 * (k - 1) / k));
    CHECK(cost::naive_seconds(link, k, S) == doctest::Approx(2.0 * (k - 1)));
  }
  CHECK(cost::ring_seconds(link, 1, S) == 0);
  // With bandwidth free, only alphas: 2(k-1) transfers and (k-1) adds for the ring.
  const cost::Interconnect latency_only{"test", 1e-6, 1e300, 1e300, ""};
  CHECK(cost::ring_seconds(latency_only, 4, S) == doctest::Approx(9e-6));
  CHECK(cost::naive_seconds(latency_only, 4, S) == doctest::Approx(7e-6));
  // Shared memory: the same bytes, k times the operations.
  cost::SharedMemory m;
  m.copy_alpha_s = 1e-6, m.add_alpha_s = 2e-6, m.copy_s_per_byte = 1e-9, m.add_s_per_byte = 3e-9;
  for (int k = 2; k <= 8; ++k) {
    CAPTURE(k);
    CHECK(cost::naive_seconds(m, k, S) == doctest::Approx((k - 1) * (4e-6 + 5.0)));
    CHECK(cost::ring_seconds(m, k, S) == doctest::Approx(k * (k - 1) * 4e-6 + (k - 1) * 5.0));
  }
  // One float on 4 devices: three of the four chunks are empty and cost nothing.
  CHECK(cost::ring_seconds(m, 4, 4.0) == doctest::Approx(3 * (4e-6 + 4.0 * (2 * 1e-9 + 3e-9) / 4)));
}

}  // namespace

TEST_CASE("cost::calibrate measures a peer copy into device 1 and an add over device 1's own memory") {
  // The add a ring step makes runs on the receiving device over two of its own buffers; timing
  // it over a buffer of another device would read across the link (and, without peer access,
  // is an illegal address on GPUs: refused here by the device rules in both builds).
  const mgpu::DeviceSet devices(2);
  const cost::SharedMemory m = cost::calibrate(devices);
  CHECK(m.copy_alpha_s > 0);
  CHECK(m.add_alpha_s > 0);
  CHECK(m.copy_s_per_byte >= 0);
  CHECK(m.add_s_per_byte >= 0);
  CHECK_THROWS_WITH_AS(cost::calibrate(mgpu::DeviceSet(1)), doctest::Contains("needs two devices"), mgpu::Error);
}
