#include "fashion_mnist.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>

#include "check.h"

namespace mgpu {
namespace {

namespace fs = std::filesystem;

constexpr std::uint32_t kImagesMagic = 0x00000803;  // unsigned byte data, 3 dimensions
constexpr std::uint32_t kLabelsMagic = 0x00000801;  // unsigned byte data, 1 dimension

// The most pixel bytes an image file's header may declare: 1 GiB, about 20 times Fashion-MNIST's
// training set (60,000 x 28 x 28 = 47 MB), 4 GiB once scaled to floats. A header claiming more
// is refused before anything is read. (Comparing the claim with the compressed size times
// deflate's largest ratio, 1032:1, would not be enough: a real "gzip bomb" passes that test.)
constexpr std::uint64_t kMaxPixelBytes = std::uint64_t(1) << 30;

// What a path that is not a regular file names, for the message that refuses it.
const char* kind_of(fs::file_type type) {
  switch (type) {
    case fs::file_type::directory: return "a directory";
    case fs::file_type::fifo: return "a FIFO (named pipe)";
    case fs::file_type::character: return "a character device";
    case fs::file_type::block: return "a block device";
    case fs::file_type::socket: return "a socket";
    default: return "not a file";
  }
}

// Data files must be regular files, and this is checked with stat(), before anything opens
// them: opening a FIFO for reading waits until some process writes to it, maybe forever, and a
// directory or a device is a wrong path, clearer named as such than reported as bad gzip.
void require_regular_file(const std::string& path) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);  // follows symbolic links, as open() would
  if (st.type() == fs::file_type::not_found) throw Error(path + ": file not found");
  if (ec) throw Error(path + ": cannot be examined: " + ec.message());
  if (st.type() != fs::file_type::regular)
    throw Error(path + ": is " + kind_of(st.type()) + ", not a regular file");
}

// zlib's inflate state, ended however the reader that owns it is left.
struct Inflater {
  z_stream z{};
  // 16 + MAX_WBITS: a gzip wrapper only (not zlib's, not raw deflate), with any window size.
  int status = inflateInit2(&z, 16 + MAX_WBITS);
  Inflater() = default;
  Inflater(const Inflater&) = delete;
  Inflater& operator=(const Inflater&) = delete;
  ~Inflater() {
    if (status == Z_OK) inflateEnd(&z);
  }
};

// A gzip file decompressed front to back, as exactly one gzip member. The member ends with a
// trailer, the CRC-32 and length of its data, which inflate() checks when it gets there; the
// reader only accepts data once it has reached that end (expect_end), so data whose CRC was
// never checked is never accepted. Every failure names the file.
class GzipReader {
 public:
  explicit GzipReader(const std::string& path) : path_(path) {
    require_regular_file(path);
    file_.reset(std::fopen(path.c_str(), "rb"));
    if (!file_) fail(std::string("cannot be opened: ") + std::strerror(errno));
    if (inflater_.status != Z_OK) fail("zlib cannot start decompressing (out of memory?)");
    require_gzip_magic();
  }

  // Exactly `bytes` bytes (a few: a header field), or an error saying how many were there.
  void read(unsigned char* dst, std::size_t bytes, const char* what) {
    const std::size_t got = inflate_into(dst, bytes, what);
    if (got < bytes) fail_short(what, bytes, got);
  }

  std::uint32_t read_big_endian_u32(const char* what) {
    unsigned char b[4];
    read(b, 4, what);
    return (std::uint32_t(b[0]) << 24) | (std::uint32_t(b[1]) << 16) | (std::uint32_t(b[2]) << 8) | b[3];
  }

  // `bytes` bytes in a vector that grows as they arrive, 1 MiB at a time, rather than one sized
  // from the header up front: a header that lies about its count costs only the memory of the
  // data really there by the time the lie is found.
  std::vector<unsigned char> read_bytes(std::uint64_t bytes, const char* what) {
    constexpr std::uint64_t kStep = 1 << 20;
    std::vector<unsigned char> out;
    while (out.size() < bytes) {
      const std::size_t have = out.size();
      const std::size_t step = static_cast<std::size_t>(std::min(kStep, bytes - have));
      out.resize(have + step);
      const std::size_t got = inflate_into(out.data() + have, step, what);
      if (got < step) fail_short(what, bytes, have + got);
    }
    return out;
  }

  // After the last byte the header declares, the gzip stream must end: no more data, then its
  // trailer, whose CRC-32 and length inflate() checks against the data it produced.
  void expect_end() {
    unsigned char extra;
    if (inflate_into(&extra, 1, "the gzip trailer, the CRC-32 and length of the data") > 0)
      fail("holds more data than its header declares");
  }

  [[noreturn]] void fail(const std::string& why) const { throw Error(path_ + ": " + why); }

