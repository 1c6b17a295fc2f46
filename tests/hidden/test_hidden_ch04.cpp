// Chapter 04's hidden cases: group_calls (ex04.group_calls) on device counts, sizes and
// operations the visible tests never use, the broadcast (ex04.broadcast) from a root and of
// sizes they never use, and the communicators' life (ex04.communicators) on 2 to 5 devices,
// made and dropped in turn. The cpu build runs them over the NCCL stand-in
// (tests/nccl_standin/), which refuses a call outside a group and a group missing a rank; the
// cuda build where two GPUs answer, over NCCL.
#include <doctest/doctest.h>

#include <cmath>
#include <stdexcept>
#include <vector>

#include "chapters/04_nccl/nccl_allreduce.h"

namespace {

// Device i's buffer holds (i + 1) * (j % 13 + 1) at element j: small integers, so that any
// order of adding gives the exact sum, (1 + 2 + ... + k) * (j % 13 + 1).
std::vector<float> inputs(int i, std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t j = 0; j < n; ++j) v[j] = float((i + 1) * int(j % 13 + 1));
  return v;
}

// inputs(i, n) on each device i, and the pointers a collective is handed.
struct DeviceInputs {
  std::vector<mgpu::Buffer<float>> buffers;
  std::vector<float*> pointers;
  DeviceInputs(const mgpu::DeviceSet& devices, std::size_t n) {
    for (int i = 0; i < devices.size(); ++i) {
      buffers.emplace_back(devices[i], n);
      buffers.back().upload(inputs(i, n));
      pointers.push_back(buffers.back().data());
    }
  }
};

}  // namespace

TEST_CASE("hidden group_calls: NcclAllreduce sums and averages on 3 to 5 devices and 1 to 100,003 elements, every element") {
  for (int wanted = 3; wanted <= 5; ++wanted) {
    const int k = nccl::usable_devices(wanted);
    if (k < 2) continue;  // over one GPU the sum has one term: nothing to check (the test is run where two answer)
    mgpu::DeviceSet devices(k);
    for (std::size_t n : {std::size_t(1), std::size_t(7), std::size_t(100003)}) {
      for (nccl::Reduction reduction : {nccl::Reduction::Sum, nccl::Reduction::Average}) {
        CAPTURE(k);
        CAPTURE(n);
        CAPTURE(reduction == nccl::Reduction::Sum);
        DeviceInputs data(devices, n);
        nccl::NcclAllreduce allreduce(devices, reduction);
        allreduce.run(data.pointers, mgpu::Elements{n});
        allreduce.run(data.pointers, mgpu::Elements{n});  // twice: the second sums the first's results
        devices.synchronize();
        // The first run leaves the sum (or the mean) everywhere; the second, the sum of k such
        // equal values (or their mean: the same mean). A sum of small integers is exact; a mean
        // may be rounded once (NCCL may multiply by 1/k).
        const double total = k * (k + 1) / 2.0;
        const bool sum = reduction == nccl::Reduction::Sum;
        const double twice = sum ? k * total : total / k;
        for (int i = 0; i < k; ++i) {
          const std::vector<float> got = data.buffers[i].download();
          std::size_t wrong = 0;
          for (std::size_t j = 0; j < n; ++j) {
            const double want = twice * double(j % 13 + 1);
            if (sum ? got[j] != float(want) : !(std::abs(got[j] - want) <= 1e-6 * want)) ++wrong;
          }
          CAPTURE(i);
          CHECK(wrong == 0);
        }
      }
    }
  }
}

