#include "report.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <sstream>

#include "backend.h"
#include "check.h"
#include "timer.h"  // steady_seconds

namespace mgpu {
namespace fs = std::filesystem;

void prepare_output_folder(const std::string& out) {
  std::error_code ec;
  fs::create_directories(out, ec);
  if (ec) throw Error("--out " + out + ": cannot create the folder: " + ec.message());
  if (!fs::is_directory(out, ec)) throw Error("--out " + out + ": not a folder");
  // Permissions alone do not say it (root, read-only mounts, full disks): try it.
  const fs::path probe = fs::path(out) / (".write_test_" + std::to_string(getpid()));
  std::ofstream f(probe);
  f << "x";
  f.close();
  const bool written = static_cast<bool>(f);
  fs::remove(probe, ec);
  if (!written) throw Error("--out " + out + ": cannot write files there");
}

namespace {

// write_whole_file's failure: the temporary goes, `path` stays as it was.
[[noreturn]] void write_failed(const std::string& path, const std::string& tmp, const char* doing, int error) {
  std::remove(tmp.c_str());
  throw Error(path + ": cannot be written (" + doing + " " + tmp + ": " + std::strerror(error) + ")");
}

}  // namespace

void write_whole_file(const std::string& path, const std::string& bytes) {
  const std::string tmp = path + "." + std::to_string(getpid()) + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) write_failed(path, tmp, "creating", errno);
  const bool written = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size() && std::fflush(f) == 0;
  const int write_error = errno;
  // fclose reports what the system could not store until then (a full disk often shows only here).
  const bool closed = std::fclose(f) == 0;
  if (!written) write_failed(path, tmp, "writing", write_error);
  if (!closed) write_failed(path, tmp, "closing", errno);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) write_failed(path, tmp, "renaming it to the file", errno);
}

TrainingLog::TrainingLog(std::string chapter, std::string run, const Options& options, int devices,
                         int train_examples)
    : chapter_(std::move(chapter)), run_(std::move(run)), options_(options), devices_(devices),
      train_examples_(train_examples) {
  prepare_output_folder(options_.out);
}

namespace {

// How progress is shown: a live line redrawn on a terminal, plain lines in a log, or nothing.
// "auto" draws the live line only on a real terminal, and never under an MPI launcher or SLURM:
// mpirun gives every rank a pseudo-terminal as its stdout even when the run's output goes to a
// file, and a log would fill with carriage returns and erase codes.
enum class ProgressStyle { Live, Lines, Off };
ProgressStyle progress_style(Options::Progress p) {
  if (p != Options::Progress::Auto) return p == Options::Progress::On ? ProgressStyle::Live : ProgressStyle::Off;
  static const bool terminal = isatty(fileno(stdout)) && !std::getenv("OMPI_COMM_WORLD_SIZE") &&
                               !std::getenv("PMI_RANK") && !std::getenv("PMIX_RANK") && !std::getenv("SLURM_PROCID");
  return terminal ? ProgressStyle::Live : ProgressStyle::Lines;
}

}  // namespace

void TrainingLog::progress(int epoch, int batch, int batches) {
  const ProgressStyle style = progress_style(options_.progress);
  if (style == ProgressStyle::Off) return;
  const double now = steady_seconds();
  const bool first = epoch != progress_epoch_;  // the epoch's first report: its clock starts
  if (first) {
    progress_epoch_ = epoch;
    last_shown_s_ = now;
  }
  // A live line is drawn at once and redrawn at most 5 times a second; a plain line every
  // --print-every batches, or about every 10 s.
  const bool last = batch + 1 == batches;
  const bool due = style == ProgressStyle::Live ? first || now - last_shown_s_ >= 0.2 || last
                   : options_.print_every > 0   ? (batch + 1) % options_.print_every == 0
                                                : now - last_shown_s_ >= 10;
  if (!due) return;
  last_shown_s_ = now;
  // "batch k": k batches queued. The rate is the last epoch's, measured with the devices
  // synchronized (none in the first). The host's own clock would not do: a batch's call returns
  // once its work is queued, and the host runs ahead of the devices by as many batches as their
  // queues hold (on a GPU, most of a LeNet epoch).
  char line[192];
  const int n =
      std::snprintf(line, sizeof line, "  epoch %d/%d  batch %d/%d", epoch, options_.epochs, batch + 1, batches);
  if (!records_.empty() && records_.back().seconds > 0) {
    const double epoch_s = records_.back().seconds;
    std::snprintf(line + n, sizeof line - n, "  %.0f images/s (last epoch)  ETA %.1f s", train_examples_ / epoch_s,
                  epoch_s * (batches - 1 - batch) / batches);
  }
  if (style == ProgressStyle::Live) {
    std::printf("\r\33[2K%s", line);  // back to the line's start, erase it, draw it anew
    line_drawn_ = true;
  } else {
    std::printf("%s\n", line);
  }
  std::fflush(stdout);
}