 private:
  // Decompresses into out[0, n) until it is full or the gzip stream ends; returns the bytes
  // produced. A stream that the file cuts short, or that zlib finds corrupt, is refused here.
  std::size_t inflate_into(unsigned char* out, std::size_t n, const char* what) {
    z_stream& z = inflater_.z;
    z.next_out = out;
    z.avail_out = static_cast<uInt>(n);  // callers ask for at most 1 MiB at a time
    while (z.avail_out > 0 && !stream_ended_) {
      if (z.avail_in == 0 && !fill_input(1))
        fail(std::string("truncated: the file ends before its gzip stream does (while reading ") + what + ")");
      const int rc = inflate(&z, Z_NO_FLUSH);
      if (rc == Z_STREAM_END) {
        stream_ended_ = true;
        require_nothing_after_stream();
      } else if (rc == Z_DATA_ERROR) {
        fail(std::string("corrupt gzip stream while reading ") + what + ": " + (z.msg ? z.msg : "invalid data"));
      } else if (rc != Z_OK && rc != Z_BUF_ERROR) {  // Z_BUF_ERROR: it wants more input, given above
        fail(std::string("zlib error ") + std::to_string(rc) + " while reading " + what);
      }
    }
    return n - z.avail_out;
  }

  // Makes at least `bytes` unread input bytes available to inflate() if the file still holds
  // them; returns whether it does.
  bool fill_input(std::size_t bytes) {
    z_stream& z = inflater_.z;
    if (z.avail_in > 0) std::memmove(in_.data(), z.next_in, z.avail_in);
    z.next_in = in_.data();
    while (z.avail_in < bytes) {
      const std::size_t got = std::fread(in_.data() + z.avail_in, 1, in_.size() - z.avail_in, file_.get());
      if (got == 0) {
        if (std::ferror(file_.get())) fail(std::string("read error: ") + std::strerror(errno));
        break;
      }
      z.avail_in += static_cast<uInt>(got);
    }
    return z.avail_in >= bytes;
  }

  // Every gzip file begins with the bytes 1f 8b. Checking them first gives a plain message for a
  // file that is not gzip at all (an uncompressed IDX file, say, which has no CRC to check).
  void require_gzip_magic() {
    const bool two_bytes = fill_input(2);
    if (inflater_.z.avail_in == 0) fail("is empty, not a gzip file");
    const unsigned char* b = inflater_.z.next_in;
    if (!two_bytes || b[0] != 0x1f || b[1] != 0x8b)
      fail("not a gzip file (a gzip file begins with the bytes 1f 8b)");
  }

  // gzip allows several members one after another in a file (`cat a.gz b.gz > c.gz`). Fashion-
  // MNIST's files, and Debian's recompressed ones, hold one each, and reading exactly one keeps
  // the rule simple: one CRC covers all the data. Anything after its trailer is refused.
  void require_nothing_after_stream() {
    if (!fill_input(1)) return;  // the end of the file: all is well
    const bool two_bytes = fill_input(2);
    const unsigned char* b = inflater_.z.next_in;
    if (two_bytes && b[0] == 0x1f && b[1] == 0x8b)
      fail("holds more than one gzip member; the loader reads files of exactly one "
           "(recompress it: gunzip -c FILE > x && gzip x)");
    fail("has data after the end of its gzip stream");
  }

  [[noreturn]] void fail_short(const char* what, std::uint64_t bytes, std::uint64_t got) const {
    fail(std::string("truncated: expected ") + std::to_string(bytes) + " bytes for " + what + ", found " +
         std::to_string(got));
  }

  std::string path_;
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file_{nullptr, std::fclose};
  Inflater inflater_;
  std::vector<unsigned char> in_ = std::vector<unsigned char>(1 << 16);  // compressed input
  bool stream_ended_ = false;
};

bool has_all_files(const std::string& dir) {
  for (const char* f : {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                        "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"})
    if (std::error_code ec; !fs::exists(fs::path(dir) / f, ec)) return false;  // (ec: a path too long, say)
  return true;
}

struct ImageHeader {
  std::uint32_t count, rows, cols;
};

// The image file's header, checked before anything is allocated for what it declares; `rows`
// and `cols`, where not 0, are the shape the caller's model needs.
ImageHeader read_image_header(GzipReader& images, int rows, int cols) {
  if (std::uint32_t magic = images.read_big_endian_u32("the IDX magic number"); magic != kImagesMagic)
    images.fail("wrong magic number " + std::to_string(magic) + " (an IDX image file has " +
                std::to_string(kImagesMagic) + ")");
  ImageHeader h{};
  h.count = images.read_big_endian_u32("the image count");
  h.rows = images.read_big_endian_u32("the row count");
  h.cols = images.read_big_endian_u32("the column count");
  const std::string shape = std::to_string(h.count) + " images of " + std::to_string(h.rows) + "x" +
                            std::to_string(h.cols);
  // An empty set would train on nothing, or give a test accuracy of 0/0.
  if (h.count == 0) images.fail("holds no images (its header says 0)");
  if (h.rows == 0 || h.cols == 0) images.fail("implausible header: " + shape);
  if ((rows != 0 && h.rows != std::uint32_t(rows)) || (cols != 0 && h.cols != std::uint32_t(cols)))
    images.fail("Fashion-MNIST images are " + std::to_string(rows) + "x" + std::to_string(cols) +
                ", this header says " + shape);
  // Both products fit in 64 bits: rows * cols < 2^64, and then at most 2^30 * count < 2^62.
  const std::uint64_t per_image = std::uint64_t(h.rows) * h.cols;
  if (per_image > kMaxPixelBytes || per_image * h.count > kMaxPixelBytes)
    images.fail("implausible header: " + shape + " is more than the 1 GiB of pixels the loader accepts");
  return h;
}