TEST_CASE("hidden group_calls: each of the k calls made once, in order, inside one group; two groups back to back") {
  const int k = nccl::usable_devices(4);
  if (k < 2) return;
  mgpu::DeviceSet devices(k);
  std::vector<ncclComm_t> comms(k, nullptr);
  std::vector<int> gpus;
  for (int i = 0; i < k; ++i) gpus.push_back(devices[i].gpu);
  MGPU_CHECK_NCCL(ncclCommInitAll(comms.data(), k, gpus.data()));
  const std::size_t n = 33;
  std::vector<mgpu::Buffer<float>> a, b;
  for (int i = 0; i < k; ++i) {
    a.emplace_back(devices[i], n), b.emplace_back(devices[i], n);
    a.back().upload(inputs(i, n)), b.back().upload(inputs(k - 1 - i, n));
  }
  std::vector<int> called;
  nccl::group_calls(k, [&](int i) {
    called.push_back(i);
    mgpu::allreduce(comms[i], devices[i], a[i].data(), mgpu::Elements{n}, ncclSum);
  });
  nccl::group_calls(k, [&](int i) { mgpu::allreduce(comms[i], devices[i], b[i].data(), mgpu::Elements{n}, ncclSum); });
  devices.synchronize();
  std::vector<int> in_order(k);
  for (int i = 0; i < k; ++i) in_order[i] = i;
  CHECK(called == in_order);
  const double total = k * (k + 1) / 2.0;
  for (int i = 0; i < k; ++i) {
    const std::vector<float> got_a = a[i].download(), got_b = b[i].download();
    for (std::size_t j = 0; j < n; ++j) {
      CHECK(got_a[j] == float(total * double(j % 13 + 1)));
      CHECK(got_b[j] == float(total * double(j % 13 + 1)));
    }
  }
  for (ncclComm_t& c : comms) mgpu::close_communicator(c, false);
}

TEST_CASE("hidden broadcast: 2 to 5 devices, the last device as the root, 1 to 100,003 elements, two in a row") {
  for (int wanted = 2; wanted <= 5; ++wanted) {
    const int k = nccl::usable_devices(wanted);
    if (k < 2) continue;  // over one GPU a broadcast has nobody to reach
    mgpu::DeviceSet devices(k);
    const nccl::Communicators comms(devices);
    for (std::size_t n : {std::size_t(1), std::size_t(3), std::size_t(100003)}) {
      CAPTURE(k);
      CAPTURE(n);
      DeviceInputs data(devices, n);
      // The last device's values to all, then device 1's (by then the last device's too):
      // every buffer ends with the last device's inputs.
      nccl::broadcast(comms, devices, data.pointers, mgpu::Elements{n}, k - 1);
      nccl::broadcast(comms, devices, data.pointers, mgpu::Elements{n}, 1);
      devices.synchronize();
      const std::vector<float> want = inputs(k - 1, n);
      for (int i = 0; i < k; ++i) {
        CAPTURE(i);
        CHECK(data.buffers[i].download() == want);
      }
    }
  }
}

#if !MGPU_CUDA  // the stand-in counts the communicator calls; NCCL itself does not say
TEST_CASE("hidden communicators: allreduces made and dropped in turn on 2 to 5 devices, one of them while an error unwinds") {
  for (int k = 2; k <= 5; ++k) {
    CAPTURE(k);
    mgpu::DeviceSet devices(k);
    const nccl_standin::CommCalls before = nccl_standin::comm_calls();
    for (int round = 0; round < 3; ++round) {
      nccl::NcclAllreduce allreduce(devices, round % 2 ? nccl::Reduction::Average : nccl::Reduction::Sum);
      DeviceInputs data(devices, 5);
      allreduce.run(data.pointers, mgpu::Elements{5});
      devices.synchronize();
    }
    try {
      nccl::NcclAllreduce allreduce(devices, nccl::Reduction::Sum);
      throw std::runtime_error("unwinding");
    } catch (const std::runtime_error&) {
    }
    const nccl_standin::CommCalls after = nccl_standin::comm_calls();
    CHECK(after.made - before.made == 4 * k);
    CHECK(after.finalized - before.finalized == 3 * k);
    CHECK(after.destroyed - before.destroyed == 3 * k);
    CHECK(after.aborted - before.aborted == k);
  }
}
#endif
