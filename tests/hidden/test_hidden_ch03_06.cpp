// The hidden cases of chapters 03 and 06: the properties the visible tests check, on inputs they
// never use. Chapter 03's ring run round after round with no host synchronization between the
// rounds (the waits that end each half are all that keeps one round's writes from the last
// one's reads), on device counts the visible tests do not try; chapter 06's roundings on the
// corners of the formats (negative ties, the largest finite values, NaN payloads, subnormals),
// the loss scaler with other settings, and the 16-bit ring on 5 to 7 devices, with a sum that
// overflows fp16. ctest runs some of them in chaos mode (tests/hidden/CMakeLists.txt).
#include <doctest/doctest.h>

#include <cfenv>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "common/allreduce_bench.h"
#include "../../chapters/03_ring_allreduce/ring.h"
#include "../../chapters/06_mixed_precision/formats.h"
#include "../../chapters/06_mixed_precision/loss_scaler.h"
#include "../../chapters/06_mixed_precision/ring16.h"
#include "../../chapters/06_mixed_precision/train.h"  // name_of
#include "common/random.h"
#include "data_parallel_checks.h"
#include "helpers.h"
#include "mixed_precision_checks.h"  // MixedSetup, CountingRing

namespace {

using mgpu::Elements;
using mixed::Precision;

// ---- chapter 03 ------------------------------------------------------------------------------

// k devices' buffers of n floats, refilled from `inputs` by copies queued on each device's own
// stream (the host never waits between rounds, as in training).
struct Rounds {
  Rounds(const mgpu::DeviceSet& devices, std::size_t n) : devices(devices) {
    for (int i = 0; i < devices.size(); ++i) {
      buffers.emplace_back(devices[i], n), data.push_back(buffers.back().data());
      inputs.emplace_back(devices[i], n);
    }
  }
  // Device i's input of round r: bench::input's small integers, whose sums are exact in any order.
  std::vector<float> input(int i, int r, std::size_t n) const {
    std::vector<float> host(n);
    for (std::size_t j = 0; j < n; ++j) host[j] = bench::input(5 * r + i + 2, j);
    return host;
  }
  void queue_inputs(int r, std::size_t n) {
    for (int i = 0; i < devices.size(); ++i) {
      inputs[i].upload(input(i, r, n));  // waits for device i: its last round's work is done
      mgpu::copy_peer(devices[i], data[i], devices[i], inputs[i].data(), Elements{n});
    }
  }
  const mgpu::DeviceSet& devices;
  std::vector<mgpu::Buffer<float>> buffers, inputs;
  std::vector<float*> data;
};

TEST_CASE("hidden reduce_scatter: rounds back to back on 6 to 8 devices, no host wait between them") {
  for (int k = 6; k <= 8; ++k)
    for (std::size_t n : {std::size_t(k + 3), std::size_t(2053)})
      testing::check_reduce_scatter_rounds(k, n, 4, /*seed=*/2, /*seed_step=*/5);
}

TEST_CASE("hidden ring allreduce: rounds back to back on 3 to 7 devices, each round's sum exact") {
  for (int k = 3; k <= 7; ++k) {
    CAPTURE(k);
    const std::size_t n = 1000 + 7 * k;
    mgpu::DeviceSet devices(k);
    ring::RingAllreduce ring(devices, n);
    Rounds rounds(devices, n);
    for (int r = 0; r < 4; ++r) {
      CAPTURE(r);
      std::vector<float> sum(n, 0.0f);
      for (int i = 0; i < k; ++i) {
        const std::vector<float> in = rounds.input(i, r, n);
        for (std::size_t j = 0; j < n; ++j) sum[j] += in[j];
      }
      rounds.queue_inputs(r, n);
      ring.run(rounds.data, Elements{n});
      // And at once a second run on the sums, queued behind the first: every device then holds k times the sum.
      ring.run(rounds.data, Elements{n});
      std::vector<float> twice(n);
      for (std::size_t j = 0; j < n; ++j) twice[j] = float(k) * sum[j];
      for (int i = 0; i < k; ++i) testing::check_equal(rounds.buffers[i].download(), twice, "device " + std::to_string(i));
    }
  }
}

// ---- chapter 06 ------------------------------------------------------------------------------

std::uint16_t bf16_bits(std::uint32_t fp32_bits) { return mixed::to_bf16(mixed::float_of(fp32_bits)); }

TEST_CASE("hidden bf16: negative ties, the largest finite values, NaN payloads, subnormals") {
  CHECK(bf16_bits(0xbf808000u) == 0xbf80u);  // -(1 + 2^-8): a tie, the even neighbour -1
  CHECK(bf16_bits(0xbf818000u) == 0xbf82u);  // -(1 + 3 * 2^-8): a tie, to the even 0xbf82, away from 0
  CHECK(bf16_bits(0xbf808001u) == 0xbf81u);  // just past the tie: away from -1
  CHECK(bf16_bits(0x7f7fffffu) == 0x7f80u);  // the largest fp32 rounds past the largest bf16: infinity
  CHECK(bf16_bits(0xff7fffffu) == 0xff80u);
  CHECK(bf16_bits(0x7f7f7fffu) == 0x7f7fu);  // below the tie: the largest finite bf16
  CHECK(bf16_bits(0x80000000u) == 0x8000u);  // -0 stays -0
  CHECK(bf16_bits(0x00008000u) == 0x0000u);  // a subnormal tie: even, 0
  CHECK(bf16_bits(0x00018000u) == 0x0002u);  // a subnormal tie, up to even
  for (std::uint32_t nan : {0x7f800001u, 0x7fc00000u, 0xff80ffffu, 0x7f80ffffu}) {
    CAPTURE(nan);
    const std::uint16_t b = bf16_bits(nan);
    CHECK((b & 0x7f80u) == 0x7f80u);
    CHECK((b & 0x007fu) != 0);  // still a NaN, never infinity
    CHECK((b & 0x8000u) == ((nan >> 16) & 0x8000u));
  }
}

TEST_CASE("hidden tf32: ties on both sides of zero, overflow to infinity, NaN kept") {
  const float one = 1.0f;
  const float ulp = std::ldexp(1.0f, -10);
  CHECK(mixed::to_tf32(-(one + ulp / 2)) == -one);                  // a tie: even
  CHECK(mixed::to_tf32(-(one + 3 * ulp / 2)) == -(one + 2 * ulp));  // a tie: even, up
  CHECK(mixed::to_tf32(std::ldexp(1.0f, -130)) == std::ldexp(1.0f, -130));  // a subnormal with few bits: exact
  CHECK(std::isinf(mixed::to_tf32(std::numeric_limits<float>::max())));
  CHECK(mixed::to_tf32(-std::numeric_limits<float>::max()) < 0);
  CHECK(std::isnan(mixed::to_tf32(mixed::float_of(0x7f800001u))));  // a payload only in the dropped bits
  CHECK(mixed::bits_of(mixed::to_tf32(-0.0f)) == 0x80000000u);
}

TEST_CASE("hidden fp16: shift_right_rounded against the FPU's own rounding, every shift") {
  // A double holds m / 2^shift exactly; nearbyint rounds it to nearest, ties to even (the
  // default mode), independently of the bit arithmetic under test.
  REQUIRE(std::fegetround() == FE_TONEAREST);
  mgpu::Rng rng(606);
  for (int shift = 1; shift <= 24; ++shift) {
    CAPTURE(shift);
    int wrong = 0;
    for (int t = 0; t < 4000; ++t) {
      std::uint32_t m = static_cast<std::uint32_t>(rng.below(std::uint64_t(1) << 24));  // below 2^24
      if (t % 4 == 1) m = (m >> shift << shift) | (1u << (shift - 1));             // an exact tie
      const double want = std::nearbyint(std::ldexp(double(m), -shift));
      wrong += double(mixed::shift_right_rounded(m, shift)) != want;
    }
    CHECK(wrong == 0);
  }
  CHECK(mixed::to_fp16(-65520.0f) == 0xfc00u);
  CHECK(mixed::to_fp16(std::ldexp(3.0f, -25)) == 0x0002u);  // 1.5 * 2^-24: a tie between 1 and 2 ulps, to even
}

TEST_CASE("hidden LossScaler: growth 4, backoff 1/4, interval 3: the scale and the counts, step by step") {
  mixed::LossScaler::Settings s;
  s.initial_scale = 1024.0f;
  s.growth_interval = 3;
  s.growth = 4.0f;
  s.backoff = 0.25f;
  mixed::LossScaler scaler(s);
  struct Step {
    bool inf;
    bool skipped;
    float scale_after;
  };
  const Step steps[] = {{false, false, 1024}, {false, false, 1024}, {true, true, 256},   // the count restarts
                        {false, false, 256},  {false, false, 256},  {false, false, 1024},  // 3 clean: x4
                        {false, false, 1024}, {true, true, 256},    {true, true, 64},
                        {false, false, 64},   {false, false, 64},   {false, false, 256}};
  long skipped = 0;
  for (std::size_t i = 0; i < std::size(steps); ++i) {
    CAPTURE(i);
    CHECK(scaler.update(steps[i].inf) == steps[i].skipped);
    skipped += steps[i].skipped;
    CHECK(scaler.scale() == steps[i].scale_after);
    CHECK(scaler.skipped() == skipped);
    CHECK(scaler.steps() == long(i + 1));
  }
}

// Device i's values of round r on n elements: small integers, exact in both 16-bit formats and
// in every partial sum of up to 7 of them.
std::vector<float> small_integers(int i, int r, std::size_t n) {
  std::vector<float> host(n);
  for (std::size_t j = 0; j < n; ++j) host[j] = float(int((j * 11 + i * 5 + r * 3) % 29) - 14);
  return host;
}

TEST_CASE("hidden Ring16Allreduce: 5 to 7 devices, both formats, rounds back to back, exact") {
  for (Precision p : {Precision::BF16, Precision::FP16})
    for (int k = 5; k <= 7; ++k)
      for (std::size_t n : {std::size_t(2), std::size_t(k - 1), std::size_t(3001)}) {
        CAPTURE(mixed::name_of(p));
        CAPTURE(k);
        CAPTURE(n);
        mgpu::DeviceSet devices(k);
        std::vector<mgpu::Buffer<float>> buffers, inputs;
        std::vector<float*> data;
        for (int i = 0; i < k; ++i) buffers.emplace_back(devices[i], n), inputs.emplace_back(devices[i], n);
        for (int i = 0; i < k; ++i) data.push_back(buffers[i].data());
        mixed::Ring16Allreduce ring(devices, p, n + 10);
        for (int r = 0; r < 3; ++r) {
          CAPTURE(r);
          std::vector<float> sum(n, 0.0f);
          for (int i = 0; i < k; ++i) {
            const std::vector<float> in = small_integers(i, r, n);
            for (std::size_t j = 0; j < n; ++j) sum[j] += in[j];
            inputs[i].upload(in);
            mgpu::copy_peer(devices[i], data[i], devices[i], inputs[i].data(), Elements{n});
          }
          ring.run(data, Elements{n});
          for (int i = 0; i < k; ++i) testing::check_equal(buffers[i].download(), sum, "device " + std::to_string(i));
        }
      }
}

TEST_CASE("hidden Ring16Allreduce: an fp16 sum past 65504 is infinity on every device, the others exact") {
  const int k = 3;
  const std::size_t n = 301;
  mgpu::DeviceSet devices(k);
  std::vector<mgpu::Buffer<float>> buffers;
  std::vector<float*> data;
  // Element 7 of every device is 30000: each alone fits fp16, two of them (60000) too, three
  // (90000) do not. Every other element is a small integer.
  for (int i = 0; i < k; ++i) {
    std::vector<float> host = small_integers(i, 0, n);
    host[7] = 30000.0f;
    buffers.push_back(testing::on_device(devices[i], host));
    data.push_back(buffers.back().data());
  }
  std::vector<float> sum(n, 0.0f);
  for (int i = 0; i < k; ++i) {
    const std::vector<float> in = small_integers(i, 0, n);
    for (std::size_t j = 0; j < n; ++j) sum[j] += in[j];
  }
  mixed::Ring16Allreduce ring(devices, Precision::FP16, n);
  ring.run(data, Elements{n});
  for (int i = 0; i < k; ++i) {
    CAPTURE(i);
    std::vector<float> got = buffers[i].download();
    CHECK(std::isinf(got[7]));
    CHECK(got[7] > 0);
    got[7] = sum[7];
    testing::check_equal(got, sum, "device " + std::to_string(i) + ", the other elements");
  }
}

}  // namespace

