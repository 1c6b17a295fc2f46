// The order in which an epoch visits the training set (common/batches.h): d2l's
// DataLoader(shuffle=True), as indices.
#include <doctest/doctest.h>

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <vector>

#include "common/batches.h"

namespace {

// Is `v` some ordering of 0..n-1, each exactly once?
bool is_permutation_of_range(std::vector<int> v, int n) {
  if (int(v.size()) != n) return false;
  std::sort(v.begin(), v.end());
  for (int i = 0; i < n; ++i)
    if (v[i] != i) return false;
  return true;
}

// The epoch's examples as the batches hand them out, one after the other.
std::vector<int> walk_batches(const mgpu::ShuffledBatches& batches) {
  std::vector<int> seen;
  for (int b = 0; b < batches.count(); ++b) seen.insert(seen.end(), batches.indices(b), batches.indices(b) + batches.size(b));
  return seen;
}

TEST_CASE("every epoch visits each example exactly once, and the batches cover it in order") {
  mgpu::ShuffledBatches batches(1000, 64, 42);
  for (int epoch = 0; epoch < 5; ++epoch) {
    CAPTURE(epoch);
    batches.start_epoch(epoch);
    CHECK(is_permutation_of_range(batches.order(), 1000));
    CHECK(walk_batches(batches) == batches.order());
  }
}

TEST_CASE("the last batch holds the remainder") {
  mgpu::ShuffledBatches small(10, 4, 1);  // 10 = 4 + 4 + 2
  REQUIRE(small.count() == 3);
  CHECK(small.size(0) == 4);
  CHECK(small.size(1) == 4);
  CHECK(small.size(2) == 2);

  mgpu::ShuffledBatches fashion(60000, 256, 1);  // 60000 = 234 * 256 + 96
  CHECK(fashion.count() == 235);
  CHECK(fashion.size(233) == 256);
  CHECK(fashion.size(234) == 96);

  mgpu::ShuffledBatches exact(12, 4, 1);  // no remainder: no short batch either
  CHECK(exact.count() == 3);
  CHECK(exact.size(2) == 4);

  mgpu::ShuffledBatches one(3, 256, 1);  // a batch larger than the data set
  CHECK(one.count() == 1);
  CHECK(one.size(0) == 3);
}

TEST_CASE("the same seed and epoch give the same order; other epochs and seeds do not") {
  mgpu::ShuffledBatches a(500, 32, 7), b(500, 32, 7), other_seed(500, 32, 8);
  a.start_epoch(3);
  b.start_epoch(3);
  other_seed.start_epoch(3);
  CHECK(a.order() == b.order());
  CHECK(a.order() != other_seed.order());

  // Any epoch can be re-created alone, whatever came before it.
  const std::vector<int> epoch3 = a.order();
  a.start_epoch(4);
  const std::vector<int> epoch4 = a.order();
  CHECK(epoch4 != epoch3);
  a.start_epoch(3);
  CHECK(a.order() == epoch3);

  // And it is shuffled at all: not the identity.
  std::vector<int> identity(500);
  std::iota(identity.begin(), identity.end(), 0);
  CHECK(epoch3 != identity);
}

TEST_CASE("an empty data set or batch is refused") {
  CHECK_THROWS_AS(mgpu::ShuffledBatches(0, 4, 1), std::invalid_argument);
  CHECK_THROWS_AS(mgpu::ShuffledBatches(10, 0, 1), std::invalid_argument);
}

}  // namespace
