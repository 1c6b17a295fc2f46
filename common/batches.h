// The order in which one epoch visits the training set, batch by batch: d2l's
// DataLoader(shuffle=True) without the loading. Each epoch draws a fresh permutation
// from (seed, epoch), so a run is reproducible and any epoch can be re-created alone.
// The last batch keeps the remainder (60000 = 234 * 256 + 96), as d2l's does.
#pragma once
#include <cstdint>
#include <vector>

namespace mgpu {

class ShuffledBatches {
 public:
  ShuffledBatches(int examples, int batch_size, std::uint64_t seed);

  void start_epoch(int epoch);  // draws this epoch's permutation
  int count() const { return (examples_ + batch_size_ - 1) / batch_size_; }
  int size(int batch) const;                   // batch_size, or less for the last one
  const int* indices(int batch) const;         // size(batch) example indices
  const std::vector<int>& order() const { return order_; }  // the whole epoch

 private:
  int examples_, batch_size_;
  std::uint64_t seed_;
  std::vector<int> order_;
};

}  // namespace mgpu
