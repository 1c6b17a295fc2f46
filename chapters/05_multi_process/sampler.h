// PyTorch's DistributedSampler, as this chapter does it: every rank draws the same shuffled
// order of the training set each epoch (common/batches.h, seeded by the seed and the epoch), cuts
// it into the same global batches, and takes its own block of every batch.
//
//   global batch s of n examples (n = batch size; the last one may be shorter)
//   | rank 0: n/K (+1) | rank 1: n/K (+1) | ... | rank K-1: n/K |
//
// Block r of a global batch holds n/K examples, plus one for the first n % K ranks, so blocks
// differ in size by at most one, and rank r's examples follow rank r-1's. Put the blocks back
// side by side and you have the batch that one process with batch size n would train on: K
// processes compute exactly what one process computes, up to the order of float additions.
// The last batch is kept, short (60,000 = 234 * 256 + 96), and split by the same rule; when it
// holds fewer examples than there are ranks, the last ranks get empty blocks for that step.
#pragma once
#include <cstdint>
#include <vector>

#include "common/batches.h"

namespace mp {

// A run of consecutive positions [start, start + count).
struct Block {
  int start = 0, count = 0;
  bool operator==(const Block& o) const { return start == o.start && count == o.count; }
};

// Rank `rank`'s block of n items shared by `ranks` ranks (see above). Also how the test set is
// split for evaluation.
Block block_of(int n, int ranks, int rank);

class DistributedSampler {
 public:
  DistributedSampler(int examples, int global_batch, int ranks, int rank, std::uint64_t seed);

  void start_epoch(int epoch);  // the same permutation on every rank
  int steps() const { return batches_.count(); }             // global batches per epoch
  int global_size(int step) const { return batches_.size(step); }  // examples in all blocks of a step
  // This rank's block of global batch `step`, as positions in order().
  Block block(int step) const;
  const std::vector<int>& order() const { return batches_.order(); }  // the epoch's permutation

 private:
  mgpu::ShuffledBatches batches_;
  int global_batch_, ranks_, rank_;
};

}  // namespace mp
