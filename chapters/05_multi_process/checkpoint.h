// Checkpoints: what a run needs to continue after it stops, on any number of processes.
//
// The state of this training run is small: the parameters (there is no optimizer state: plain
// SGD), how many epochs are done, and the random state. The random state is the seed alone,
// because every epoch's batch order is drawn afresh from (seed, epoch) (common/batches.h). The
// file also records the recipe (batch size, learning rate, warm-up epochs, training-set size) so
// that a resumed run can refuse to continue with another one, and the finished epochs' records, so that the
// resumed run's CSV and plot hold the whole curve.
//
// The file, every number little-endian whatever the machine:
//
//   bytes  field
//   8      magic "MGPUCKPT"
//   4      u32  format version (2; version 1 had no warm-up field)
//   4      i32  epochs done (E)
//   8      u64  seed
//   4      i32  batch size
//   4      f32  learning rate
//   4      i32  training examples
//   4      i32  warm-up epochs (--warmup-epochs: the learning rate's ramp)
//   8      i64  parameter count (P = 129,068 for LeNet)
//   36 E   per finished epoch: i32 epoch, f64 train loss, f64 train acc, f64 test acc, f64 seconds
//   4 P    f32  the parameters, in the Flat layout's order (W1 b1 W2 b2 W3 b3 W4 b4)
//   4      u32  CRC-32 (zlib's) of every byte before it
//
// write_checkpoint() writes FILE.tmp, flushes it to the disk, renames it to FILE and flushes the
// folder, so a crash while writing leaves the previous checkpoint intact (rename() replaces a
// file in one step, POSIX) and a checkpoint written survives a power loss. It replaces only a
// regular file: FILE must not be a folder, a device, a FIFO or a symbolic link. read_checkpoint()
// reads only a regular file, and no more bytes than its header says the file has.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "common/report.h"

namespace mp {

inline constexpr std::uint32_t kCheckpointVersion = 2;

struct Checkpoint {
  int epochs_done = 0;
  std::uint64_t seed = 0;
  int batch_size = 0;
  float lr = 0;
  int train_examples = 0;
  int warmup_epochs = 0;
  std::vector<mgpu::EpochRecord> history;  // one per finished epoch, epochs 1..epochs_done
  std::vector<float> params;               // the flat parameters
};

// Writes `c` to path.tmp, flushes it to the disk, renames it to path and flushes the folder.
// Throws mgpu::Error naming the file when anything fails, and then leaves no path.tmp behind.
void write_checkpoint(const std::string& path, const Checkpoint& c);

// Refuses, before any training, a checkpoint that write_checkpoint() could not write: path
// exists and is not a regular file, its folder does not exist, or no file can be created in it.
// Throws mgpu::Error naming the file and the fault.
void check_checkpoint_target(const std::string& path);

// One run at a time per checkpoint. Two runs given the same --checkpoint would overwrite each
// other's file every epoch, or collide on FILE.tmp; the run that writes a checkpoint holds this
// lock from its start to its end: common/report.h's RunLock on FILE.lock, which the system
// releases when the process ends, however it ends (the small FILE.lock stays). A second run is
// refused at its start, naming the file. Take it before check_checkpoint_target(), which tries
// FILE.tmp.
class CheckpointLock : public mgpu::RunLock {
 public:
  // Throws mgpu::Error if another run holds it, or if `path` could not be written at all (as
  // check_checkpoint_target() says).
  explicit CheckpointLock(const std::string& path);
};

// Reads and checks a checkpoint of a model with `expected_params` parameters. A missing,
// truncated, corrupt (checksum) or foreign file, one of another format version or model, or a
// path that is not a regular file (a folder, /dev/zero, a FIFO) throws mgpu::Error naming the
// file and what is wrong with it.
Checkpoint read_checkpoint(const std::string& path, std::int64_t expected_params);

// The bytes write_checkpoint() puts in the file (for the tests, which damage them).
std::string encode_checkpoint(const Checkpoint& c);

}  // namespace mp