void TrainingLog::end_epoch(const EpochRecord& r) {
  records_.push_back(r);
  const char* erase_progress_line = line_drawn_ ? "\r\33[2K" : "";
  line_drawn_ = false;
  std::printf("%sepoch %2d/%d  loss %.4f  train_acc %.4f  test_acc %.4f  sec %.2f\n", erase_progress_line, r.epoch,
              options_.epochs, r.train_loss, r.train_acc, r.test_acc, r.seconds);
  std::fflush(stdout);
  if (!std::isfinite(r.train_loss)) {
    char lr[32];
    std::snprintf(lr, sizeof lr, "%g", options_.lr);
    throw Error("training diverged in epoch " + std::to_string(r.epoch) + ": the training loss is " +
                (std::isnan(r.train_loss) ? "NaN" : "infinite") + "; try a smaller --lr than " + lr);
  }
}

double TrainingLog::seconds_per_epoch() const {
  if (records_.empty()) return 0;
  // The first epoch also pays for one-time set-up (on a GPU: loading the kernels, cuBLAS's and
  // NCCL's initialisation; on a CPU: first touches of memory). With more epochs it is left out.
  const std::size_t first = timed_from();
  double total = 0;
  for (std::size_t i = first; i < records_.size(); ++i) total += records_[i].seconds;
  return total / static_cast<double>(records_.size() - first);
}

std::size_t TrainingLog::timed_from() const { return records_.size() > 1 ? 1 : 0; }

std::string TrainingLog::timing_note() const {
  if (records_.size() < 2) return "sec_per_epoch is the only epoch's time (it includes one-time set-up)";
  const std::string averaged = records_.size() == 2 ? "epoch " + std::to_string(records_[1].epoch) + "'s time"
                                                    : "the mean of epochs " + std::to_string(records_[1].epoch) +
                                                          "-" + std::to_string(records_.back().epoch);
  char first[128];
  std::snprintf(first, sizeof first, "epoch %d took %.3f s, one-time set-up included", records_[0].epoch,
                records_[0].seconds);
  return "sec_per_epoch is " + averaged + "; " + first;
}

std::string TrainingLog::result_line() const {
  const double sec = seconds_per_epoch();
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "result: chapter=%s backend=%s devices=%d epochs=%d batch=%d lr=%g test_acc=%.4f "
                "sec_per_epoch=%.3f samples_per_sec=%.0f first_epoch_sec=%.3f",
                chapter_.c_str(), kBackendName, devices_, options_.epochs, options_.batch_size, options_.lr,
                records_.empty() ? 0.0 : records_.back().test_acc, sec, sec > 0 ? train_examples_ / sec : 0.0,
                records_.empty() ? 0.0 : records_.front().seconds);
  return buf;
}

std::string TrainingLog::csv_path() const { return (fs::path(options_.out) / (run_ + ".csv")).string(); }

void TrainingLog::finish() const {
  prepare_output_folder(options_.out);  // again: it may have gone while the run trained
  // in_sec_per_epoch: 0 for the first epoch (one-time set-up included, left out of the mean
  // when there are more epochs), 1 for those the result line's sec_per_epoch averages.
  std::ostringstream csv;
  csv << "epoch,train_loss,train_acc,test_acc,seconds,in_sec_per_epoch\n";
  for (std::size_t i = 0; i < records_.size(); ++i) {
    const EpochRecord& r = records_[i];
    csv << r.epoch << ',' << r.train_loss << ',' << r.train_acc << ',' << r.test_acc << ',' << r.seconds << ','
        << (i >= timed_from() ? 1 : 0) << '\n';
  }
  write_whole_file(csv_path(), csv.str());
  std::printf("wrote %s\n", csv_path().c_str());
  const std::string png = (fs::path(options_.out) / (run_ + ".png")).string();
  char title[256];
  std::snprintf(title, sizeof title, "%s: %s backend, %d device(s), batch %d, lr %g", run_.c_str(), kBackendName,
                devices_, options_.batch_size, options_.lr);
  if (plot_runs(png, title, {{run_, csv_path()}})) std::printf("wrote %s\n", png.c_str());
  std::printf("%s\n%s\n", timing_note().c_str(), result_line().c_str());
  std::fflush(stdout);
}

