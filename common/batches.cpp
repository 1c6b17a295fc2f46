#include "batches.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "random.h"

namespace mgpu {

ShuffledBatches::ShuffledBatches(int examples, int batch_size, std::uint64_t seed)
    : examples_(examples), batch_size_(batch_size), seed_(seed) {
  if (examples < 1 || batch_size < 1)
    throw std::invalid_argument("ShuffledBatches: need examples >= 1 and batch_size >= 1, got " +
                                std::to_string(examples) + " and " + std::to_string(batch_size));
  start_epoch(0);
}

void ShuffledBatches::start_epoch(int epoch) {
  // A distinct, reproducible stream per epoch (the odd constant spreads nearby seeds apart).
  Rng rng(seed_ * 0x9E3779B97F4A7C15ull + static_cast<std::uint64_t>(epoch));
  order_ = random_permutation(examples_, rng);
}

int ShuffledBatches::size(int batch) const {
  return std::min(batch_size_, examples_ - batch * batch_size_);
}

const int* ShuffledBatches::indices(int batch) const {
  return order_.data() + static_cast<std::size_t>(batch) * batch_size_;
}

}  // namespace mgpu
