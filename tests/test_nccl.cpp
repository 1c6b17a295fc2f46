// Chapter 04, on a GPU only (this suite is built where NCCL is, and skips where no GPU
// answers): NCCL's allreduce against the ring, element by element, and a training step with
// ncclSum and with ncclAvg against one with the ring. One rank per GPU: with one GPU the
// comparisons run with k = 1, which still exercises every NCCL call.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "../chapters/03_ring_allreduce/ring.h"
#include "../chapters/04_nccl/nccl_allreduce.h"
#include "common/random.h"
#include "helpers.h"

namespace {

using testing::random_floats;

constexpr int kPixels = 28 * 28;

TEST_CASE("ncclAllReduce (sum) on the flat bucket equals the ring, element by element") {
  const int k = nccl::usable_devices(8);
  CAPTURE(k);
  mgpu::DeviceSet devices(k);
  const std::size_t n = lenet::parameter_count();
  mgpu::Rng rng(5);
  std::vector<std::vector<float>> host(k);
  std::vector<mgpu::Buffer<float>> a, b;  // the same inputs twice: one for each algorithm
  std::vector<float*> pa, pb;
  for (int i = 0; i < k; ++i) {
    host[i] = random_floats(n, rng);
    a.emplace_back(devices[i], n), b.emplace_back(devices[i], n);
    a.back().upload(host[i]), b.back().upload(host[i]);
    pa.push_back(a.back().data()), pb.push_back(b.back().data());
  }
  nccl::NcclAllreduce(devices, nccl::Reduction::Sum).run(pa, mgpu::Elements{n});
  ring::RingAllreduce(devices).run(pb, mgpu::Elements{n});
  devices.synchronize();
  for (int i = 0; i < k; ++i) {
    CAPTURE(i);
    const std::vector<float> got = a[i].download(), want = b[i].download();
    std::size_t wrong = 0;
    for (std::size_t j = 0; j < n; ++j)  // the same sum, perhaps in another order
      if (!(std::abs(got[j] - want[j]) <= 1e-5f * (1 + std::abs(want[j])))) ++wrong;
    CHECK(wrong == 0);
  }
}

lenet::HostParams train_steps(const mgpu::DeviceSet& devices, dp::GradientAllreduce& allreduce) {
  const int k = devices.size(), batch = 24, steps = 3;
  mgpu::Rng rng(11);
  const std::vector<float> X = random_floats(std::size_t(batch) * steps * kPixels, rng, 0.0, 1.0);
  std::vector<std::int32_t> y(std::size_t(batch) * steps);
  for (auto& label : y) label = static_cast<std::int32_t>(rng.below(10));
  std::vector<dp::Replica> replicas;
  replicas.reserve(k);
  for (int i = 0; i < k; ++i)
    replicas.emplace_back(devices[i], lenet::init_params(7, 0.1f), dp::shard_sizes(batch, k)[0], allreduce.layout());
  for (int s = 0; s < steps; ++s)
    dp::train_batch(X.data() + std::size_t(s) * batch * kPixels, y.data() + std::size_t(s) * batch, batch, replicas,
                    allreduce, 0.5f);
  return replicas.back().params.download();
}

TEST_CASE("training steps with ncclSum and with ncclAvg equal steps with the ring") {
  const int k = nccl::usable_devices(8);
  CAPTURE(k);
  mgpu::DeviceSet devices(k);
  ring::RingAllreduce ring(devices);
  nccl::NcclAllreduce sum(devices, nccl::Reduction::Sum), avg(devices, nccl::Reduction::Average);
  CHECK(avg.result_scale() == doctest::Approx(1.0 / k));
  const lenet::HostParams init = lenet::init_params(7, 0.1f);
  const lenet::HostParams want = train_steps(devices, ring);
  for (dp::GradientAllreduce* way : {static_cast<dp::GradientAllreduce*>(&sum), static_cast<dp::GradientAllreduce*>(&avg)}) {
    const lenet::HostParams got = train_steps(devices, *way);
    for (int t = 0; t < lenet::kParamTensors; ++t) {
      CAPTURE(lenet::kParams[t].name);
      double worst = 0, moved = 0;
      for (std::size_t j = 0; j < init[t].size(); ++j) {
        worst = std::max(worst, double(std::abs(got[t][j] - want[t][j])));
        moved = std::max(moved, double(std::abs(want[t][j] - init[t][j])));
      }
      CHECK(moved > 1e-4);
      CHECK(worst <= 1e-5 + 1e-3 * moved);
    }
  }
}

TEST_CASE("NCCL refuses two ranks on one GPU, and says so before NCCL is called") {
  mgpu::DeviceSet devices(mgpu::gpu_count() + 1);  // round-robin: two devices share a GPU
  CHECK_THROWS_WITH_AS(nccl::NcclAllreduce(devices, nccl::Reduction::Sum), doctest::Contains("one GPU per rank"),
                       mgpu::Error);
}

}  // namespace
