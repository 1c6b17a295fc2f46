// What a training run shows and leaves behind:
//   - while an epoch runs, its progress: on a terminal a live line that redraws itself
//       epoch 3/10  batch 120/235  5123 images/s (last epoch)  ETA 2.3 s
//     and in a log (a file, a pipe, mpirun's or a scheduler's) the same as a plain line about
//     every 10 s, or every --print-every N batches (the rate is the last epoch's: none in the
//     first; the time left the longer of the last epoch's and this epoch's so far),
//   - one line per epoch:  epoch  3/10  loss 0.5123  train_acc 0.8012  test_acc 0.7950  sec 3.91
//   - in --out (default results/), files named after the run (run_name below: 01_lenet for d2l's
//     defaults, 01_lenet_epochs-5_batch-size-64 for a run with other settings, or --run-name):
//       <run>.csv   one row per epoch, each appended and flushed when its epoch ends, so that a
//                   run stopped part-way leaves the epochs it finished,
//       <run>.json  the settings, the epochs so far, the machine and the commit, rewritten whole
//                   after every epoch; at the end also the result line's fields,
//       <run>.png   the curves (gnuplot, when installed), drawn at the end,
//   - the final machine-readable line:
//     result: chapter=01_lenet backend=cpu devices=1 epochs=10 batch=256 lr=0.2 test_acc=0.8312 ...
//     whose sec_per_epoch leaves out the first epoch (one-time set-up) when there are more; the
//     line before it says so, and first_epoch_sec gives the first epoch's time; peak_mib is the
//     most device memory the run's buffers held at once on one device (MiB).
#pragma once
#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cli.h"

namespace mgpu {

// ---- A run's settings and its name ----------------------------------------------------------

// One setting of a run, as its command line spells it: the flag without its dashes ("epochs",
// "batch-size", "graph"), its value and the chapter's default, as text ("5", "256", "on").
// `in_name`: whether it can change what the run computes or measures, and so is part of the
// name; where files are read and written (--out, --data-dir) and how progress is shown are not.
struct Setting {
  std::string flag, value, default_value;
  bool in_name = true;
};
using RunSettings = std::vector<Setting>;

// The settings of the flags every chapter shares, in the order --help lists them, against this
// chapter's defaults. A chapter appends its own flags' settings to them.
RunSettings shared_settings(const Options& o, const ChapterInfo& chapter);

// The name of a run's files. `given` (--run-name) when not empty; otherwise the chapter's name,
// then "_<flag>-<value>" for each setting in the name whose value is not its default, in the
// settings' order (a character other than a letter, digit, '.' or '-' becomes 'x': 0:3 -> 0x3):
//   01_lenet                                          d2l's defaults
//   01_lenet_epochs-5_batch-size-64_limit-train-10000 --epochs 5 --limit-train 10000 --batch-size 64
// The same settings give the same name whatever their order on the command line. A program that
// trains several runs adds what tells them apart: 02_data_parallel_k1 and 02_data_parallel_k2.
std::string run_name(const std::string& chapter, const std::string& given, const RunSettings& settings);

// Before a run writes <out>/<run>.csv, .json and .png, the files an earlier run left under that
// name: none, or files of a run with the same settings (those in the name; its JSON says), which
// are replaced after a line saying so, or files of another run, which are never replaced: that
// throws mgpu::Error saying which settings differ and what to do (another --run-name, or move
// them away). A CSV or plot without a JSON that says its settings counts as another run's. A
// setting the earlier JSON lacks (a flag added since) counts as the same when it is at its
// default here.
void claim_run_files(const std::string& out, const std::string& run, const RunSettings& settings);
// Throws mgpu::Error unless `run` is at most kMaxRunName characters (claim_run_files checks it too).
void check_run_name_length(const std::string& run);

// The commit the program was built from, `git describe --always --dirty` ("2cb88c7-dirty": with
// changes not committed), read again at every build (cmake/Commit.cmake); "unknown" where the
// source is not a git checkout. It goes into every run's JSON, beside what the program can see
// of the machine: the backend, the GPUs by name, the CPU model and cores, the compiler.
std::string build_commit();

// ---- The training log ------------------------------------------------------------------------

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

// One run at a time per file. A run holds an flock on a lock file from its start to its end (the
// system releases it when the process ends, however it ends), with its process id written
// inside, so that a second run is refused at its start, naming the first, instead of both
// writing the same files. The holder removes the file when it lets go (one killed leaves it, for
// the next run to take over); a run whose lock turns out to be on a file removed or replaced
// meanwhile (it opened the file just before its holder removed it) takes it again, on the file
// now there, so that two runs never hold locks on two files of one name. TrainingLog holds one on <out>/<run>.lock for the
// run's results (else two runs of one name would append rows to one CSV); chapter 05's
// CheckpointLock, one on its checkpoint's FILE.lock.
class RunLock {
 public:
  RunLock() = default;  // holds nothing
  // Takes the lock on lock_path (creating the file). If another process holds it, throws
  // mgpu::Error(held(pid)), pid the holder's process id as it wrote it ("" if none); any other
  // failure throws mgpu::Error naming lock_path.
  RunLock(const std::string& lock_path, const std::function<std::string(const std::string& pid)>& held);
  ~RunLock();
  RunLock(RunLock&& other) noexcept;
  RunLock& operator=(RunLock&& other) noexcept;
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;