// One split of Fashion-MNIST, whose images must be 28x28: the size this repository's models take
// (refused from the header, before a header declaring millions of other images is read).
LabeledImages load_split(const fs::path& dir, const std::string& prefix) {
  return load_idx((dir / (prefix + "-images-idx3-ubyte.gz")).string(),
                  (dir / (prefix + "-labels-idx1-ubyte.gz")).string(), 28, 28);
}

// Keeps the first `limit` examples; 0, or a limit at or above the count, keeps them all.
void keep_first(LabeledImages& set, int limit) {
  if (limit == 0 || limit >= set.count) return;
  set.count = limit;
  set.pixels.resize(static_cast<std::size_t>(limit) * set.pixels_per_image());
  set.pixels.shrink_to_fit();
  set.labels.resize(limit);
  set.labels.shrink_to_fit();
}

// A folder the user named (--data-dir, or $FASHION_MNIST_DIR): it must be a folder; if it lacks a
// file, loading it says which. Never passed over for another place: a data set other than the one
// asked for would train silently.
std::string chosen_folder(const std::string& named_as, const std::string& dir) {
  std::error_code ec;
  const fs::file_status st = fs::status(dir, ec);
  if (st.type() == fs::file_type::not_found || (!ec && st.type() != fs::file_type::directory))
    throw Error(named_as + ": no such directory");
  if (ec) throw Error(named_as + ": cannot be examined: " + ec.message());
  return dir;
}
}  // namespace

std::string find_fashion_mnist(const std::string& data_dir_flag) {
  // An explicit --data-dir is the user's choice: use it or fail, never fall back silently. So is
  // $FASHION_MNIST_DIR, when it is set and not empty.
  if (!data_dir_flag.empty()) return chosen_folder("--data-dir " + data_dir_flag, data_dir_flag);
  if (const char* env = std::getenv("FASHION_MNIST_DIR"); env && *env)
    return chosen_folder(std::string("FASHION_MNIST_DIR=") + env, env);
  std::vector<std::string> candidates;
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

LabeledImages load_idx(const std::string& images_path, const std::string& labels_path, int rows, int cols) {
  GzipReader images(images_path);
  const ImageHeader h = read_image_header(images, rows, cols);

  GzipReader labels(labels_path);
  if (std::uint32_t magic = labels.read_big_endian_u32("the IDX magic number"); magic != kLabelsMagic)
    labels.fail("wrong magic number " + std::to_string(magic) + " (an IDX label file has " +
                std::to_string(kLabelsMagic) + ")");
  if (std::uint32_t label_count = labels.read_big_endian_u32("the label count"); label_count != h.count)
    throw Error(images_path + " holds " + std::to_string(h.count) + " images but " + labels_path + " holds " +
                std::to_string(label_count) + " labels");

  LabeledImages set;
  const std::vector<unsigned char> raw = images.read_bytes(std::uint64_t(h.count) * h.rows * h.cols, "the pixels");
  images.expect_end();
  set.count = static_cast<int>(h.count);  // at most 2^30, by read_image_header's check
  set.rows = static_cast<int>(h.rows);
  set.cols = static_cast<int>(h.cols);
  set.pixels.resize(raw.size());
  for (std::size_t i = 0; i < raw.size(); ++i) set.pixels[i] = raw[i] / 255.0f;

  const std::vector<unsigned char> raw_labels = labels.read_bytes(h.count, "the labels");
  labels.expect_end();
  set.labels.resize(h.count);
  for (std::size_t i = 0; i < h.count; ++i) {
    if (raw_labels[i] >= kClasses)
      labels.fail("label " + std::to_string(raw_labels[i]) + " of example " + std::to_string(i) +
                  " is not a class 0..9");
    set.labels[i] = raw_labels[i];
  }
  return set;
}

FashionMnist load_fashion_mnist(const std::string& data_dir_flag, int limit_train) {
  if (limit_train < 0)
    throw Error("limit_train must be 0 (every training image) or more, got " + std::to_string(limit_train));
  FashionMnist data;
  data.dir = find_fashion_mnist(data_dir_flag);
  data.train = load_split(data.dir, "train");
  data.test = load_split(data.dir, "t10k");
  keep_first(data.train, limit_train);
  return data;
}

}  // namespace mgpu