std::string gnuplot_file(const std::string& file, const std::string& png_path) {
  const fs::path folder = fs::path(png_path).parent_path(), path(file);
  if (path.parent_path() != folder)
    throw Error("gnuplot_file: " + file + " is not in the plot's folder " + folder.string());
  const std::string name = path.filename().string();
  for (const char c : name)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-' && c != '.')
      throw Error("gnuplot_file: '" + name + "' is not a plain file name");
  return "'" + name + "'";
}

namespace {

// Runs `gnuplot <script>` in `folder`: fork, change to the folder, exec. No shell is involved,
// so nothing in the folder's name is ever interpreted. Returns gnuplot's exit status, or 127
// when it could not be started (not installed).
int run_gnuplot_in(const fs::path& folder, const std::string& script) {
  std::fflush(stdout);  // the child must not print what the parent has buffered
  std::fflush(stderr);
  const pid_t child = fork();
  if (child < 0) throw Error(std::string("cannot start gnuplot: fork: ") + std::strerror(errno));
  if (child == 0) {  // only async-signal-safe calls from here to exec
    const std::string where = folder.empty() ? "." : folder.string();
    if (chdir(where.c_str()) != 0) _exit(126);
    execlp("gnuplot", "gnuplot", script.c_str(), static_cast<char*>(nullptr));
    _exit(127);  // exec failed: gnuplot is not on the PATH
  }
  int status = 0;
  while (waitpid(child, &status, 0) < 0)
    if (errno != EINTR) throw Error(std::string("waiting for gnuplot: ") + std::strerror(errno));
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace

bool run_gnuplot(const std::string& png_path, const std::string& commands) {
  // The script is kept beside the picture, so a reader can restyle and re-run it (from there).
  const fs::path script_path = fs::path(png_path).replace_extension(".gp");
  write_whole_file(script_path.string(),
                   "# cd to this folder, then: gnuplot " + script_path.filename().string() + "\n" +
                       "set terminal pngcairo size 1000,400 font 'sans,10' noenhanced  # '_' is not a subscript\n" +
                       "set output " + gnuplot_file(png_path, png_path) + "\n" + "set datafile separator ','\n" +
                       commands);
  const int status = run_gnuplot_in(script_path.parent_path(), script_path.filename().string());
  if (status == 127) {
    std::fprintf(stderr, "warning: gnuplot not found (apt-get install gnuplot-nox): no plot, the CSV has the numbers\n");
    return false;
  }
  if (status != 0) {
    std::fprintf(stderr, "warning: gnuplot failed (exit status %d) on %s: no plot, the CSV has the numbers\n", status,
                 script_path.string().c_str());
    return false;
  }
  return true;
}

bool plot_runs(const std::string& png_path, const std::string& title,
               const std::vector<std::pair<std::string, std::string>>& runs) {
  std::ostringstream gp;
  gp << "set key autotitle columnhead bottom right\n"
     << "set grid\n"
     << "set xrange [0:*]\n"
     << "set multiplot layout 1,2 title '" << title << "'\n";
  // Test accuracy (column 4) per epoch, one line per run.
  gp << "set xlabel 'epoch'\nset ylabel 'test accuracy'\nset yrange [0:1]\nplot ";
  for (std::size_t i = 0; i < runs.size(); ++i)
    gp << (i ? ", " : "") << gnuplot_file(runs[i].second, png_path) << " using 1:4 with linespoints lc " << i + 1
       << " title '" << runs[i].first << "'";
  gp << "\n";
  // Time per epoch: the epochs that sec_per_epoch averages (column 6, in_sec_per_epoch, is 1) as
  // a line; the first epoch, which also pays one-time set-up, as an open circle of the same colour.
  gp << "set xlabel 'epoch'\nset ylabel \"seconds per epoch\\n(open circle: one-time set-up included)\"\n"
     << "set yrange [0:*]\nplot ";
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const std::string file = gnuplot_file(runs[i].second, png_path);
    gp << (i ? ", " : "") << file << " using 1:($6 == 1 ? $5 : 1/0) with linespoints lc " << i + 1 << " title '"
       << runs[i].first << "', " << file << " using 1:($6 == 1 ? 1/0 : $5) with points pt 6 ps 1.5 lc " << i + 1
       << " notitle";
  }
  gp << "\nunset multiplot\n";
  return run_gnuplot(png_path, gp.str());
}

}  // namespace mgpu
