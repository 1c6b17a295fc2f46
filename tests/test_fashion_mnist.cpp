// The Fashion-MNIST loader (common/fashion_mnist.h): the real files, then small IDX files this
// suite writes itself, valid and broken in every way the loader promises to catch.
//
// The IDX format: a big-endian 32-bit magic number (0x803 for images, 0x801 for labels), one
// big-endian 32-bit size per dimension (images: count, rows, cols; labels: count), then one
// byte per pixel or label. Fashion-MNIST ships each file gzip'd.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <iterator>
#include <new>
#include <string>
#include <vector>

#include "common/check.h"
#include "common/fashion_mnist.h"
#include "temp_dir.h"

// ------------------------------------------------------------- watching the loader's memory

// While an AllocationCeiling lives, any single request to operator new above its limit fails
// with std::bad_alloc instead of being served. The loader must not size a buffer from what a
// header claims: with a ceiling far below the claim, a loader that tries gets std::bad_alloc,
// not the mgpu::Error the tests expect, and no machine's memory is spent finding that out.
// (Replacing the global operator new is standard C++; it applies to this test program only.)
namespace {
std::atomic<std::size_t> g_allocation_ceiling{SIZE_MAX};

struct AllocationCeiling {
  explicit AllocationCeiling(std::size_t bytes) { g_allocation_ceiling = bytes; }
  ~AllocationCeiling() { g_allocation_ceiling = SIZE_MAX; }
};
}  // namespace

void* operator new(std::size_t bytes) {
  if (bytes > g_allocation_ceiling) throw std::bad_alloc();
  if (void* p = std::malloc(bytes ? bytes : 1)) return p;
  throw std::bad_alloc();
}
// GCC cannot see that this operator new is malloc underneath, and would warn about free().
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
#pragma GCC diagnostic pop

namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<unsigned char>;

using testing::TempDir;

void put_u32(Bytes& out, std::uint32_t v) {  // big-endian, as IDX stores its header
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<unsigned char>(v >> shift));
}

Bytes idx_images(std::uint32_t count, std::uint32_t rows, std::uint32_t cols, const Bytes& pixels,
                 std::uint32_t magic = 0x803) {
  Bytes out;
  for (std::uint32_t v : {magic, count, rows, cols}) put_u32(out, v);
  out.insert(out.end(), pixels.begin(), pixels.end());
  return out;
}

Bytes idx_labels(const Bytes& labels, std::uint32_t magic = 0x801) {
  Bytes out;
  put_u32(out, magic);
  put_u32(out, static_cast<std::uint32_t>(labels.size()));
  out.insert(out.end(), labels.begin(), labels.end());
  return out;
}

void write_gz(const std::string& path, const Bytes& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  REQUIRE(f != nullptr);
  REQUIRE(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())) == int(bytes.size()));
  REQUIRE(gzclose(f) == Z_OK);
}

