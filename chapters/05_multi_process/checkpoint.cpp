#include "checkpoint.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>

#include "common/check.h"

namespace mp {
namespace {

constexpr char kMagic[8] = {'M', 'G', 'P', 'U', 'C', 'K', 'P', 'T'};
constexpr std::size_t kHeaderBytes = 8 + 4 + 4 + 8 + 4 + 4 + 4 + 8;  // magic .. parameter count
constexpr std::size_t kRecordBytes = 4 + 4 * 8;                     // one finished epoch
constexpr std::size_t kCrcBytes = 4;

std::uint32_t crc32_of(const std::string& bytes, std::size_t n) {
  return static_cast<std::uint32_t>(::crc32(0L, reinterpret_cast<const Bytef*>(bytes.data()), static_cast<uInt>(n)));
}

// Appends numbers to a byte string, least significant byte first.
class Writer {
 public:
  void raw(const void* p, std::size_t n) { out_.append(static_cast<const char*>(p), n); }
  void u32(std::uint32_t v) { little_endian(v, 4); }
  void u64(std::uint64_t v) { little_endian(v, 8); }
  void i32(std::int32_t v) { u32(static_cast<std::uint32_t>(v)); }
  void i64(std::int64_t v) { u64(static_cast<std::uint64_t>(v)); }
  void f32(float v) {
    std::uint32_t bits;
    std::memcpy(&bits, &v, 4);
    u32(bits);
  }
  void f64(double v) {
    std::uint64_t bits;
    std::memcpy(&bits, &v, 8);
    u64(bits);
  }
  std::string& bytes() { return out_; }

 private:
  void little_endian(std::uint64_t v, int n) {
    for (int i = 0; i < n; ++i) out_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
  std::string out_;
};

// Reads them back. Every read is bounds-checked: past the end means the file is truncated.
class Reader {
 public:
  Reader(const std::string& bytes, const std::string& path) : in_(bytes), path_(path) {}
  std::uint32_t u32(const char* what) { return static_cast<std::uint32_t>(little_endian(4, what)); }
  std::uint64_t u64(const char* what) { return little_endian(8, what); }
  std::int32_t i32(const char* what) { return static_cast<std::int32_t>(u32(what)); }
  std::int64_t i64(const char* what) { return static_cast<std::int64_t>(u64(what)); }
  float f32(const char* what) {
    const std::uint32_t bits = u32(what);
    float v;
    std::memcpy(&v, &bits, 4);
    return v;
  }
  double f64(const char* what) {
    const std::uint64_t bits = u64(what);
    double v;
    std::memcpy(&v, &bits, 8);
    return v;
  }

 private:
  std::uint64_t little_endian(std::size_t n, const char* what) {
    if (at_ + n > in_.size())
      throw mgpu::Error(path_ + ": truncated checkpoint: the file ends (" + std::to_string(in_.size()) +
                        " bytes) inside the " + what);
    std::uint64_t v = 0;
    for (std::size_t i = 0; i < n; ++i) v |= std::uint64_t(static_cast<unsigned char>(in_[at_ + i])) << (8 * i);
    at_ += n;
    return v;
  }
  const std::string& in_;
  const std::string& path_;
  std::size_t at_ = 8;  // after the magic, which is compared as bytes
};

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw mgpu::Error(path + ": cannot open the checkpoint: " + std::strerror(errno));
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw mgpu::Error(path + ": cannot read the checkpoint: " + std::strerror(errno));
  return bytes;
}

// Writes all of `bytes` to a new file and flushes it to the disk (fsync), so that after the
// rename the checkpoint is there even if the machine loses power.
void write_file_durably(const std::string& path, const std::string& bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw mgpu::Error(path + ": cannot create the checkpoint: " + std::strerror(errno));
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string why = std::strerror(errno);
      ::close(fd);
      throw mgpu::Error(path + ": cannot write the checkpoint: " + why);
    }
    done += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0)
    throw mgpu::Error(path + ": cannot flush the checkpoint to the disk: " + std::strerror(errno));
}

}  // namespace

