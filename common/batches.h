// The order in which one epoch visits the training set, batch by batch: d2l's
// DataLoader(shuffle=True) without the loading. Each epoch draws a fresh permutation
// from (seed, epoch), so a run is reproducible and any epoch can be re-created alone.
// The last batch keeps the remainder (60000 = 234 * 256 + 96), as d2l's does. And how a batch
// is cut across k devices (chapter 02 teaches it; every data-parallel chapter uses it).
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

namespace mgpu {

// The most examples one batch of an epoch can hold: --batch-size, or the whole training set
// when that is smaller (then an epoch is one batch, as d2l's DataLoader gives it). Buffers are
// sized by this, never by the flag alone: --batch-size 10000000 on 512 images must allocate for
// 512, not fail for 31 GB.
inline int largest_batch(int batch_size, int train_examples) { return std::min(batch_size, train_examples); }

// Shard sizes for a batch of n examples on k devices: n / k each, and one more for the first
// n % k devices (257 on 2 devices: 129 + 128). n < k is an error: a device would get nothing.
std::vector<int> shard_sizes(int n, int k);

// Before the first step: refuses (naming the numbers and what to change) a training set whose
// batches, the short last one of each epoch included, would leave a device without an example.
void check_batches_fit(int train_examples, int batch_size, int k);

// Batches of batch_size in an epoch of `examples`, the last one short when they do not divide.
inline int batches_per_epoch(int examples, int batch_size) { return (examples + batch_size - 1) / batch_size; }

class ShuffledBatches {
 public:
  ShuffledBatches(int examples, int batch_size, std::uint64_t seed);

  void start_epoch(int epoch);  // draws this epoch's permutation
  int count() const { return batches_per_epoch(examples_, batch_size_); }
  int size(int batch) const;                   // batch_size, or less for the last one
  const int* indices(int batch) const;         // size(batch) example indices
  const std::vector<int>& order() const { return order_; }  // the whole epoch

 private:
  int examples_, batch_size_;
  std::uint64_t seed_;
  std::vector<int> order_;
};

}  // namespace mgpu
