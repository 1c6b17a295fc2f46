// What a training run shows and leaves behind:
//   - while an epoch runs, its progress: on a terminal a live line that redraws itself
//       epoch 3/10  batch 120/235  5123 images/s (last epoch)  ETA 2.3 s
//     and in a log (a file, a pipe, mpirun's or a scheduler's) the same as a plain line about
//     every 10 s, or every --print-every N batches (the rate is the last epoch's: none in the
//     first),
//   - one line per epoch:  epoch  3/10  loss 0.5123  train_acc 0.8012  test_acc 0.7950  sec 3.91
//   - results/<run>.csv, one row per epoch, and results/<run>.png (gnuplot, when installed),
//   - the final machine-readable line:
//     result: chapter=01_lenet backend=cpu devices=1 epochs=10 batch=256 lr=0.2 test_acc=0.8312 ...
//     whose sec_per_epoch leaves out the first epoch (one-time set-up) when there are more; the
//     line before it says so, and first_epoch_sec gives the first epoch's time.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "cli.h"

namespace mgpu {

struct EpochRecord {
  int epoch = 0;            // 1-based
  double train_loss = 0;    // mean over the epoch's examples
  double train_acc = 0;
  double test_acc = 0;
  double seconds = 0;       // the training loop only, devices synchronized
};

// Makes the folder `out` (and its parents) if needed and proves it writable by creating and
// removing a file in it, so that a bad --out is refused in a second, not after the training.
// Throws mgpu::Error naming the folder and the reason.
void prepare_output_folder(const std::string& out);

// Writes `bytes` to `path` so that a reader finds either the file as it was or the whole new one,
// never a part: into a temporary beside it (`<path>.<pid>.tmp`, unique to this process, so two
// runs never share one), whose write and close are checked, then renamed over `path` in one
// step. A failure (a full disk, a folder that went away) throws mgpu::Error naming the file and
// the system's reason, removes the temporary and leaves `path` untouched. Every results file
// (CSVs, plot scripts, dumps) is written this way.
void write_whole_file(const std::string& path, const std::string& bytes);

class TrainingLog {
 public:
  // `run` names the files ("01_lenet", "02_data_parallel_k2"); `chapter` goes on the result line.
  // Checks at once that options.out can be written (prepare_output_folder).
  TrainingLog(std::string chapter, std::string run, const Options& options, int devices, int train_examples);

  // Batch `batch` (0-based) of `batches` of epoch `epoch` (1-based) is done: shows the progress
  // as options.progress and options.print_every say. Call it after every batch; it prints
  // only now and then, and costs a clock reading otherwise.
  void progress(int epoch, int batch, int batches);
  // Prints the epoch line. A training loss that is not finite (the run diverged: lower --lr)
  // throws mgpu::Error after the line is printed: nothing after it would mean anything.
  void end_epoch(const EpochRecord& record);

  const std::vector<EpochRecord>& records() const { return records_; }
  double seconds_per_epoch() const;  // mean over the epochs after the first (over the one, if alone)
  std::string timing_note() const;   // which epochs seconds_per_epoch() averages
  std::string result_line() const;   // starts with "result: "

  // Writes <out>/<run>.csv and <out>/<run>.png, prints where, then the result line.
  void finish() const;
  std::string csv_path() const;

 private:
  std::string chapter_, run_;
  Options options_;
  int devices_, train_examples_;
  std::vector<EpochRecord> records_;
  std::size_t timed_from() const;  // the first record seconds_per_epoch() counts
  // The progress of the epoch running: which epoch, and when its progress was last shown.
  int progress_epoch_ = 0;
  double last_shown_s_ = 0;
  bool line_drawn_ = false;  // a live line is on the terminal, to be erased before the next line
};

// Plots test accuracy and seconds per epoch of one or more runs (label, csv path) into
// png_path with gnuplot. The CSVs must be in png_path's folder. Returns false, after a warning
// on stderr, when gnuplot is not installed or fails: the CSVs still hold the numbers.
bool plot_runs(const std::string& png_path, const std::string& title,
               const std::vector<std::pair<std::string, std::string>>& runs);

// Writes png_path's gnuplot script (<png>.gp: a 1000x400 PNG terminal, comma-separated data,
// then `commands`) and runs gnuplot on it, in png_path's folder and without a shell. Returns
// false, after a warning on stderr, when gnuplot is not installed or fails.
//
// No path the user typed ever appears in a gnuplot script or a shell command: a quote in it
// would end gnuplot's string (and a backquote run a command), a leading '-' would read as an
// option. So gnuplot runs in the folder, and `commands` name files with gnuplot_file().
bool run_gnuplot(const std::string& png_path, const std::string& commands);

// `file`, which must lie in png_path's folder, as a quoted gnuplot string of its plain name:
// 'run_k2.csv'. Throws for a file elsewhere or a name that is not letters, digits, '_', '-', '.'
// (the programs make these names; anything else is a bug, not a user's input).
std::string gnuplot_file(const std::string& file, const std::string& png_path);

}  // namespace mgpu
