// The kernels and uploads of device_data.h, written once for both backends: each functor sits
// directly above the function that launches it.
#include "device_data.h"

#include <algorithm>

#include "parallel.h"

namespace mgpu {

DeviceImages::DeviceImages(const Device& d, const LabeledImages& host)
    : count(host.count), pixels(d, host.pixels.size()), labels(d, host.labels.size()) {
  pixels.upload(host.pixels);
  labels.upload(host.labels);
}

namespace {
// Item: one example b of the batch, 784 contiguous outputs x[b][0..784) copied from the
// example order[b] of the dataset (and its label, by the owner of pixel 0).
struct GatherImages {
  const float* pixels;
  const std::int32_t* labels;
  const std::int32_t* order;
  float* x;
  std::int32_t* y;
  MGPU_HD void operator()(std::int64_t b, int begin, int end) const {
    const std::int64_t example = order[b];
    const float* __restrict__ src = pixels + example * kImagePixels;
    float* __restrict__ dst = x + b * kImagePixels;
    for (int i = begin; i < end; ++i) dst[i] = src[i];
    if (begin == 0) y[b] = labels[example];
  }
};
}  // namespace

void gather(const Device& d, const DeviceImages& data, const std::int32_t* order, int n, Batch& out) {
  for_each_span(d, n, kImagePixels,
                GatherImages{data.pixels.data(), data.labels.data(), order, out.x.data(), out.y.data()},
                2.0 * sizeof(float) * n * kImagePixels);
}

DeviceData::DeviceData(const Device& d, const LabeledImages& set) : images(d, set), order(d, set.count) {}

std::vector<DeviceData> put_on_every_device(const DeviceSet& devices, const LabeledImages& set) {
  std::vector<int> identity(set.count);
  for (int i = 0; i < set.count; ++i) identity[i] = i;
  std::vector<DeviceData> data;
  data.reserve(devices.size());
  for (int i = 0; i < devices.size(); ++i) {
    data.emplace_back(devices[i], set);
    data.back().order.upload(identity);
  }
  return data;
}

std::array<double, 2> Metrics::read() const {
  const std::vector<double> slots = sums.download();  // [2][kSlots]
  double loss = 0, hits = 0;
  for (int s = 0; s < kSlots; ++s) loss += slots[s], hits += slots[kSlots + s];
  return {loss, hits};
}

namespace {
// Item: one slot s of the metrics: adds the losses and hits of examples s, s + kSlots, ...
// (fewer than n) into slot s's partial sums.
struct AddMetrics {
  const float* loss;
  const float* correct;
  double* sums;  // [2][kSlots]
  int n;
  MGPU_HD void operator()(std::int64_t s) const {
    double l = 0, c = 0;
    for (std::int64_t i = s; i < n; i += Metrics::kSlots) l += loss[i], c += correct[i];
    sums[s] += l;
    sums[Metrics::kSlots + s] += c;
  }
};
}  // namespace

void accumulate_metrics(const Device& d, const float* loss, const float* correct, int n, Metrics& m) {
  for_each_index(d, std::min(n, Metrics::kSlots), AddMetrics{loss, correct, m.sums.data(), n});
}

namespace {
// Item: one of the 2 * kSlots partial sums: into[i] += from[i].
struct AddSums {
  double* into;
  const double* from;
  MGPU_HD void operator()(std::int64_t i) const { into[i] += from[i]; }
};
}  // namespace

void add_metrics(const Device& d, Metrics& into, const Metrics& from) {
  for_each_index(d, 2 * Metrics::kSlots, AddSums{into.sums.data(), from.sums.data()});
}

}  // namespace mgpu
