// Chapter 05's hidden cases that need no MPI: the checkpoint's atomic write (ex05.atomic_write)
// on sizes and failures the visible tests (tests/test_checkpoint.cpp) never use, and block_of
// (ex05.sampler) near the largest int, where a block computed as rank * n / ranks overflows.
#include <doctest/doctest.h>
#include <unistd.h>

#include <climits>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "../../chapters/05_multi_process/checkpoint.h"
#include "../../chapters/05_multi_process/sampler.h"
#include "common/check.h"  // mgpu::Error
#include "common/random.h"
#include "resource_limits.h"

namespace {

namespace fs = std::filesystem;

// A fresh folder whose name has spaces in it, removed at scope exit.
struct Folder {
  fs::path path = fs::temp_directory_path() / ("mgpu hidden ckpt " + std::to_string(getpid()));
  Folder() { fs::create_directories(path); }
  ~Folder() {
    std::error_code ignored;
    fs::remove_all(path, ignored);
  }
};

mp::Checkpoint checkpoint(int epochs, std::int64_t params, std::uint64_t seed) {
  mgpu::Rng rng(seed);
  mp::Checkpoint c;
  c.epochs_done = epochs;
  c.seed = seed;
  c.batch_size = 96;
  c.lr = 0.05f;
  c.train_examples = 1000;
  for (int e = 1; e <= epochs; ++e) c.history.push_back({e, 1.0 / e, 0.2, 0.3, 1.5});
  for (std::int64_t i = 0; i < params; ++i) c.params.push_back(static_cast<float>(rng.normal()));
  return c;
}

// No file but `keep` in the folder: no FILE.tmp, nothing else left behind.
void check_only(const fs::path& folder, const std::string& keep) {
  std::vector<std::string> names;
  for (const fs::directory_entry& e : fs::directory_iterator(folder)) names.push_back(e.path().filename().string());
  CHECK(names == std::vector<std::string>{keep});
}

}  // namespace

TEST_CASE("hidden atomic_write: 8 MB and empty checkpoints written over each other, in a folder with spaces, read back exactly") {
  Folder folder;
  const std::string path = (folder.path / "a run.ckpt").string();
  const std::int64_t sizes[] = {2000000, 0, 1, 2000000, 3};  // 8 MB of parameters, none, one, ...
  for (int i = 0; i < 5; ++i) {
    CAPTURE(i);
    const mp::Checkpoint c = checkpoint(i + 1, sizes[i], 500 + i);
    mp::write_checkpoint(path, c);
    const mp::Checkpoint back = mp::read_checkpoint(path, sizes[i]);
    CHECK(back.epochs_done == c.epochs_done);
    CHECK(back.seed == c.seed);
    CHECK(back.history.size() == c.history.size());
    CHECK(back.params == c.params);  // bit for bit
    CHECK(fs::file_size(path) == mp::encode_checkpoint(c).size());
    check_only(folder.path, "a run.ckpt");
  }
}

TEST_CASE("hidden atomic_write: failures at the first byte and half way leave the last checkpoint and no FILE.tmp, every time") {
  Folder folder;
  const std::string path = (folder.path / "run.ckpt").string();
  mp::write_checkpoint(path, checkpoint(1, 10, 7));
  for (rlim_t limit : {rlim_t(0), rlim_t(4096), rlim_t(0)}) {
    CAPTURE(limit);
    {
      const testing::FileSizeLimit small_files(limit);  // the write fails (EFBIG) at byte `limit`
      CHECK_THROWS_AS(mp::write_checkpoint(path, checkpoint(9, 100000, 8)), mgpu::Error);
    }
    check_only(folder.path, "run.ckpt");
    CHECK(mp::read_checkpoint(path, 10).epochs_done == 1);
  }
  mp::write_checkpoint(path, checkpoint(2, 10, 9));  // and a write that can succeed does
  CHECK(mp::read_checkpoint(path, 10).epochs_done == 2);
  check_only(folder.path, "run.ckpt");
}

TEST_CASE("hidden sampler: block_of near the largest int on 1 to 64 ranks, without overflow") {
  int wrong = 0;
  for (int n : {INT_MAX, INT_MAX - 1, INT_MAX / 2 + 3, 1000000007})
    for (int ranks = 1; ranks <= 64; ++ranks) {
      std::int64_t next = 0;
      for (int r = 0; r < ranks; ++r) {
        const mp::Block b = mp::block_of(n, ranks, r);
        const std::int64_t want = n / ranks + (r < n % ranks ? 1 : 0);
        wrong += b.start != next || b.count != want;
        next += b.count;
      }
      wrong += next != n;
    }
  CHECK(wrong == 0);
}