 private:
  void release();  // removes the file, then closes it (which lets go of the lock)
  int fd_ = -1;
  std::string path_;
};

class TrainingLog {
 public:
  // `run` names the files ("01_lenet", "02_data_parallel_k2": run_name); `chapter` goes on the
  // result line; `settings` go into the JSON and decide whether earlier files of that name may
  // be replaced. At once, before any training: checks that options.out can be written
  // (prepare_output_folder), takes the run's RunLock (<out>/<run>.lock), claims the run's files
  // (claim_run_files), and writes the CSV's header and the JSON's settings.
  TrainingLog(std::string chapter, std::string run, const Options& options, RunSettings settings, int devices,
              int train_examples);

  // Batch `batch` (0-based) of `batches` of epoch `epoch` (1-based) is done: shows the progress
  // as options.progress and options.print_every say. Call it after every batch; it prints
  // only now and then, and costs a clock reading otherwise.
  void progress(int epoch, int batch, int batches);
  // Whether progress() shows anything (--progress off, or auto on a rank that does not draw:
  // no), so that a caller spends nothing on counting batches for it otherwise.
  bool shows_progress() const;
  // Prints the epoch line, appends the epoch's row to the CSV (flushed, and checked: a row that
  // cannot be written throws mgpu::Error naming the file) and rewrites the JSON. A training loss
  // that is not finite (the run diverged: lower --lr) throws mgpu::Error after the line and the
  // row are written: nothing after it would mean anything.
  void end_epoch(const EpochRecord& record);

  // The most device memory the run's buffers held at once on one device (mgpu::peak_device_bytes,
  // counted from the start of training: the epoch loop tells it). On the result line as peak_mib;
  // "none" there if nothing told it.
  void set_peak_device_bytes(std::size_t bytes) { peak_device_bytes_ = bytes; }

  const std::vector<EpochRecord>& records() const { return records_; }
  double seconds_per_epoch() const;  // mean over the epochs after the first (over the one, if alone)
  std::string timing_note() const;   // which epochs seconds_per_epoch() averages
  std::string result_line() const;   // starts with "result: "

  // The result line's fields, in its order: ("chapter", "01_lenet"), ..., ("first_epoch_sec", "4.000"),
  // ("peak_mib", "12.3").
  std::vector<std::pair<std::string, std::string>> result_fields() const;

  // Draws <out>/<run>.png, writes the JSON with the result, prints which files the run left,
  // then the result line.
  void finish() const;
  std::string csv_path() const;   // <out>/<run>.csv
  std::string json_path() const;  // <out>/<run>.json
  const std::string& run() const { return run_; }
  int devices() const { return devices_; }

 private:
  std::string chapter_, run_;
  Options options_;
  RunLock lock_;  // <out>/<run>.lock, held for the run's whole life
  RunSettings settings_;
  int devices_, train_examples_;
  std::string started_;  // when the run began, UTC, ISO 8601
  std::vector<EpochRecord> records_;
  std::optional<std::size_t> peak_device_bytes_;  // set_peak_device_bytes
  std::size_t timed_from() const;  // the first record seconds_per_epoch() counts
  bool in_sec_per_epoch(std::size_t i) const;  // whether records_[i] is one seconds_per_epoch() averages
  void write_json(bool finished) const;  // <run>.json, whole
  // The progress of the epoch running: which epoch, and when its progress was last shown.
  int progress_epoch_ = 0;
  double last_shown_s_ = 0;
  int last_shown_batch_ = -1;  // the batch last shown (0-based): --print-every counts from it
  double epoch_started_s_ = 0;  // when the progress epoch's first report came
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

// Any text as a gnuplot string literal: single-quoted, quotes doubled, control characters (a new
// line) made spaces, so that no text can end the string or the command ('a\nb' -> 'a b').
// Every title and label a program writes into a gnuplot script goes through it.
std::string gnuplot_text(const std::string& text);
// Whether `text` holds a control character (a new line, a tab, an escape): text a picture's
// title cannot show, and gnuplot_text turns into spaces (plot_runs refuses it instead).
bool has_control_character(const std::string& text);

// `file`, which must lie in png_path's folder, as a quoted gnuplot string of its plain name:
// 'run_k2.csv'. Throws for a file elsewhere or a name that is not letters, digits, '_', '-', '.'
// (the programs make these names; anything else is a bug, not a user's input).
std::string gnuplot_file(const std::string& file, const std::string& png_path);

}  // namespace mgpu
