#include "checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <utility>

#include "common/check.h"
#include "common/exercise.h"  // the student copy's holes call mgpu::exercise_not_done

namespace mp {
namespace {

constexpr char kMagic[8] = {'M', 'G', 'P', 'U', 'C', 'K', 'P', 'T'};
constexpr std::size_t kHeaderBytes = 8 + 4 + 4 + 8 + 4 + 4 + 4 + 4 + 8;  // magic .. parameter count
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

// What a path names when it is not a regular file, for the refusals.
std::string kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "neither a file nor a folder";
}

std::string errno_text() { return std::strerror(errno); }

// The folder that holds `path` ("." for a bare file name).
std::string folder_of(const std::string& path) {
  const std::string parent = std::filesystem::path(path).parent_path().string();
  return parent.empty() ? "." : parent;
}

// A file descriptor, closed when it goes out of scope; close() closes it early and says whether
// that worked (on some file systems a write error shows only there).
class File {
 public:
  explicit File(int fd) : fd_(fd) {}
  ~File() {
    if (fd_ >= 0) ::close(fd_);
  }
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  int fd() const { return fd_; }
  bool close() { return ::close(std::exchange(fd_, -1)) == 0; }

 private:
  int fd_;
};

// Up to `max_bytes` bytes from the start of the regular file `path` (all of it when it is
// shorter), and its size in *size. This is the one way this chapter opens a file to read, and a
// path from the command line can name anything:
//  - only a regular file is read. stat() looks at the path before anything is opened, so a
//    device is never opened (/dev/zero would be read without end, and opening some devices
//    does something), nor a FIFO (opening one waits for a writer, maybe forever), nor a folder;
//  - it is then opened with O_NONBLOCK, so that not even a FIFO put under the name in between can
//    block the open, and fstat() checks that what was opened is still a regular file;
//  - no more than max_bytes is read: the caller knows how long the file may be (a checkpoint's
//    header says it), and a file of another size is refused on its size, not by reading it.
std::string read_regular_file(const std::string& path, const std::string& what, std::size_t max_bytes,
                              std::uint64_t* size) {
  struct stat st;
  auto refuse_unless_regular = [&] {
    if (!S_ISREG(st.st_mode))
      throw mgpu::Error(path + ": not a regular file but " + kind_of(st.st_mode) + ": it cannot be a " + what);
  };
  if (::stat(path.c_str(), &st) != 0) throw mgpu::Error(path + ": cannot open the " + what + ": " + errno_text());
  refuse_unless_regular();
  const File f(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  if (f.fd() < 0) throw mgpu::Error(path + ": cannot open the " + what + ": " + errno_text());
  if (::fstat(f.fd(), &st) != 0) throw mgpu::Error(path + ": cannot read the " + what + ": " + errno_text());
  refuse_unless_regular();
  *size = static_cast<std::uint64_t>(st.st_size);
  std::string bytes(static_cast<std::size_t>(std::min<std::uint64_t>(max_bytes, *size)), '\0');
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::read(f.fd(), bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw mgpu::Error(path + ": cannot read the " + what + ": " + errno_text());
    if (n == 0) break;  // the file shrank since fstat(): the caller sees fewer bytes than it expects
    done += static_cast<std::size_t>(n);
  }
  bytes.resize(done);
  return bytes;
}

// Refuses what write_file_atomically() must not replace, or cannot: a path in a folder that does
// not exist, or a path that exists and is not a regular file. rename() replaces whatever has the
// name: as root, a checkpoint "written" to /dev/full would turn the device into a file, and one
// written to a symbolic link would replace the link, not the file it points to.
void check_replaceable(const std::string& path, const std::string& what) {
  const std::string folder = folder_of(path);
  struct stat st;
  if (::stat(folder.c_str(), &st) != 0)
    throw mgpu::Error(path + ": the folder " + folder +
                      (errno == ENOENT ? std::string(" does not exist") : " cannot be looked at: " + errno_text()));
  if (!S_ISDIR(st.st_mode)) throw mgpu::Error(path + ": " + folder + " is not a folder");
  if (::lstat(path.c_str(), &st) == 0) {  // lstat: a symbolic link is looked at, not followed
    if (!S_ISREG(st.st_mode))
      throw mgpu::Error(path + ": not a regular file but " + kind_of(st.st_mode) + ": writing the " + what +
                        " would replace it with one; give the name of a file");
  } else if (errno != ENOENT) {
    throw mgpu::Error(path + ": cannot look at it: " + errno_text());
  }
}

// Creates `tmp` anew for writing. A stale one (a crash while writing) is removed first, and
// O_EXCL makes sure that what is opened is the file just created, never whatever (a link, say)
// had that name.
File create_new(const std::string& tmp, const std::string& what) {
  ::unlink(tmp.c_str());  // may fail (nothing there): the open below says whatever matters
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) throw mgpu::Error(tmp + ": cannot create the " + what + " (written there, then renamed): " + errno_text());
  return File(fd);
}

// Flushes the folder that holds `path` to the disk. A rename changes the folder, not the file,
// and survives a power loss only once the folder is on the disk too. (A file system that cannot
// flush a folder says EINVAL; there is nothing more to do on it, as PostgreSQL also concludes.)
void sync_folder(const std::string& path) {
  const std::string folder = folder_of(path);
  const File f(::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (f.fd() < 0 || (::fsync(f.fd()) != 0 && errno != EINVAL))
    throw mgpu::Error(path + ": written, but its folder " + folder + " cannot be flushed to the disk: " + errno_text());
}

// Writes `bytes` to `path` so that path holds, at every moment, either its previous content or
// all of the new one, and keeps it through a crash or a power loss:
//   1. path must be a regular file or not exist, in a folder that exists (check_replaceable);
//   2. the bytes go to a new path.tmp, which is flushed to the disk (fsync) and closed;
//   3. rename(path.tmp, path) replaces path in one step (POSIX);
//   4. the folder is flushed, which makes the rename itself durable.
// If 2 or 3 fails, path.tmp is removed: the previous file stays as it was, with nothing
// half-written beside it. Every error names the file and the fault.
void write_file_atomically(const std::string& path, const std::string& bytes, const std::string& what) {
  check_replaceable(path, what);
  // BEGIN EXERCISE ex05.atomic_write
  const std::string tmp = path + ".tmp";
  try {
    File f = create_new(tmp, what);
    std::size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = ::write(f.fd(), bytes.data() + done, bytes.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) throw mgpu::Error(tmp + ": cannot write the " + what + ": " + errno_text());
      done += static_cast<std::size_t>(n);
    }
    if (::fsync(f.fd()) != 0 || !f.close())
      throw mgpu::Error(tmp + ": cannot flush the " + what + " to the disk: " + errno_text());
    if (std::rename(tmp.c_str(), path.c_str()) != 0)
      throw mgpu::Error(path + ": cannot rename " + tmp + " to it: " + errno_text());
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  sync_folder(path);
  // END EXERCISE ex05.atomic_write
}

// The header's fields, checked, from `r` (which reads `bytes`, a whole file or its first
// kHeaderBytes). *file_bytes: how long the header says the whole file is.
Checkpoint read_header(Reader& r, const std::string& bytes, const std::string& path, std::int64_t expected_params,
                       std::size_t* file_bytes) {
  const std::size_t head = std::min(bytes.size(), sizeof kMagic);
  if (std::memcmp(bytes.data(), kMagic, head) != 0)
    throw mgpu::Error(path + ": not a checkpoint of this program (it does not start with \"MGPUCKPT\")");
  if (head < sizeof kMagic)
    throw mgpu::Error(path + ": truncated checkpoint: the file ends (" + std::to_string(bytes.size()) +
                      " bytes) inside the magic string");
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
  c.warmup_epochs = r.i32("warm-up epochs");
  const std::int64_t params = r.i64("parameter count");
  if (params != expected_params)
    throw mgpu::Error(path + ": the checkpoint holds " + std::to_string(params) + " parameters, this model has " +
                      std::to_string(expected_params));
  if (c.epochs_done < 0 || c.epochs_done > 1'000'000)
    throw mgpu::Error(path + ": corrupt checkpoint: " + std::to_string(c.epochs_done) + " epochs done");
  *file_bytes = kHeaderBytes + kRecordBytes * std::size_t(c.epochs_done) + 4 * std::size_t(params) + kCrcBytes;
  return c;
}

// The stored CRC-32 (the file's last 4 bytes, little-endian) of a whole checkpoint in `bytes`.
std::uint32_t stored_crc(const std::string& bytes) {
  std::uint32_t stored = 0;
  for (std::size_t i = 0; i < kCrcBytes; ++i)
    stored |= std::uint32_t(static_cast<unsigned char>(bytes[bytes.size() - kCrcBytes + i])) << (8 * i);
  return stored;
}

// The refusal of a file whose size is not what its header says. A cut file and a whole file with
// a damaged epoch count look alike from the size alone, so the other explanation is tried: if the
// size is that of a checkpoint of e epochs and, with e put back into the header, the stored
// CRC-32 matches the file, the header was damaged (a flipped bit) and the message says so. Only
// a file no larger than a checkpoint of kMaxDiagnosedEpochs epochs is read for that (of
// LeNet's: 0.9 MB): a file of any other size is refused on the header alone.
constexpr std::uint64_t kMaxDiagnosedEpochs = 10'000;
std::string size_refusal(const std::string& path, std::uint64_t size, int header_epochs, std::size_t expected_size,
                         std::int64_t params) {
  const std::size_t fixed = kHeaderBytes + 4 * std::size_t(params) + kCrcBytes;  // all but the epoch records
  if (size >= fixed && (size - fixed) % kRecordBytes == 0 && (size - fixed) / kRecordBytes <= kMaxDiagnosedEpochs) {
    std::uint64_t now = 0;
    std::string bytes = read_regular_file(path, "checkpoint", static_cast<std::size_t>(size), &now);
    const auto epochs = static_cast<std::uint32_t>((size - fixed) / kRecordBytes);
    if (bytes.size() == size) {
      for (int i = 0; i < 4; ++i) bytes[sizeof kMagic + 4 + i] = static_cast<char>((epochs >> (8 * i)) & 0xff);
      if (crc32_of(bytes, bytes.size() - kCrcBytes) == stored_crc(bytes))
        return path + ": corrupt checkpoint: its header says " + std::to_string(header_epochs) +
               " epochs done, but the file holds " + std::to_string(epochs) +
               " epochs' records, which its CRC-32 confirms: the header is damaged";
    }
  }
  const std::string sizes = std::to_string(size) + " bytes, where its header (epochs done: " +
                            std::to_string(header_epochs) + ", parameters: " + std::to_string(params) + ") says " +
                            std::to_string(expected_size);
  return path + (size < expected_size ? ": truncated checkpoint: " : ": corrupt checkpoint: ") + sizes;
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
  w.i32(c.warmup_epochs);
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
  write_file_atomically(path, encode_checkpoint(c), "checkpoint");
}

namespace {
// FILE.lock, once FILE is known to be a checkpoint this program may replace: a missing folder,
// say, is named as such, not as a lock fault.
std::string checkpoint_lock_path(const std::string& path) {
  check_replaceable(path, "checkpoint");
  return path + ".lock";
}
}  // namespace

CheckpointLock::CheckpointLock(const std::string& path)
    : mgpu::RunLock(checkpoint_lock_path(path), [&path](const std::string&) {
        return path + ": another run is using this checkpoint now (it holds " + path +
               ".lock): give each run its own --checkpoint";
      }) {}

void check_checkpoint_target(const std::string& path) {
  check_replaceable(path, "checkpoint");
  // Create and remove path.tmp: only trying shows that the folder takes a new file (its
  // permissions, a read-only file system); access() would say yes to root.
  create_new(path + ".tmp", "checkpoint");
  ::unlink((path + ".tmp").c_str());
}

Checkpoint read_checkpoint(const std::string& path, std::int64_t expected_params) {
  // First the header alone, which says how long the file must be: a file of another size is
  // refused on its size, before the rest of it is read.
  std::uint64_t size = 0;
  const std::string head = read_regular_file(path, "checkpoint", kHeaderBytes, &size);
  std::size_t expected_size = 0;
  Reader header(head, path);
  const Checkpoint described = read_header(header, head, path, expected_params, &expected_size);
  if (size != expected_size)
    throw mgpu::Error(size_refusal(path, size, described.epochs_done, expected_size, expected_params));

  // Then the whole file, and no more than the header said; its header is read again from these
  // bytes, so that a file replaced in between cannot mix two checkpoints.
  const std::string bytes = read_regular_file(path, "checkpoint", expected_size, &size);
  Reader r(bytes, path);
  Checkpoint c = read_header(r, bytes, path, expected_params, &expected_size);
  if (size != expected_size || bytes.size() != expected_size)
    throw mgpu::Error(path + ": the checkpoint changed while it was being read (it now has " + std::to_string(size) +
                      " bytes); read it again when nothing writes it");
  const std::uint32_t stored = stored_crc(bytes);
  if (const std::uint32_t computed = crc32_of(bytes, expected_size - kCrcBytes); computed != stored) {
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
  c.params.resize(static_cast<std::size_t>(expected_params));
  for (float& p : c.params) p = r.f32("parameters");
  return c;
}

}  // namespace mp
