// The hidden cases of chapter 05: the sampler on other epoch sizes, batch sizes and rank counts,
// and the bootstrap on keys, buffers and sharing patterns the visible tests do not use. Launched
// by ctest as `mpirun -np 2 test_hidden_ch05` (tests/hidden/CMakeLists.txt): every rank runs every
// case, and the ranks meet in the collectives inside them.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "chapters/05_multi_process/collective.h"
#include "chapters/05_multi_process/sampler.h"
#include "chapters/05_multi_process/world.h"
#include "common/batches.h"

namespace {

mp::World world() { return mp::describe_world(MPI_COMM_WORLD); }

TEST_CASE("hidden sampler: block_of tiles n items for every n below 300 and 1 to 17 ranks") {
  int wrong = 0;
  for (int ranks = 1; ranks <= 17; ++ranks)
    for (int n = 0; n < 300; ++n) {
      int next = 0;
      for (int r = 0; r < ranks; ++r) {
        const mp::Block b = mp::block_of(n, ranks, r);
        const int want = n / ranks + (r < n % ranks ? 1 : 0);  // n / K each, one more for the first n % K
        wrong += b.start != next || b.count != want;
        next += b.count;
      }
      wrong += next != n;
      // The first rank's block is the largest: ceil(n / ranks).
      wrong += mp::block_of(n, ranks, 0).count != (n + ranks - 1) / ranks;
    }
  CHECK(wrong == 0);
}

TEST_CASE("hidden sampler: 997 examples in batches of 50 on 6 ranks, and 61 in batches of 64 on 5") {
  struct Case {
    int examples, batch, ranks;
  };
  for (const Case c : {Case{997, 50, 6}, Case{61, 64, 5}, Case{130, 9, 4}}) {
    // Named copies, not a structured binding: CAPTURE's lambda may not capture one (clang 14).
    const int examples = c.examples, batch = c.batch, ranks = c.ranks;
    CAPTURE(examples);
    CAPTURE(batch);
    CAPTURE(ranks);
    mgpu::ShuffledBatches one(examples, batch, 99);
    std::vector<mp::DistributedSampler> samplers;
    for (int r = 0; r < ranks; ++r) samplers.emplace_back(examples, batch, ranks, r, 99);
    for (int epoch : {0, 3}) {
      one.start_epoch(epoch);
      for (auto& s : samplers) s.start_epoch(epoch);
      std::vector<int> seen;
      for (int step = 0; step < one.count(); ++step) {
        std::vector<int> joined;
        for (const auto& s : samplers) {
          const mp::Block b = s.block(step);
          joined.insert(joined.end(), s.order().begin() + b.start, s.order().begin() + b.start + b.count);
        }
        CHECK(joined == std::vector<int>(one.indices(step), one.indices(step) + one.size(step)));
        seen.insert(seen.end(), joined.begin(), joined.end());
      }
      std::sort(seen.begin(), seen.end());
      CHECK(seen.size() == std::size_t(examples));
      CHECK(std::adjacent_find(seen.begin(), seen.end()) == seen.end());
    }
  }
}

TEST_CASE("hidden bootstrap: count_ranks_with on keys of 0 and 255 characters, and on a shared prefix") {
  const mp::World w = world();
  CHECK(mp::count_ranks_with(w, "") == w.size);
  const std::string longest(255, 'g');
  CHECK(mp::count_ranks_with(w, longest) == w.size);
  // Keys that differ only in their last character, or only in length, are different keys.
  CHECK(mp::count_ranks_with(w, std::string(254, 'g') + char('a' + w.rank % 26)) == 1);
  CHECK(mp::count_ranks_with(w, std::string(10 + w.rank, 'h')) == 1);
}

TEST_CASE("hidden bootstrap: broadcast of a million floats and of one byte") {
  const mp::World w = world();
  std::vector<float> many(1000000, float(w.rank + 1));
  if (w.rank == 0)
    for (std::size_t j = 0; j < many.size(); ++j) many[j] = float(j % 4096);
  mp::broadcast_from_rank0(w, many.data(), mgpu::Elements{many.size()});
  std::size_t wrong = 0;
  for (std::size_t j = 0; j < many.size(); ++j) wrong += many[j] != float(j % 4096);
  CHECK(wrong == 0);
  unsigned char one = static_cast<unsigned char>(w.rank == 0 ? 0xa5 : w.rank);
  mp::broadcast_from_rank0(w, &one, 1);
  CHECK(one == 0xa5);
}

TEST_CASE("hidden bootstrap: choose_collective when only the last rank shares its GPU, with 3 ranks on it") {
  const mp::World w = world();
  std::string note;
  const int sharing = w.rank == w.size - 1 ? 3 : 1;
  if (w.size > 1) {
    CHECK(mp::choose_collective(w, mp::CollectiveKind::Nccl, false, sharing, &note) == mp::CollectiveKind::Mpi);
    CHECK(note.find("3 ranks share a GPU") != std::string::npos);
  }
  // MPI asked for is MPI, whatever the sharing; and no note then.
  std::string none;
  CHECK(mp::choose_collective(w, mp::CollectiveKind::Mpi, false, sharing, &none) == mp::CollectiveKind::Mpi);
  CHECK(none.empty());
  // No rank shares: NCCL stays, chosen or explicit.
  CHECK(mp::choose_collective(w, mp::CollectiveKind::Nccl, false, 1, nullptr) == mp::CollectiveKind::Nccl);
}

}  // namespace

int main(int argc, char** argv) {
  mp::MpiSession mpi(argc, argv);
  doctest::Context context(argc, argv);
  context.setOption("no-colors", true);
  if (world().rank != 0) context.setOption("minimal", true);  // one summary, from rank 0; failures from all
  return context.run();
}
