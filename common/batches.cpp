#include "batches.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "check.h"  // Error
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

std::vector<int> shard_sizes(int n, int k) {
  if (k < 1) throw Error("shard_sizes: need at least one device, got " + std::to_string(k));
  if (n < k)
    throw Error("a batch of " + std::to_string(n) + " examples cannot be split across " + std::to_string(k) +
                " devices: every device needs at least one example");
  std::vector<int> sizes(k, n / k);
  for (int i = 0; i < n % k; ++i) ++sizes[i];
  return sizes;
}

void check_batches_fit(int train_examples, int batch_size, int k) {
  const int smallest = train_examples % batch_size ? train_examples % batch_size : batch_size;
  if (train_examples < k)
    throw Error("only " + std::to_string(train_examples) + " training images for " + std::to_string(k) +
                " devices: every device needs at least one example of every batch (raise --limit-train)");
  if (smallest < k)
    throw Error(std::to_string(train_examples) + " training images in batches of " + std::to_string(batch_size) +
                " leave a last batch of " + std::to_string(smallest) + " example(s) in every epoch, fewer than the " +
                std::to_string(k) + " devices: every device needs at least one example of every batch (change "
                "--limit-train or --batch-size)");
}

}  // namespace mgpu
