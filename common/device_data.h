// Training data resident on the devices, and the running sums a training step adds into there:
// taught in chapters 01 and 02 (chapters/02_data_parallel/README.md, "What graduates to
// common/") and kept here, as d2l's #@save keeps a function in its library, for every chapter
// that trains on Fashion-MNIST.
//
//   DeviceImages         a dataset split on one device, uploaded once
//   Batch, gather        a batch (or a device's shard of one), gathered on the device
//   DeviceData           the training set and the epoch's order, on one device
//   put_on_every_device  one DeviceData per device
//   Metrics              an epoch's loss and hits, summed on the device
#pragma once
#include <array>
#include <cstdint>
#include <vector>

#include "device.h"
#include "fashion_mnist.h"

namespace mgpu {

inline constexpr int kImagePixels = 28 * 28;  // Fashion-MNIST's images (load_fashion_mnist checks it)

// A dataset split resident on a device, uploaded once.
struct DeviceImages {
  DeviceImages(const Device& d, const LabeledImages& host);
  int count;
  Buffer<float> pixels;         // [count][28*28]
  Buffer<std::int32_t> labels;  // [count]
};

// A batch (or one device's shard of a batch) on a device.
struct Batch {
  Batch(const Device& d, int capacity) : x(d, std::size_t(capacity) * kImagePixels), y(d, capacity) {}
  Buffer<float> x;         // [1][n][28][28]  images (C = 1, so also [n][28][28])
  Buffer<std::int32_t> y;  // [n]             labels
};

// Copies examples order[0..n) of `data` into out; `order` is on the device.
void gather(const Device& d, const DeviceImages& data, const std::int32_t* order, int n, Batch& out);

// The training set on one device, uploaded once, and the epoch's order of its examples, uploaded
// once per epoch. d2l's loop hands every batch from the host (its DataLoader) to the devices;
// with the whole set on every device (188 MB of images: little beside a GPU's memory) no step
// moves an image across the host link, and a step needs nothing from the host but kernel
// launches. (The host's copy of the batch was a round trip per step, with a wait per device.)
struct DeviceData {
  DeviceData(const Device& d, const LabeledImages& set);
  DeviceImages images;          // [count][28][28] pixels, [count] labels
  Buffer<std::int32_t> order;   // [count]: the epoch's permutation (ShuffledBatches::order)
};
// One DeviceData per device, all with the whole of `set` (its order: 0, 1, 2, ... until set).
std::vector<DeviceData> put_on_every_device(const DeviceSet& devices, const LabeledImages& set);

// Running sums over an epoch, kept on the device so no step waits for the host. A sum of a
// batch's losses is a reduction; done by one thread it would leave a GPU idle and, worse, be
// serial in the batch size. Here it is done in two stages: each step adds example i into slot
// i % kSlots (kSlots threads, each adding its few examples), and read() adds up the slots once
// an epoch, when the host wants the number anyway.
struct Metrics {
  static constexpr int kSlots = 1024;
  explicit Metrics(const Device& d) : sums(d, 2 * kSlots) { sums.zero(); }
  Buffer<double> sums;  // [2][kSlots]: partial loss sums, then partial counts of correct answers
  void reset() { sums.zero(); }
  std::array<double, 2> read() const;  // [loss sum, correct count]; synchronizes
};
// Adds n examples' loss [n] and correct [n] (1 or 0), on d, into m.
void accumulate_metrics(const Device& d, const float* loss, const float* correct, int n, Metrics& m);
// into += from, slot by slot (one device's lanes, summed at the end of a step: chapter 01).
void add_metrics(const Device& d, Metrics& into, const Metrics& from);

}  // namespace mgpu