std::string encode_checkpoint(const Checkpoint& c) {
  if (static_cast<int>(c.history.size()) != c.epochs_done)
    throw mgpu::Error("encode_checkpoint: " + std::to_string(c.history.size()) + " epoch records for " +
                      std::to_string(c.epochs_done) + " epochs done");
  Writer w;
  w.raw(kMagic, sizeof kMagic);
  w.u32(kCheckpointVersion);
  w.i32(c.epochs_done);
  w.u64(c.seed);
  w.i32(c.batch_size);
  w.f32(c.lr);
  w.i32(c.train_examples);
  w.i64(static_cast<std::int64_t>(c.params.size()));
  for (const mgpu::EpochRecord& r : c.history) {
    w.i32(r.epoch);
    w.f64(r.train_loss);
    w.f64(r.train_acc);
    w.f64(r.test_acc);
    w.f64(r.seconds);
  }
  for (float p : c.params) w.f32(p);
  w.u32(crc32_of(w.bytes(), w.bytes().size()));
  return w.bytes();
}

void write_checkpoint(const std::string& path, const Checkpoint& c) {
  const std::string tmp = path + ".tmp";
  write_file_durably(tmp, encode_checkpoint(c));
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    throw mgpu::Error(path + ": cannot rename " + tmp + " to it: " + std::strerror(errno));
}

Checkpoint read_checkpoint(const std::string& path, std::int64_t expected_params) {
  const std::string bytes = read_file(path);
  const std::size_t head = std::min(bytes.size(), sizeof kMagic);
  if (std::memcmp(bytes.data(), kMagic, head) != 0)
    throw mgpu::Error(path + ": not a checkpoint of this program (it does not start with \"MGPUCKPT\")");
  if (head < sizeof kMagic)
    throw mgpu::Error(path + ": truncated checkpoint: the file ends (" + std::to_string(bytes.size()) +
                      " bytes) inside the magic string");
  Reader r(bytes, path);
  const std::uint32_t version = r.u32("format version");
  if (version != kCheckpointVersion)
    throw mgpu::Error(path + ": checkpoint format version " + std::to_string(version) +
                      ", this program reads version " + std::to_string(kCheckpointVersion));
  Checkpoint c;
  c.epochs_done = r.i32("epoch count");
  c.seed = r.u64("seed");
  c.batch_size = r.i32("batch size");
  c.lr = r.f32("learning rate");
  c.train_examples = r.i32("training-set size");
  const std::int64_t params = r.i64("parameter count");

  // The header says how long the file must be; check that before trusting any more of it.
  if (params != expected_params)
    throw mgpu::Error(path + ": the checkpoint holds " + std::to_string(params) + " parameters, this model has " +
                      std::to_string(expected_params));
  if (c.epochs_done < 0 || c.epochs_done > 1'000'000)
    throw mgpu::Error(path + ": corrupt checkpoint: " + std::to_string(c.epochs_done) + " epochs done");
  const std::size_t expected_size =
      kHeaderBytes + kRecordBytes * std::size_t(c.epochs_done) + 4 * std::size_t(params) + kCrcBytes;
  if (bytes.size() < expected_size)
    throw mgpu::Error(path + ": truncated checkpoint: " + std::to_string(bytes.size()) + " bytes, a checkpoint of " +
                      std::to_string(c.epochs_done) + " epochs and " + std::to_string(params) + " parameters has " +
                      std::to_string(expected_size));
  if (bytes.size() > expected_size)
    throw mgpu::Error(path + ": corrupt checkpoint: the file has " + std::to_string(bytes.size()) +
                      " bytes, its header accounts for " + std::to_string(expected_size));
  const std::size_t body = expected_size - kCrcBytes;
  std::uint32_t stored = 0;  // little-endian, like every number in the file
  for (std::size_t i = 0; i < kCrcBytes; ++i)
    stored |= std::uint32_t(static_cast<unsigned char>(bytes[body + i])) << (8 * i);
  if (const std::uint32_t computed = crc32_of(bytes, body); computed != stored) {
    std::ostringstream why;
    why << path << ": corrupt checkpoint: checksum mismatch (stored CRC-32 0x" << std::hex << stored << ", computed 0x"
        << computed << ")";
    throw mgpu::Error(why.str());
  }

  for (int e = 0; e < c.epochs_done; ++e) {
    mgpu::EpochRecord rec;
    rec.epoch = r.i32("epoch records");
    rec.train_loss = r.f64("epoch records");
    rec.train_acc = r.f64("epoch records");
    rec.test_acc = r.f64("epoch records");
    rec.seconds = r.f64("epoch records");
    c.history.push_back(rec);
  }
  c.params.resize(static_cast<std::size_t>(params));
  for (float& p : c.params) p = r.f32("parameters");
  return c;
}

}  // namespace mp
