// Chapter 05's checkpoints (chapters/05_multi_process/checkpoint.h): what is written is read
// back exactly, the file appears in one step and durably, a failed write leaves nothing behind,
// only regular files are read or replaced, and a damaged file is refused with a message that
// names it and says what is wrong.
#include <doctest/doctest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "chapters/05_multi_process/checkpoint.h"
#include "common/check.h"
#include "common/random.h"
#include "resource_limits.h"  // FileSizeLimit, AddressSpaceHeadroom, kSanitized
#include "temp_dir.h"

namespace {

namespace fs = std::filesystem;

constexpr std::int64_t kParams = 1000;  // any size: the reader is told what to expect

using testing::TempDir;

mp::Checkpoint sample(int epochs) {
  mgpu::Rng rng(5);
  mp::Checkpoint c;
  c.epochs_done = epochs;
  c.seed = 0x0123456789abcdefull;  // all eight bytes differ: a byte-order slip would show
  c.batch_size = 256;
  c.lr = 0.2f;
  c.train_examples = 60000;
  c.warmup_epochs = 3;
  for (int e = 1; e <= epochs; ++e) c.history.push_back({e, 2.0 / e, 0.1 * e, 0.09 * e, 5.5 + e});
  for (int i = 0; i < kParams; ++i) c.params.push_back(static_cast<float>(rng.normal()));
  return c;
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Reading `path` must fail with a message naming the file and containing `says`.
void check_refused(const std::string& path, const std::string& says) {
  try {
    mp::read_checkpoint(path, kParams);
    FAIL("read_checkpoint accepted ", path, "; expected an error containing '", says, "'");
  } catch (const mgpu::Error& e) {
    const std::string message = e.what();
    INFO("message: ", message);
    CHECK(message.find(path) != std::string::npos);
    CHECK(message.find(says) != std::string::npos);
  }
}

TEST_CASE("what is written is read back exactly") {
  TempDir dir;
  for (int epochs : {0, 1, 3}) {
    CAPTURE(epochs);
    const mp::Checkpoint c = sample(epochs);
    mp::write_checkpoint(dir.file("run.ckpt"), c);
    const mp::Checkpoint back = mp::read_checkpoint(dir.file("run.ckpt"), kParams);
    CHECK(back.epochs_done == c.epochs_done);
    CHECK(back.seed == c.seed);
    CHECK(back.batch_size == c.batch_size);
    CHECK(back.lr == c.lr);
    CHECK(back.train_examples == c.train_examples);
    CHECK(back.warmup_epochs == c.warmup_epochs);
    CHECK(back.params == c.params);  // bit for bit
    REQUIRE(back.history.size() == c.history.size());
    for (std::size_t e = 0; e < c.history.size(); ++e) {
      CHECK(back.history[e].epoch == c.history[e].epoch);
      CHECK(back.history[e].train_loss == c.history[e].train_loss);
      CHECK(back.history[e].train_acc == c.history[e].train_acc);
      CHECK(back.history[e].test_acc == c.history[e].test_acc);
      CHECK(back.history[e].seconds == c.history[e].seconds);
    }
  }
}

TEST_CASE("the layout is the documented one, little-endian") {
  const std::string bytes = mp::encode_checkpoint(sample(2));
  CHECK(bytes.size() == 48 + 36 * 2 + 4 * kParams + 4);  // header, 2 epochs, parameters, CRC
  CHECK(bytes.substr(0, 8) == "MGPUCKPT");
  CHECK(bytes.substr(8, 4) == std::string("\x02\x00\x00\x00", 4));   // version 2
  CHECK(bytes.substr(12, 4) == std::string("\x02\x00\x00\x00", 4));  // 2 epochs done
  CHECK(bytes.substr(16, 8) == std::string("\xef\xcd\xab\x89\x67\x45\x23\x01", 8));  // the seed
  // The rest of the header, an epoch record, a parameter and the CRC, decoded here by hand from
  // little-endian bytes (independently of the reader, which only has to mirror the writer).
  const mp::Checkpoint c = sample(2);
  const auto u = [&](std::size_t at, int width) {  // unsigned little-endian integer of `width` bytes
    std::uint64_t v = 0;
    for (int i = width - 1; i >= 0; --i) v = v << 8 | static_cast<unsigned char>(bytes[at + i]);
    return v;
  };
  const auto f32 = [&](std::size_t at) {
    const auto bits = static_cast<std::uint32_t>(u(at, 4));
    float v;
    std::memcpy(&v, &bits, 4);
    return v;
  };
  const auto f64 = [&](std::size_t at) {
    const std::uint64_t bits = u(at, 8);
    double v;
    std::memcpy(&v, &bits, 8);
    return v;
  };
  CHECK(u(24, 4) == 256u);                      // batch size
  CHECK(f32(28) == c.lr);                       // learning rate
  CHECK(u(32, 4) == 60000u);                    // training examples
  CHECK(u(36, 4) == 3u);                        // warm-up epochs
  CHECK(u(40, 8) == std::uint64_t(kParams));    // parameter count
  const std::size_t epoch2 = 48 + 36;           // the second epoch's record
  CHECK(u(epoch2, 4) == 2u);
  CHECK(f64(epoch2 + 4) == c.history[1].train_loss);
  CHECK(f64(epoch2 + 12) == c.history[1].train_acc);
  CHECK(f64(epoch2 + 20) == c.history[1].test_acc);
  CHECK(f64(epoch2 + 28) == c.history[1].seconds);
  const std::size_t params = 48 + 36 * 2;
  CHECK(f32(params) == c.params[0]);
  CHECK(f32(params + 4 * (kParams - 1)) == c.params[kParams - 1]);
  const std::size_t crc_at = bytes.size() - 4;
  CHECK(u(crc_at, 4) == crc32(0L, reinterpret_cast<const Bytef*>(bytes.data()), static_cast<uInt>(crc_at)));
}

TEST_CASE("the file appears in one step: written to FILE.tmp, renamed, nothing left behind") {
  TempDir dir;
  const std::string path = dir.file("run.ckpt");
  write_bytes(path + ".tmp", "left over from a crash");  // an earlier run died while writing
  mp::write_checkpoint(path, sample(1));
  CHECK_FALSE(fs::exists(path + ".tmp"));
  mp::write_checkpoint(path, sample(2));  // replaces the previous checkpoint
  CHECK(mp::read_checkpoint(path, kParams).epochs_done == 2);
  CHECK_FALSE(fs::exists(path + ".tmp"));
}

TEST_CASE("a checkpoint that cannot be written names the file") {
  TempDir dir;
  const std::string path = dir.file("no-such-dir/run.ckpt");
  const std::string says = path + ": the folder " + dir.file("no-such-dir") + " does not exist";
  CHECK_THROWS_WITH_AS(mp::write_checkpoint(path, sample(1)), doctest::Contains(says.c_str()), mgpu::Error);
}

TEST_CASE("a write that fails leaves no FILE.tmp behind, and the previous checkpoint as it was") {
  TempDir dir;
  const std::string path = dir.file("run.ckpt");
  mp::write_checkpoint(path, sample(1));
  {
    // Files of this process may grow to 100 bytes: the write of the next checkpoint fails half
    // way (EFBIG).
    const testing::FileSizeLimit small_files(100);
    CHECK_THROWS_WITH_AS(mp::write_checkpoint(path, sample(2)),
                         doctest::Contains((path + ".tmp: cannot write the checkpoint").c_str()), mgpu::Error);
  }
  CHECK_FALSE(fs::exists(path + ".tmp"));
  CHECK(mp::read_checkpoint(path, kParams).epochs_done == 1);
}

TEST_CASE("only a regular file is replaced: a folder, a FIFO or a symbolic link is refused and left as it was") {
  TempDir dir;
  const std::string folder = dir.file("a-folder"), fifo = dir.file("a-fifo"), link = dir.file("a-link");
  fs::create_directory(folder);
  REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
  write_bytes(dir.file("elsewhere.ckpt"), "not ours to replace");
  fs::create_symlink(dir.file("elsewhere.ckpt"), link);
  for (const auto& target : {std::pair{folder, "a folder"}, std::pair{fifo, "a FIFO"},
                             std::pair{link, "a symbolic link"}}) {
    const std::string& path = target.first;
    CAPTURE(path);
    const std::string says = path + ": not a regular file but " + target.second;
    CHECK_THROWS_WITH_AS(mp::write_checkpoint(path, sample(1)), doctest::Contains(says.c_str()), mgpu::Error);
    CHECK_THROWS_WITH_AS(mp::check_checkpoint_target(path), doctest::Contains(says.c_str()), mgpu::Error);
    CHECK_FALSE(fs::exists(path + ".tmp"));
  }
  CHECK(fs::is_directory(folder));
  CHECK(fs::is_fifo(fifo));
  CHECK(fs::is_symlink(link));
  std::ifstream elsewhere(dir.file("elsewhere.ckpt"));
  CHECK(std::string(std::istreambuf_iterator<char>(elsewhere), {}) == "not ours to replace");
}

TEST_CASE("check_checkpoint_target: a checkpoint that could not be written is refused before training") {
  TempDir dir;
  write_bytes(dir.file("a-file"), "x");
  CHECK_THROWS_WITH_AS(mp::check_checkpoint_target(dir.file("absent/run.ckpt")),
                       doctest::Contains((dir.file("absent/run.ckpt") + ": the folder " + dir.file("absent") +
                                          " does not exist").c_str()),
                       mgpu::Error);
  CHECK_THROWS_WITH_AS(mp::check_checkpoint_target(dir.file("a-file/run.ckpt")),
                       doctest::Contains((dir.file("a-file") + " is not a folder").c_str()), mgpu::Error);
  // A new name, or a checkpoint to replace, in a folder that takes files: accepted, and the
  // trial file it created to find out is gone (the checkpoint itself is untouched).
  CHECK_NOTHROW(mp::check_checkpoint_target(dir.file("new.ckpt")));
  mp::write_checkpoint(dir.file("old.ckpt"), sample(1));
  CHECK_NOTHROW(mp::check_checkpoint_target(dir.file("old.ckpt")));
  CHECK(mp::read_checkpoint(dir.file("old.ckpt"), kParams).epochs_done == 1);
  CHECK_FALSE(fs::exists(dir.file("new.ckpt")));
  CHECK_FALSE(fs::exists(dir.file("new.ckpt.tmp")));
  CHECK_FALSE(fs::exists(dir.file("old.ckpt.tmp")));
}

#if MGPU_TEST_WRAPS_FSYNC
// This program is linked with -Wl,--wrap=fsync (tests/CMakeLists.txt): every call of fsync() in
// it, the checkpoint code's included, comes here first. We note what is flushed, and whether by
// then the checkpoint has its final name, and pass the call on.
struct Flushed {
  std::string what;        // the file or folder flushed
  bool renamed = false;    // the watched checkpoint was in place, its .tmp gone
};
std::vector<Flushed> g_flushed;
std::string g_watched;  // the checkpoint being written

extern "C" int __real_fsync(int fd);
extern "C" int __wrap_fsync(int fd) {
  std::error_code ec;
  const fs::path what = fs::read_symlink("/proc/self/fd/" + std::to_string(fd), ec);
  g_flushed.push_back({what.string(), fs::exists(g_watched) && !fs::exists(g_watched + ".tmp")});
  return __real_fsync(fd);
}

TEST_CASE("durable: the file is flushed before the rename, its folder after it") {
  TempDir dir;
  const fs::path folder = fs::canonical(dir.path);  // what /proc/self/fd names
  g_watched = (folder / "run.ckpt").string();
  g_flushed.clear();
  mp::write_checkpoint(g_watched, sample(1));
  REQUIRE(g_flushed.size() == 2);
  CHECK(g_flushed[0].what == g_watched + ".tmp");  // the bytes, under the temporary name
  CHECK_FALSE(g_flushed[0].renamed);
  CHECK(g_flushed[1].what == folder.string());  // the rename, which lives in the folder
  CHECK(g_flushed[1].renamed);
}
#endif

TEST_CASE("missing, foreign and empty files are refused") {
  TempDir dir;
  check_refused(dir.file("absent.ckpt"), "cannot open");
  write_bytes(dir.file("foreign.ckpt"), "epoch,train_loss\n1,2.3\n");
  check_refused(dir.file("foreign.ckpt"), "not a checkpoint");
  write_bytes(dir.file("empty.ckpt"), "");
  check_refused(dir.file("empty.ckpt"), "truncated");
}

TEST_CASE("a truncated checkpoint is refused, wherever it was cut") {
  TempDir dir;
  const std::string bytes = mp::encode_checkpoint(sample(2));
  // Inside the magic, the header, the epoch records, the parameters, and the checksum.
  for (std::size_t keep : {std::size_t(5), std::size_t(8), std::size_t(30), std::size_t(42), std::size_t(48 + 40),
                           std::size_t(48 + 72 + 400), bytes.size() - 1}) {
    CAPTURE(keep);
    write_bytes(dir.file("cut.ckpt"), bytes.substr(0, keep));
    check_refused(dir.file("cut.ckpt"), "truncated");
  }
}

TEST_CASE("a corrupt checkpoint is refused: flipped bits, trailing bytes, another version or model") {
  TempDir dir;
  const std::string good = mp::encode_checkpoint(sample(2));
  const std::string path = dir.file("bad.ckpt");
  // One flipped bit anywhere after the header: in an epoch record, a parameter, the checksum.
  for (std::size_t at : {std::size_t(50), std::size_t(48 + 72), std::size_t(48 + 72 + 2000), good.size() - 1}) {
    CAPTURE(at);
    std::string bad = good;
    bad[at] ^= 0x10;
    write_bytes(path, bad);
    check_refused(path, "checksum mismatch");
  }
  write_bytes(path, good + "x");
  check_refused(path, "corrupt checkpoint: " + std::to_string(good.size() + 1) +
                          " bytes, where its header (epochs done: 2, parameters: 1000) says " +
                          std::to_string(good.size()));

  // A flipped bit in the epoch count (bytes 12-15) makes the header promise another size: not a
  // cut file, and the message says so, since the count the size implies makes the CRC-32 match.
  for (const std::pair<int, int>& flip : {std::pair{0x01, 3}, std::pair{0x02, 0}}) {  // the bit, and what it says
    const int says = flip.second;
    CAPTURE(says);
    std::string bad = good;
    bad[12] ^= static_cast<char>(flip.first);
    write_bytes(path, bad);
    check_refused(path, "corrupt checkpoint: its header says " + std::to_string(says) +
                            " epochs done, but the file holds 2 epochs' records, which its CRC-32 confirms: the "
                            "header is damaged");
  }

  std::string other_version = good;
  other_version[8] = 3;
  write_bytes(path, other_version);
  check_refused(path, "format version 3, this program reads version 2");

  write_bytes(path, good);
  CHECK_THROWS_WITH_AS(mp::read_checkpoint(path, 129068),
                       doctest::Contains("holds 1000 parameters, this model has 129068"), mgpu::Error);
}

// At most `headroom` bytes more address space than now, for the scope of one check.
std::optional<testing::AddressSpaceHeadroom> memory_headroom(rlim_t headroom) {
  if (testing::kSanitized) return std::nullopt;  // (resource_limits.h says why)
  return std::optional<testing::AddressSpaceHeadroom>(std::in_place, headroom);
}

TEST_CASE("only a regular file is read: a folder, /dev/null, /dev/zero and a FIFO are refused, and none hangs") {
  TempDir dir;
  REQUIRE(mkfifo(dir.file("a-fifo").c_str(), 0600) == 0);  // opening it to read would wait for a writer
  check_refused(dir.path.string(), "not a regular file but a folder");
  check_refused("/dev/null", "not a regular file but a character device");
  {
    // /dev/zero never ends: should this rule ever break, the read would grow until memory runs
    // out. The address space is capped meanwhile, so that it fails here (bad_alloc) instead.
    const auto bounded_memory = memory_headroom(256u << 20);
    check_refused("/dev/zero", "not a regular file but a character device");
  }
  check_refused(dir.file("a-fifo"), "not a regular file but a FIFO");
}

TEST_CASE("one run at a time per checkpoint: a second lock is refused, naming the file, until the first goes") {
  TempDir dir;
  const std::string path = dir.file("run.ckpt");
  {
    const mp::CheckpointLock first(path);
    // flock belongs to an open file: a second open, even in this process, is another run's.
    CHECK_THROWS_WITH_AS(mp::CheckpointLock{path},
                         doctest::Contains((path + ": another run is using this checkpoint now (it holds " + path +
                                            ".lock): give each run its own --checkpoint")
                                               .c_str()),
                         mgpu::Error);
  }
  CHECK_NOTHROW(mp::CheckpointLock{path});  // released with the first
}

TEST_CASE("no more is read than the header says the file has") {
  TempDir dir;
  const std::string path = dir.file("long.ckpt");
  const std::string good = mp::encode_checkpoint(sample(1));
  write_bytes(path, good + std::string(32u << 20, 'x'));  // a checkpoint, then 32 MiB more
  // Refused on the file's size, having read the header only: with 16 MiB of memory to spare, a
  // reader that loads the whole file first fails (bad_alloc) instead of passing.
  const auto bounded_memory = memory_headroom(16u << 20);
  check_refused(path, "where its header (epochs done: 1, parameters: 1000) says " + std::to_string(good.size()));
}

}  // namespace
