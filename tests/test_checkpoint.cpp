// Chapter 05's checkpoints (chapters/05_multi_process/checkpoint.h): what is written is read
// back exactly, the file appears in one step, and a damaged file is refused with a message
// that names it and says what is wrong.
#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "chapters/05_multi_process/checkpoint.h"
#include "common/check.h"
#include "common/random.h"

namespace {

namespace fs = std::filesystem;

constexpr std::int64_t kParams = 1000;  // any size: the reader is told what to expect

// A fresh directory, removed at scope exit.
struct TempDir {
  fs::path path;
  TempDir() {
    static int made = 0;
    path = fs::temp_directory_path() / ("mgpu-test-ckpt-" + std::to_string(getpid()) + "-" + std::to_string(made++));
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path, ignored);
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

mp::Checkpoint sample(int epochs) {
  mgpu::Rng rng(5);
  mp::Checkpoint c;
  c.epochs_done = epochs;
  c.seed = 0x0123456789abcdefull;  // all eight bytes differ: a byte-order slip would show
  c.batch_size = 256;
  c.lr = 0.2f;
  c.train_examples = 60000;
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
  CHECK(bytes.size() == 44 + 36 * 2 + 4 * kParams + 4);  // header, 2 epochs, parameters, CRC
  CHECK(bytes.substr(0, 8) == "MGPUCKPT");
  CHECK(bytes.substr(8, 4) == std::string("\x01\x00\x00\x00", 4));   // version 1
  CHECK(bytes.substr(12, 4) == std::string("\x02\x00\x00\x00", 4));  // 2 epochs done
  CHECK(bytes.substr(16, 8) == std::string("\xef\xcd\xab\x89\x67\x45\x23\x01", 8));  // the seed
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
  const std::string tmp = path + ".tmp";
  CHECK_THROWS_WITH_AS(mp::write_checkpoint(path, sample(1)), doctest::Contains(tmp.c_str()), mgpu::Error);
}

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
  for (std::size_t keep : {std::size_t(5), std::size_t(8), std::size_t(30), std::size_t(42), std::size_t(44 + 40),
                           std::size_t(44 + 72 + 400), bytes.size() - 1}) {
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
  for (std::size_t at : {std::size_t(50), std::size_t(44 + 72), std::size_t(44 + 72 + 2000), good.size() - 1}) {
    CAPTURE(at);
    std::string bad = good;
    bad[at] ^= 0x10;
    write_bytes(path, bad);
    check_refused(path, "checksum mismatch");
  }
  write_bytes(path, good + "x");
  check_refused(path, "bytes, its header accounts for " + std::to_string(good.size()));

  std::string other_version = good;
  other_version[8] = 2;
  write_bytes(path, other_version);
  check_refused(path, "format version 2, this program reads version 1");

  write_bytes(path, good);
  CHECK_THROWS_WITH_AS(mp::read_checkpoint(path, 129068),
                       doctest::Contains("holds 1000 parameters, this model has 129068"), mgpu::Error);
}

}  // namespace
