// Chapter 05's sampler (chapters/05_multi_process/sampler.h): K ranks that each take their
// block of every global batch train on exactly the examples one process would, and on no
// example twice.
#include <doctest/doctest.h>

#include <algorithm>
#include <vector>

#include "chapters/05_multi_process/sampler.h"
#include "common/batches.h"
#include "common/check.h"

namespace {

using mp::Block;

// The rule, spelled out: n / K each, one more for the first n % K ranks, in rank order.
TEST_CASE("block_of: n / K each, the remainder to the first ranks, side by side") {
  CHECK(mp::block_of(256, 2, 0) == Block{0, 128});
  CHECK(mp::block_of(256, 2, 1) == Block{128, 128});
  CHECK(mp::block_of(257, 2, 0) == Block{0, 129});
  CHECK(mp::block_of(257, 2, 1) == Block{129, 128});
  CHECK(mp::block_of(10, 4, 0) == Block{0, 3});
  CHECK(mp::block_of(10, 4, 1) == Block{3, 3});
  CHECK(mp::block_of(10, 4, 2) == Block{6, 2});
  CHECK(mp::block_of(10, 4, 3) == Block{8, 2});
  CHECK(mp::block_of(96, 1, 0) == Block{0, 96});
  // Fewer items than ranks (a short last batch): the last ranks get empty blocks.
  CHECK(mp::block_of(2, 3, 0) == Block{0, 1});
  CHECK(mp::block_of(2, 3, 1) == Block{1, 1});
  CHECK(mp::block_of(2, 3, 2) == Block{2, 0});
  CHECK(mp::block_of(0, 2, 1) == Block{0, 0});
}

TEST_CASE("block_of refuses a rank outside 0..K-1") {
  CHECK_THROWS_AS(mp::block_of(10, 2, 2), mgpu::Error);
  CHECK_THROWS_AS(mp::block_of(10, 2, -1), mgpu::Error);
  CHECK_THROWS_AS(mp::block_of(10, 0, 0), mgpu::Error);
  CHECK_THROWS_AS(mp::DistributedSampler(100, 10, 3, 3, 1), mgpu::Error);
}

// The properties the chapter relies on, for an epoch of `examples` in global batches of `batch`
// over K ranks, checked in every step of three epochs.
void check_sampler(int examples, int batch, int K) {
  CAPTURE(examples);
  CAPTURE(batch);
  CAPTURE(K);
  std::vector<mp::DistributedSampler> ranks;
  for (int r = 0; r < K; ++r) ranks.emplace_back(examples, batch, K, r, 42);
  mgpu::ShuffledBatches one_process(examples, batch, 42);

  for (int epoch = 0; epoch < 3; ++epoch) {
    CAPTURE(epoch);
    one_process.start_epoch(epoch);
    for (auto& s : ranks) s.start_epoch(epoch);
    // Every rank shuffles the same way, and as one process would.
    for (const auto& s : ranks) REQUIRE(s.order() == one_process.order());
    REQUIRE(ranks[0].steps() == one_process.count());

    std::vector<int> seen;  // every example the ranks train on this epoch
    for (int step = 0; step < one_process.count(); ++step) {
      CAPTURE(step);
      const int n = one_process.size(step);
      CHECK(ranks[0].global_size(step) == n);
      // The blocks, in rank order, are the one-process batch: disjoint, contiguous, complete.
      std::vector<int> joined;
      int largest = 0, smallest = n, next = step * batch;
      for (int r = 0; r < K; ++r) {
        const Block b = ranks[r].block(step);
        CHECK(b.start == next);  // rank r's block starts where rank r-1's ends
        next += b.count;
        joined.insert(joined.end(), ranks[r].order().begin() + b.start, ranks[r].order().begin() + b.start + b.count);
        if (r > 0) CHECK(b.count <= ranks[r - 1].block(step).count);  // larger blocks first
        largest = std::max(largest, b.count);
        smallest = std::min(smallest, b.count);
      }
      CHECK(largest - smallest <= 1);  // equal up to one example
      CHECK(largest == (n + K - 1) / K);
      const std::vector<int> want(one_process.indices(step), one_process.indices(step) + n);
      CHECK(joined == want);
      seen.insert(seen.end(), joined.begin(), joined.end());
    }
    // The epoch is covered: each example exactly once.
    std::sort(seen.begin(), seen.end());
    std::vector<int> all(examples);
    for (int i = 0; i < examples; ++i) all[i] = i;
    CHECK(seen == all);
  }
}

TEST_CASE("the ranks' blocks are disjoint, cover the epoch, differ in size by at most one") {
  check_sampler(60000, 256, 2);  // Fashion-MNIST with d2l's batch: the last batch holds 96
  check_sampler(60000, 256, 3);  // 256 = 86 + 85 + 85; 96 = 32 * 3
  check_sampler(1000, 64, 8);
  check_sampler(28, 13, 3);  // last batch of 2 on 3 ranks: rank 2 gets nothing that step
  check_sampler(100, 7, 1);  // one rank: the whole batch
}

TEST_CASE("the last, short batch is kept and split by the same rule") {
  mp::DistributedSampler r0(60000, 256, 2, 0, 42), r1(60000, 256, 2, 1, 42);
  const int last = r0.steps() - 1;
  CHECK(r0.steps() == 235);  // 234 full batches and one of 96
  CHECK(r0.global_size(last) == 96);
  CHECK(r0.block(last) == Block{last * 256, 48});
  CHECK(r1.block(last) == Block{last * 256 + 48, 48});
}

TEST_CASE("each epoch has its own order, the same on every rank") {
  mp::DistributedSampler a(500, 50, 2, 0, 7), b(500, 50, 2, 1, 7);
  a.start_epoch(0);
  const std::vector<int> first = a.order();
  a.start_epoch(1);
  b.start_epoch(1);
  CHECK(a.order() != first);
  CHECK(a.order() == b.order());
  a.start_epoch(0);  // any epoch can be re-created alone: that is what makes resuming exact
  CHECK(a.order() == first);
}

}  // namespace