void write_raw(const std::string& path, const Bytes& bytes) {
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

Bytes read_raw(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// n pseudo-random bytes (a linear congruential generator: enough to defeat compression, so a
// gzip stream of them is as long as they are and cutting its end cuts into the data).
Bytes noise(std::size_t n, std::uint32_t seed = 1, unsigned below = 256) {
  Bytes out(n);
  for (auto& b : out) {
    seed = seed * 1664525u + 1013904223u;
    b = static_cast<unsigned char>((seed >> 24) % below);
  }
  return out;
}

// The message of the mgpu::Error that f() throws ("" when it throws none).
template <class F>
std::string error_of(F f) {
  try {
    f();
  } catch (const mgpu::Error& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// load_idx(images, labels) must throw mgpu::Error naming `file` and saying `reason`.
void check_refused(const std::string& images, const std::string& labels, const std::string& file,
                   const std::string& reason) {
  CHECK_THROWS_WITH_AS(mgpu::load_idx(images, labels), doctest::Contains(file.c_str()), mgpu::Error);
  const std::string message = error_of([&] { mgpu::load_idx(images, labels); });
  INFO("message: ", message);
  CHECK(contains(message, reason));
}

// A valid pair: 3 images of 2x4 pixels, labels 0, 9, 4.
const Bytes kPixels = {0, 255, 1, 128, 2, 3, 254, 100, 10, 20, 30, 40, 50, 60, 70, 80, 90, 0, 0, 0, 7, 77, 177, 255};
const Bytes kLabels = {0, 9, 4};

// ---------------------------------------------------------------------------- the real files

TEST_CASE("the real Fashion-MNIST: 60,000 + 10,000 images of 28x28 in [0, 1], ten balanced classes") {
  const mgpu::FashionMnist data = mgpu::load_fashion_mnist("");
  CHECK(data.dir == mgpu::find_fashion_mnist(""));
  CHECK(data.train.count == 60000);
  CHECK(data.test.count == 10000);
  for (const mgpu::LabeledImages* s : {&data.train, &data.test}) {
    CHECK(s->rows == 28);
    CHECK(s->cols == 28);
    REQUIRE(s->pixels.size() == std::size_t(s->count) * 28 * 28);
    REQUIRE(s->labels.size() == std::size_t(s->count));
    // Each pixel is byte / 255: in [0, 1], and 255 times it is a whole number.
    std::size_t outside = 0, not_a_byte = 0;
    float lo = 1, hi = 0;
    for (float p : s->pixels) {
      if (p < 0.0f || p > 1.0f) ++outside;
      if (std::abs(p * 255.0f - std::round(p * 255.0f)) > 1e-3f) ++not_a_byte;
      lo = std::min(lo, p), hi = std::max(hi, p);
    }
    CHECK(outside == 0);
    CHECK(not_a_byte == 0);
    CHECK(lo == 0.0f);  // black background
    CHECK(hi == 1.0f);  // and some pure white somewhere
    // Fashion-MNIST is balanced: a tenth of each split per class.
    std::array<int, mgpu::kClasses> per_class{};
    bool in_range = true;
    for (std::int32_t y : s->labels) {
      if (y < 0 || y >= mgpu::kClasses) in_range = false;
      else ++per_class[y];
    }
    CHECK(in_range);
    for (int c = 0; c < mgpu::kClasses; ++c) {
      CAPTURE(c);
      CHECK(per_class[c] == s->count / 10);
    }
  }
}

TEST_CASE("limit_train keeps the first N training images and leaves the test set whole") {
  const mgpu::FashionMnist all = mgpu::load_fashion_mnist("");
  const mgpu::FashionMnist some = mgpu::load_fashion_mnist("", 1000);
  CHECK(some.train.count == 1000);
  REQUIRE(some.train.pixels.size() == 1000u * 28 * 28);
  REQUIRE(some.train.labels.size() == 1000u);
  CHECK(std::equal(some.train.pixels.begin(), some.train.pixels.end(), all.train.pixels.begin()));
  CHECK(std::equal(some.train.labels.begin(), some.train.labels.end(), all.train.labels.begin()));
  CHECK(some.test.count == 10000);
  CHECK(some.test.labels == all.test.labels);
  // 0 and anything at or above the size mean "all of them".
  CHECK(mgpu::load_fashion_mnist("", 0).train.count == 60000);
  CHECK(mgpu::load_fashion_mnist("", 60000).train.count == 60000);
}

// ------------------------------------------------------------------ small files written here

TEST_CASE("a small valid IDX pair loads with pixels = byte / 255 and its labels") {
  TempDir dir;
  const std::string images = dir.file("images.gz"), labels = dir.file("labels.gz");
  write_gz(images, idx_images(3, 2, 4, kPixels));
  write_gz(labels, idx_labels(kLabels));
  const mgpu::LabeledImages set = mgpu::load_idx(images, labels);
  CHECK(set.count == 3);
  CHECK(set.rows == 2);
  CHECK(set.cols == 4);
  CHECK(set.pixels_per_image() == 8);
  REQUIRE(set.pixels.size() == kPixels.size());
  for (std::size_t i = 0; i < kPixels.size(); ++i) {
    CAPTURE(i);
    CHECK(set.pixels[i] == kPixels[i] / 255.0f);
  }
  CHECK(set.labels == std::vector<std::int32_t>{0, 9, 4});
}

TEST_CASE("a wrong magic number is refused, naming the file") {
  TempDir dir;
  const std::string images = dir.file("images.gz"), labels = dir.file("labels.gz");
  SUBCASE("images: a label file's magic number") {
    write_gz(images, idx_images(3, 2, 4, kPixels, /*magic=*/0x801));
    write_gz(labels, idx_labels(kLabels));
    check_refused(images, labels, images, "magic");
  }
  SUBCASE("labels: an image file's magic number") {
    write_gz(images, idx_images(3, 2, 4, kPixels));
    write_gz(labels, idx_labels(kLabels, /*magic=*/0x803));
    check_refused(images, labels, labels, "magic");
  }
}

TEST_CASE("a file that is not gzip at all, with a garbage header, is refused") {
  TempDir dir;
  const std::string images = dir.file("images.gz"), labels = dir.file("labels.gz");
  write_raw(images, {'n', 'o', 't', ' ', 'g', 'z', 'i', 'p', '!', '\n', 0xde, 0xad, 0xbe, 0xef, 1, 2, 3});
  write_gz(labels, idx_labels(kLabels));
  check_refused(images, labels, images, "not a gzip file");
}

TEST_CASE("an empty file is refused as such") {
  TempDir dir;
  const std::string images = dir.file("images.gz"), labels = dir.file("labels.gz");
  write_raw(images, {});
  write_gz(labels, idx_labels(kLabels));
  check_refused(images, labels, images, "is empty");
}

// An uncompressed IDX file has no CRC: nothing would tell a flipped bit in its pixels. The
// loader reads gzip only (zlib's gzread would pass such a file through as it is).
TEST_CASE("a valid IDX file that is not gzip'd is refused: it carries no checksum") {
  TempDir dir;
  const std::string images = dir.file("images.gz"), labels = dir.file("labels.gz");
  write_raw(images, idx_images(3, 2, 4, kPixels));
  write_gz(labels, idx_labels(kLabels));
  check_refused(images, labels, images, "not a gzip file");
}

TEST_CASE("an implausible image header (zero rows) is refused") {
  TempDir dir;
  const std::string images = dir.file("images.gz"), labels = dir.file("labels.gz");
  write_gz(images, idx_images(3, 0, 4, {}));
  write_gz(labels, idx_labels(kLabels));
  check_refused(images, labels, images, "implausible");
}

TEST_CASE("a truncated gzip stream is refused") {
  TempDir dir;
  const std::string images = dir.file("images.gz"), labels = dir.file("labels.gz");
  // 50 images of 28x28 random bytes (39,200 bytes that do not compress); a valid .gz of them
  // is cut short by a third, as an interrupted download would leave it.
  write_gz(images, idx_images(50, 28, 28, noise(50 * 28 * 28)));
  write_gz(labels, idx_labels(noise(50, 7, 10)));
  REQUIRE_NOTHROW(mgpu::load_idx(images, labels));  // whole, it is fine
  Bytes gz = read_raw(images);
  gz.resize(gz.size() * 2 / 3);
  write_raw(images, gz);
  check_refused(images, labels, images, "truncated");
}

// gzip ends with an 8-byte trailer: the CRC-32 of the data, then its length. A download cut
// in the trailer has every data byte, yet is not a whole gzip file, and its data were never
// checked against the CRC: the loader promises to catch it all the same.
TEST_CASE("a gzip stream cut in its trailer is refused") {
  TempDir dir;
  const std::string images = dir.file("images.gz"), labels = dir.file("labels.gz");
  write_gz(images, idx_images(3, 2, 4, kPixels));
  write_gz(labels, idx_labels(kLabels));
  const Bytes gz = read_raw(images);
  for (std::size_t cut : {4u, 8u}) {
    CAPTURE(cut);
    write_raw(images, Bytes(gz.begin(), gz.end() - cut));
    CHECK_THROWS_WITH_AS(mgpu::load_idx(images, labels), doctest::Contains(images.c_str()), mgpu::Error);
  }
}

TEST_CASE("a gzip stream whose CRC does not match its data is refused") {
  TempDir dir;
  const std::string images = dir.file("images.gz"), labels = dir.file("labels.gz");
  write_gz(images, idx_images(3, 2, 4, kPixels));
  write_gz(labels, idx_labels(kLabels));
  Bytes gz = read_raw(images);
  gz[gz.size() - 8] ^= 0xff;  // the first byte of the CRC-32
  write_raw(images, gz);
  check_refused(images, labels, images, "corrupt");
}

TEST_CASE("pixels fewer than the header declares are refused") {
  TempDir dir;
  const std::string images = dir.file("images.gz"), labels = dir.file("labels.gz");
  const Bytes two_images(kPixels.begin(), kPixels.begin() + 16);
  write_gz(images, idx_images(3, 2, 4, two_images));  // says 3, holds 2
  write_gz(labels, idx_labels(kLabels));
  check_refused(images, labels, images, "truncated");
}

TEST_CASE("images and labels of different counts are refused, naming both files") {
  TempDir dir;
  const std::string images = dir.file("images.gz"), labels = dir.file("labels.gz");
  write_gz(images, idx_images(3, 2, 4, kPixels));
  write_gz(labels, idx_labels({0, 9}));
  check_refused(images, labels, images, "3 images");
  check_refused(images, labels, labels, "2 labels");
}

TEST_CASE("a missing file is refused, naming it") {
  TempDir dir;
  const std::string images = dir.file("images.gz"), labels = dir.file("labels.gz");
  SUBCASE("images") {
    write_gz(labels, idx_labels(kLabels));
    check_refused(images, labels, images, "not found");
  }
  SUBCASE("labels") {
    write_gz(images, idx_images(3, 2, 4, kPixels));
    check_refused(images, labels, labels, "not found");
  }
}

TEST_CASE("a label outside 0..9 is refused, naming the file and the example") {
  TempDir dir;
  const std::string images = dir.file("images.gz"), labels = dir.file("labels.gz");
  write_gz(images, idx_images(3, 2, 4, kPixels));
  write_gz(labels, idx_labels({0, 10, 4}));
  check_refused(images, labels, labels, "label 10 of example 1");
}

TEST_CASE("data beyond what the header declares is refused") {
  TempDir dir;
  const std::string images = dir.file("images.gz"), labels = dir.file("labels.gz");
  SUBCASE("an extra byte after the pixels") {
    Bytes pixels = kPixels;
    pixels.push_back(42);
    write_gz(images, idx_images(3, 2, 4, pixels));
    write_gz(labels, idx_labels(kLabels));
    check_refused(images, labels, images, "more data");
  }
  SUBCASE("an extra byte after the labels") {
    write_gz(images, idx_images(3, 2, 4, kPixels));
    Bytes file = idx_labels(kLabels);
    file.push_back(1);
    write_gz(labels, file);
    check_refused(images, labels, labels, "more data");
  }
}

// The gzip trailer (CRC-32 and length) comes after the last data byte, and only a reader that
// goes on to the stream's end learns whether it is there and matches. zlib's gzread does not
// always: once it has read the file's last bytes, an empty input buffer looks like a clean end.
// Through it, a file this large cut by 1 to 8 bytes, even with a bit of its pixels flipped,
// loaded without complaint; the loader now drives inflate() to the end of the stream itself.
TEST_CASE("a large gzip file cut anywhere in its trailer is refused, flipped bit or not") {
  TempDir dir;
  const std::string images = dir.file("images.gz"), labels = dir.file("labels.gz");
  write_gz(images, idx_images(500, 28, 28, noise(500 * 28 * 28)));
  write_gz(labels, idx_labels(noise(500, 7, 10)));
  REQUIRE_NOTHROW(mgpu::load_idx(images, labels));
  const Bytes gz = read_raw(images);
  for (int flip : {0, 1}) {
    for (std::size_t cut = 1; cut <= 8; ++cut) {
      CAPTURE(flip);
      CAPTURE(cut);
      Bytes bad(gz.begin(), gz.end() - cut);
      if (flip) bad[bad.size() / 2] ^= 0x01;  // a bit in the middle of the pixels' deflate data
      write_raw(images, bad);
      const std::string message = error_of([&] { mgpu::load_idx(images, labels); });
      INFO("message: ", message);
      CHECK(contains(message, images));
      // Without a flipped bit the stream is only short; with one, zlib may see the damage first.
      CHECK((contains(message, "truncated") || contains(message, "corrupt")));
    }
  }
}

TEST_CASE("bytes after the end of the gzip stream are refused") {
  TempDir dir;
  const std::string images = dir.file("images.gz"), labels = dir.file("labels.gz");
  write_gz(images, idx_images(3, 2, 4, kPixels));
  write_gz(labels, idx_labels(kLabels));
  const Bytes whole = read_raw(labels);
  SUBCASE("a few stray bytes") {
    Bytes file = whole;
    for (unsigned char b : {'x', 'y', 'z'}) file.push_back(b);
    write_raw(labels, file);
    check_refused(images, labels, labels, "after the end of its gzip stream");
  }
  SUBCASE("one zero byte") {
    Bytes file = whole;
    file.push_back(0);
    write_raw(labels, file);
    check_refused(images, labels, labels, "after the end of its gzip stream");
  }
}

// gzip allows a file of several members one after another (`cat a.gz b.gz`); Fashion-MNIST's
// files, and Debian's recompressed ones, are one member each. The loader reads exactly one
// member, so one CRC covers the whole payload, and refuses a second, saying so.
TEST_CASE("a second gzip member after the first is refused") {
  TempDir dir;
  const std::string images = dir.file("images.gz"), labels = dir.file("labels.gz");
  const Bytes idx = idx_images(3, 2, 4, kPixels);
  write_gz(images, Bytes(idx.begin(), idx.begin() + 20));  // the header and 4 pixels
  Bytes file = read_raw(images);
  write_gz(images, Bytes(idx.begin() + 20, idx.end()));  // the other 20 pixels
  const Bytes second = read_raw(images);
  file.insert(file.end(), second.begin(), second.end());
  write_raw(images, file);
  write_gz(labels, idx_labels(kLabels));
  check_refused(images, labels, images, "more than one gzip member");
}

// An image file whose header claims `count` images of 28x28 and holds 3 images of 2x4 pixels'
// worth, and a label file claiming `count` labels and holding 3, so the counts agree.
void write_lying_pair(const std::string& images, const std::string& labels, std::uint32_t count) {
  write_gz(images, idx_images(count, 28, 28, kPixels));
  Bytes file;
  put_u32(file, 0x801);
  put_u32(file, count);
  file.insert(file.end(), kLabels.begin(), kLabels.end());
  write_gz(labels, file);
}

TEST_CASE("a header claiming 10 million images (7.8 GB of pixels) is refused before any allocation") {
  TempDir dir;
  const std::string images = dir.file("images.gz"), labels = dir.file("labels.gz");
  write_lying_pair(images, labels, 10'000'000);
  const AllocationCeiling ceiling(64u << 20);  // 64 MiB in one piece: far more than these files hold
  check_refused(images, labels, images, "implausible");
}

TEST_CASE("a header claiming 1 million images (784 MB) in a file of a few bytes costs only those bytes") {
  TempDir dir;
  const std::string images = dir.file("images.gz"), labels = dir.file("labels.gz");
  write_lying_pair(images, labels, 1'000'000);
  const AllocationCeiling ceiling(64u << 20);
  check_refused(images, labels, images, "truncated");
}

// A FIFO opened for reading blocks until some process writes to it: a loader that opens it
// waits forever. The loader runs on another thread here; if it has not answered in 10 s the
// test becomes the writer the loader waits for, so that a failing loader fails, not hangs.
TEST_CASE("a FIFO given as a data file is refused at once, never waited on") {
  TempDir dir;
  const std::string images = dir.file("images.gz"), labels = dir.file("labels.gz");
  REQUIRE(mkfifo(images.c_str(), 0600) == 0);
  write_gz(labels, idx_labels(kLabels));
  auto message = std::async(std::launch::async, [&] { return error_of([&] { mgpu::load_idx(images, labels); }); });
  const bool answered = message.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
  CHECK_MESSAGE(answered, "load_idx is blocked opening the FIFO");
  if (!answered) close(open(images.c_str(), O_WRONLY));  // an empty write end lets it go on
  const std::string text = message.get();
  INFO("message: ", text);
  CHECK(contains(text, images));
  CHECK(contains(text, "FIFO"));
}

TEST_CASE("a directory or a device given as a data file is refused, naming it") {
  TempDir dir;
  const std::string images = dir.file("images.gz"), labels = dir.file("labels.gz");
  write_gz(labels, idx_labels(kLabels));
  SUBCASE("a directory") {
    fs::create_directory(images);
    check_refused(images, labels, images, "is a directory, not a regular file");
  }
  SUBCASE("a character device") {
    check_refused("/dev/null", labels, "/dev/null", "is a character device, not a regular file");
  }
}

TEST_CASE("a set of zero images is refused, naming the file") {
  TempDir dir;
  const std::string images = dir.file("images.gz"), labels = dir.file("labels.gz");
  write_gz(images, idx_images(0, 2, 4, {}));
  write_gz(labels, idx_labels({}));
  check_refused(images, labels, images, "no images");
}

// ------------------------------------------------------------------- finding the directory

// The four files of a tiny Fashion-MNIST (5 training and 3 test images of 28x28) in `dir`.
void write_tiny_dataset(const TempDir& dir, std::uint32_t side = 28) {
  write_gz(dir.file("train-images-idx3-ubyte.gz"), idx_images(5, side, side, noise(5 * side * side)));
  write_gz(dir.file("train-labels-idx1-ubyte.gz"), idx_labels({1, 2, 3, 4, 5}));
  write_gz(dir.file("t10k-images-idx3-ubyte.gz"), idx_images(3, side, side, noise(3 * side * side, 2)));
  write_gz(dir.file("t10k-labels-idx1-ubyte.gz"), idx_labels({7, 8, 9}));
}

// Sets an environment variable for one scope, then puts back what was there.
struct ScopedEnv {
  std::string name;
  bool had;
  std::string old;
  ScopedEnv(std::string n, const std::string& value) : name(std::move(n)) {
    const char* v = std::getenv(name.c_str());
    had = v != nullptr;
    if (had) old = v;
    setenv(name.c_str(), value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (had) setenv(name.c_str(), old.c_str(), 1);
    else unsetenv(name.c_str());
  }
};

TEST_CASE("--data-dir naming no directory is refused, naming it") {
  CHECK_THROWS_WITH_AS(mgpu::find_fashion_mnist("/nonexistent"), doctest::Contains("/nonexistent"), mgpu::Error);
  CHECK_THROWS_WITH_AS(mgpu::load_fashion_mnist("/nonexistent"), doctest::Contains("/nonexistent"), mgpu::Error);
}

TEST_CASE("--data-dir is used as given, never swapped for another place") {
  TempDir empty;  // a directory, but without the files: the loader must say which file is missing
  CHECK(mgpu::find_fashion_mnist(empty.path.string()) == empty.path.string());
  const std::string first_file = empty.file("train-images-idx3-ubyte.gz");
  CHECK_THROWS_WITH_AS(mgpu::load_fashion_mnist(empty.path.string()), doctest::Contains(first_file.c_str()),
                       mgpu::Error);
}

TEST_CASE("$FASHION_MNIST_DIR is searched first; --data-dir overrides it") {
  TempDir tiny, other;
  write_tiny_dataset(tiny);
  const ScopedEnv env("FASHION_MNIST_DIR", tiny.path.string());
  CHECK(mgpu::find_fashion_mnist("") == tiny.path.string());
  CHECK(mgpu::find_fashion_mnist(other.path.string()) == other.path.string());

  const mgpu::FashionMnist data = mgpu::load_fashion_mnist("", /*limit_train=*/2);
  CHECK(data.dir == tiny.path.string());
  CHECK(data.train.count == 2);
  CHECK(data.train.labels == std::vector<std::int32_t>{1, 2});
  CHECK(data.train.pixels.size() == 2u * 28 * 28);
  CHECK(data.test.count == 3);
  CHECK(data.test.labels == std::vector<std::int32_t>{7, 8, 9});
}

TEST_CASE("$FASHION_MNIST_DIR is used as set, never passed over for another place") {
  // A folder without the files: loading it names the missing file, even where the real data
  // set would be found elsewhere (a silent fall-back would train on another set than the one set).
  TempDir empty;
  {
    const ScopedEnv env("FASHION_MNIST_DIR", empty.path.string());
    CHECK(mgpu::find_fashion_mnist("") == empty.path.string());
    CHECK_THROWS_WITH_AS(mgpu::load_fashion_mnist(""), doctest::Contains(empty.file("train-images-idx3-ubyte.gz").c_str()),
                         mgpu::Error);
  }
  // No such folder, or a file: refused, naming the variable and its value.
  const std::string missing = (empty.path / "nowhere").string();
  {
    const ScopedEnv env("FASHION_MNIST_DIR", missing);
    CHECK(error_of([] { mgpu::find_fashion_mnist(""); }) == "FASHION_MNIST_DIR=" + missing + ": no such directory");
  }
  const std::string file = empty.file("a_file");
  std::ofstream(file) << "not a folder";
  {
    const ScopedEnv env("FASHION_MNIST_DIR", file);
    CHECK(error_of([] { mgpu::find_fashion_mnist(""); }) == "FASHION_MNIST_DIR=" + file + ": no such directory");
  }
  // Set but empty is not set: the search goes on as without it.
  const ScopedEnv unset("FASHION_MNIST_DIR", "");
  const std::string message = error_of([] { mgpu::find_fashion_mnist(""); });
  CHECK_FALSE(contains(message, "FASHION_MNIST_DIR="));
}

TEST_CASE("images that are not 28x28 are refused as Fashion-MNIST, naming the file") {
  TempDir tiny;
  write_tiny_dataset(tiny, /*side=*/27);
  const std::string message = error_of([&] { mgpu::load_fashion_mnist(tiny.path.string()); });
  INFO("message: ", message);
  CHECK(contains(message, "28x28"));
  CHECK(contains(message, tiny.file("train-images-idx3-ubyte.gz")));
}

TEST_CASE("a header declaring 2^27 one-pixel images is refused from the header, before any pixel is read") {
  // 128 MiB of pixels is within the loader's 1 GiB, so only the shape can refuse it early: the
  // file holds 3 pixels, and a loader that read first would say "truncated" (after seconds, on a
  // file that held them all).
  TempDir tiny;
  write_tiny_dataset(tiny);
  write_gz(tiny.file("train-images-idx3-ubyte.gz"), idx_images(1u << 27, 1, 1, {0, 1, 2}));
  const AllocationCeiling ceiling(64u << 20);
  const std::string message = error_of([&] { mgpu::load_fashion_mnist(tiny.path.string()); });
  INFO("message: ", message);
  CHECK(contains(message, tiny.file("train-images-idx3-ubyte.gz")));
  CHECK(contains(message, "Fashion-MNIST images are 28x28, this header says 134217728 images of 1x1"));
}

TEST_CASE("an empty test set is refused, naming its file (not trained on to give test_acc=nan)") {
  TempDir tiny;
  write_tiny_dataset(tiny);
  write_gz(tiny.file("t10k-images-idx3-ubyte.gz"), idx_images(0, 28, 28, {}));
  write_gz(tiny.file("t10k-labels-idx1-ubyte.gz"), idx_labels({}));
  const std::string message = error_of([&] { mgpu::load_fashion_mnist(tiny.path.string()); });
  INFO("message: ", message);
  CHECK(contains(message, tiny.file("t10k-images-idx3-ubyte.gz")));
  CHECK(contains(message, "no images"));
}

TEST_CASE("limit_train: 0 or at least the set's size keeps every image; a negative one is refused") {
  TempDir tiny;
  write_tiny_dataset(tiny);  // 5 training images
  CHECK(mgpu::load_fashion_mnist(tiny.path.string(), 0).train.count == 5);
  CHECK(mgpu::load_fashion_mnist(tiny.path.string(), 5).train.count == 5);
  CHECK(mgpu::load_fashion_mnist(tiny.path.string(), 1000).train.count == 5);
  CHECK(mgpu::load_fashion_mnist(tiny.path.string(), 1).train.count == 1);
  CHECK_THROWS_WITH_AS(mgpu::load_fashion_mnist(tiny.path.string(), -1), doctest::Contains("limit"), mgpu::Error);
}

}  // namespace