// ---- chapter 06: the trainer's step (ex06.accumulate, ex06.loss_scaler_update) ------------------

namespace {

// k devices with the same random training set, another seed than the visible tests'.
struct Devices06 : testing::MixedSetup {
  Devices06(int k, int examples) : MixedSetup(k, examples, 606) {}
};
using testing::CountingRing;

// `steps` optimizer steps of `batch` examples in micro-batches of `micro` on s's devices: the
// master weights at the end, and the exchange's calls.
lenet::HostParams steps_of(Devices06& s, const mixed::MixedOptions& mo, int batch, int micro, int steps, int* calls) {
  CountingRing exchange(s.devices);
  mixed::MixedTrainer trainer(s.devices, mo, micro, lenet::init_params(23, 0.1f), exchange);
  for (int step = 0; step < steps; ++step) CHECK(trainer.step(s.data, step * batch, batch, 0.2f));
  *calls = exchange.calls;
  return trainer.master_params();
}

}  // namespace

TEST_CASE("hidden accumulate: 51 examples a step as 16 + 16 + 16 + 3 on 3 devices equal one batch of 51 on one") {
  for (Precision p : {Precision::FP32, Precision::BF16}) {
    CAPTURE(mixed::name_of(p));
    mixed::MixedOptions mo;
    mo.precision = p;
    Devices06 one(1, 3 * 51), three(3, 3 * 51);
    int calls_one = 0, calls_three = 0;
    const lenet::HostParams want = steps_of(one, mo, 51, 51, 3, &calls_one);
    const lenet::HostParams got = steps_of(three, mo, 51, 16, 3, &calls_three);
    CHECK(calls_one == 3);
    CHECK(calls_three == 3);  // one exchange a step, whatever the micro-batches
    testing::check_same_training(got, want, lenet::init_params(23, 0.1f), "3 devices, 16+16+16+3 vs 1 device, 51");
  }
}

