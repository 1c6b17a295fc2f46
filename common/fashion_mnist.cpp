#include "fashion_mnist.h"

#include <zlib.h>

#include <cstdlib>
#include <filesystem>
#include <memory>

#include "check.h"

namespace mgpu {
namespace {

namespace fs = std::filesystem;

constexpr std::uint32_t kImagesMagic = 0x00000803;  // unsigned byte data, 3 dimensions
constexpr std::uint32_t kLabelsMagic = 0x00000801;  // unsigned byte data, 1 dimension

// A gzip file read front to back. Every failure names the file.
class GzipReader {
 public:
  explicit GzipReader(const std::string& path) : path_(path), file_(gzopen(path.c_str(), "rb"), gzclose) {
    if (!fs::exists(path)) fail("file not found");
    if (!file_) fail("cannot be opened");
  }

  // Exactly `bytes` bytes, or an error saying how many were there.
  void read(void* dst, std::size_t bytes, const char* what) {
    std::size_t done = 0;
    auto* out = static_cast<unsigned char*>(dst);
    while (done < bytes) {
      const unsigned chunk = static_cast<unsigned>(std::min<std::size_t>(bytes - done, 1u << 30));
      const int got = gzread(file_.get(), out + done, chunk);
      if (got < 0) fail(std::string("corrupt gzip stream while reading ") + what + ": " + zlib_error());
      if (got == 0) break;
      done += static_cast<std::size_t>(got);
    }
    if (done < bytes) {
      std::string why = zlib_error();
      fail(std::string("truncated: ") + what + " needs " + std::to_string(bytes) + " bytes, only " +
           std::to_string(done) + " are there" + (why.empty() ? "" : " (" + why + ")"));
    }
  }

  std::uint32_t read_big_endian_u32(const char* what) {
    unsigned char b[4];
    read(b, 4, what);
    return (std::uint32_t(b[0]) << 24) | (std::uint32_t(b[1]) << 16) | (std::uint32_t(b[2]) << 8) | b[3];
  }

  // Reading one byte past the payload must meet a clean end: this is also when zlib
  // checks the stream's CRC, so a corrupt file is caught even if its sizes look right.
  void expect_end() {
    unsigned char extra;
    const int got = gzread(file_.get(), &extra, 1);
    if (got > 0) fail("holds more data than its header declares");
    // gzread returns -1 for a bad CRC but 0 for a stream cut inside its 8-byte trailer;
    // zlib's error state tells the second case from a clean end.
    if (got < 0 || !zlib_error().empty()) fail("corrupt or truncated gzip stream: " + zlib_error());
  }

  [[noreturn]] void fail(const std::string& why) const { throw Error(path_ + ": " + why); }

 private:
  std::string zlib_error() const {
    int code = Z_OK;
    const char* msg = file_ ? gzerror(file_.get(), &code) : nullptr;
    return code == Z_OK || !msg ? "" : msg;
  }
  std::string path_;
  std::unique_ptr<gzFile_s, int (*)(gzFile)> file_;
};

bool has_all_files(const std::string& dir) {
  for (const char* f : {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                        "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"})
    if (!fs::exists(fs::path(dir) / f)) return false;
  return true;
}

}  // namespace

std::string find_fashion_mnist(const std::string& data_dir_flag) {
  // An explicit --data-dir is the user's choice: use it or fail, never fall back silently.
  if (!data_dir_flag.empty()) {
    if (!fs::is_directory(data_dir_flag)) throw Error("--data-dir " + data_dir_flag + ": no such directory");
    return data_dir_flag;
  }
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("FASHION_MNIST_DIR"); env && *env) candidates.push_back(env);
  candidates.push_back(std::string(MGPU_SOURCE_DIR) + "/data/fashion-mnist");
  candidates.push_back("/usr/share/datasets/fashion-mnist");
  std::string looked;
  for (const std::string& dir : candidates) {
    if (has_all_files(dir)) return dir;
    looked += "\n  " + dir;
  }
  throw Error("Fashion-MNIST not found. Looked in:" + looked +
              "\nInstall it with `apt-get install dataset-fashion-mnist`, fetch it with "
              "`cmake -P data/fetch.cmake`, or pass --data-dir.");
}

LabeledImages load_idx(const std::string& images_path, const std::string& labels_path) {
  LabeledImages set;
  GzipReader images(images_path);
  if (std::uint32_t magic = images.read_big_endian_u32("the magic number"); magic != kImagesMagic)
    images.fail("wrong magic number " + std::to_string(magic) + " (an IDX image file has " +
                std::to_string(kImagesMagic) + ")");
  const std::uint32_t count = images.read_big_endian_u32("the image count");
  const std::uint32_t rows = images.read_big_endian_u32("the row count");
  const std::uint32_t cols = images.read_big_endian_u32("the column count");
  if (rows == 0 || cols == 0 || rows > 4096 || cols > 4096 || count > 10'000'000)
    images.fail("implausible header: " + std::to_string(count) + " images of " + std::to_string(rows) +
                "x" + std::to_string(cols));

  GzipReader labels(labels_path);
  if (std::uint32_t magic = labels.read_big_endian_u32("the magic number"); magic != kLabelsMagic)
    labels.fail("wrong magic number " + std::to_string(magic) + " (an IDX label file has " +
                std::to_string(kLabelsMagic) + ")");
  if (std::uint32_t label_count = labels.read_big_endian_u32("the label count"); label_count != count)
    throw Error(images_path + " holds " + std::to_string(count) + " images but " + labels_path +
                " holds " + std::to_string(label_count) + " labels");

  std::vector<unsigned char> raw(static_cast<std::size_t>(count) * rows * cols);
  images.read(raw.data(), raw.size(), "the pixels");
  images.expect_end();
  set.count = static_cast<int>(count);
  set.rows = static_cast<int>(rows);
  set.cols = static_cast<int>(cols);
  set.pixels.resize(raw.size());
  for (std::size_t i = 0; i < raw.size(); ++i) set.pixels[i] = raw[i] / 255.0f;

  std::vector<unsigned char> raw_labels(count);
  labels.read(raw_labels.data(), raw_labels.size(), "the labels");
  labels.expect_end();
  set.labels.resize(count);
  for (std::size_t i = 0; i < count; ++i) {
    if (raw_labels[i] >= kClasses)
      labels.fail("label " + std::to_string(raw_labels[i]) + " of example " + std::to_string(i) +
                  " is not a class 0..9");
    set.labels[i] = raw_labels[i];
  }
  return set;
}

FashionMnist load_fashion_mnist(const std::string& data_dir_flag, int limit_train) {
  FashionMnist data;
  data.dir = find_fashion_mnist(data_dir_flag);
  const fs::path dir(data.dir);
  data.train = load_idx((dir / "train-images-idx3-ubyte.gz").string(), (dir / "train-labels-idx1-ubyte.gz").string());
  data.test = load_idx((dir / "t10k-images-idx3-ubyte.gz").string(), (dir / "t10k-labels-idx1-ubyte.gz").string());
  for (const LabeledImages* s : {&data.train, &data.test})
    if (s->rows != 28 || s->cols != 28)
      throw Error(data.dir + ": Fashion-MNIST images are 28x28, these are " + std::to_string(s->rows) + "x" +
                  std::to_string(s->cols));
  if (limit_train > 0 && limit_train < data.train.count) {
    data.train.count = limit_train;
    data.train.pixels.resize(static_cast<std::size_t>(limit_train) * 28 * 28);
    data.train.labels.resize(limit_train);
  }
  return data;
}

}  // namespace mgpu