TEST_CASE("hidden accumulate: fp16 with loss scaling, 5 micro-batches of 8 on 2 devices equal one batch of 40") {
  mixed::MixedOptions mo;
  mo.precision = Precision::FP16;
  mo.loss_scaling = true;
  mo.scaler.initial_scale = 1024.0f;
  Devices06 one(1, 2 * 40), two(2, 2 * 40);
  int calls_one = 0, calls_two = 0;
  const lenet::HostParams want = steps_of(one, mo, 40, 40, 2, &calls_one);
  const lenet::HostParams got = steps_of(two, mo, 40, 8, 2, &calls_two);
  CHECK(calls_two == 2);
  testing::check_same_training(got, want, lenet::init_params(23, 0.1f), "fp16, 2 devices x 5 micro-batches vs 1 batch");
}

TEST_CASE("hidden skip: an inf on the last of 3 devices skips the step on all, the scale halves, the next step moves all alike") {
  Devices06 s(3, 4 * 30);
  mixed::MixedOptions mo;
  mo.precision = Precision::FP16;
  mo.loss_scaling = true;
  mo.scaler.initial_scale = 8.0f;
  CountingRing exchange(s.devices);
  exchange.poison_element = 1234;
  mixed::MixedTrainer trainer(s.devices, mo, 30, lenet::init_params(29, 0.1f), exchange);
  CHECK(trainer.step(s.data, 0, 30, 0.3f));
  const lenet::HostParams after_one = trainer.master_params();
  exchange.poison_device = 2;
  CHECK_FALSE(trainer.step(s.data, 30, 30, 0.3f));
  CHECK(trainer.scaler()->skipped() == 1);
  CHECK(trainer.scaler()->scale() == 4.0f);
  for (dp::Replica& r : trainer.replicas()) CHECK(r.params.download() == after_one);  // bit for bit
  exchange.poison_device = -1;
  CHECK(trainer.step(s.data, 60, 30, 0.3f));
  const lenet::HostParams after_three = trainer.replicas()[0].params.download();
  CHECK(after_three != after_one);
  for (dp::Replica& r : trainer.replicas()) CHECK(r.params.download() == after_three);
}
