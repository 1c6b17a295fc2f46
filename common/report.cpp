#include "report.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>
#include <thread>

#include "backend.h"
#include "check.h"
#include "device.h"  // gpu_names
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

// ---- A run's settings and its name ----------------------------------------------------------

namespace {

std::string real_text(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", x);
  return buf;
}

std::string progress_text(Options::Progress p) {
  return p == Options::Progress::On ? "on" : p == Options::Progress::Off ? "off" : "auto";
}

}  // namespace

RunSettings shared_settings(const Options& o, const ChapterInfo& chapter) {
  const Options d = default_options(chapter);
  RunSettings s = {
      {"epochs", std::to_string(o.epochs), std::to_string(d.epochs)},
      {"batch-size", std::to_string(o.batch_size), std::to_string(d.batch_size)},
      {"lr", real_text(o.lr), real_text(d.lr)},
      {"devices", std::to_string(o.devices), std::to_string(d.devices)},
      {"data-dir", o.data_dir, d.data_dir, false},
      {"limit-train", std::to_string(o.limit_train), std::to_string(d.limit_train)},
      {"warmup-epochs", std::to_string(o.warmup_epochs), std::to_string(d.warmup_epochs)},
      {"seed", std::to_string(o.seed), std::to_string(d.seed)},
      {"out", o.out, d.out, false},
      {"run-name", o.run_name, d.run_name, false},
      {"progress", progress_text(o.progress), progress_text(d.progress), false},
      {"print-every", std::to_string(o.print_every), std::to_string(d.print_every), false},
  };
  if (chapter.max_devices > 1 && chapter.eval_flag)
    s.push_back({"eval", o.eval_all_devices ? "all" : "device0", d.eval_all_devices ? "all" : "device0"});
  return s;
}

std::string run_name(const std::string& chapter, const std::string& given, const RunSettings& settings) {
  if (!given.empty()) return given;
  std::string name = chapter;
  for (const Setting& s : settings) {
    if (!s.in_name || s.value == s.default_value) continue;
    name += "_" + s.flag + "-";
    for (const char c : s.value)
      name += std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' ? c : 'x';
  }
  return name;
}

namespace {

// Ordered: the JSON's keys in the order they are written (run, settings, epochs, ...), not sorted.
using json = nlohmann::ordered_json;

// A setting's value in the JSON: a number where the text is one ("256", "0.2"), else the text.
json setting_value(const std::string& text) {
  if (const auto n = to_integer(text)) return *n;
  if (const auto x = to_real(text)) return *x;
  return text;
}

std::string read_whole(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

void check_run_name_length(const std::string& run) {
  // A name made from many settings can be long too: refused before any training, rather than
  // when the run's last file is written.
  if (run.size() > kMaxRunName)
    throw Error("the run's name, " + run + ", has " + std::to_string(run.size()) + " characters; at most " +
                std::to_string(kMaxRunName) + " fit the files it names (give a shorter one with --run-name NAME)");
}

void claim_run_files(const std::string& out, const std::string& run, const RunSettings& settings) {
  check_run_name_length(run);
  const fs::path folder(out), json_file = folder / (run + ".json");
  std::vector<std::string> there;  // the run's files already in the folder
  for (const char* extension : {".csv", ".json", ".png"})
    if (fs::exists(folder / (run + extension))) there.push_back(run + extension);
  if (there.empty()) return;
  std::string listed;  // "01_lenet.csv, .json, .png"
  for (const std::string& f : there) listed += listed.empty() ? f : ", " + f.substr(run.size());
  const std::string keep = "they are kept; name this run otherwise (--run-name NAME) or move them away";
  if (!fs::exists(json_file))
    throw Error(out + " holds " + listed + " with no " + run + ".json to say which settings made " +
                (there.size() > 1 ? "them" : "it") + " (a run of an older version?): " + keep);
  json earlier;
  try {
    earlier = json::parse(read_whole(json_file)).at("settings");
  } catch (const json::exception& e) {
    throw Error(json_file.string() + " cannot be read as a run's JSON (" + e.what() + "): " + keep);
  }
  // Compared: the settings in the name. Where the files go, and how progress showed, may differ.
  std::string differ;
  for (const Setting& s : settings) {
    if (!s.in_name) continue;
    const json mine = setting_value(s.value);
    if (earlier.contains(s.flag) && earlier[s.flag] == mine) continue;
    // A flag the earlier run's version did not have yet, left at its default here: a new flag's
    // default keeps what the program did before it, so that run computed what this one does.
    if (!earlier.contains(s.flag) && s.value == s.default_value) continue;
    differ += (differ.empty() ? "" : ", ") + std::string("--") + s.flag + " " + s.value + " here, " +
              (earlier.contains(s.flag) ? earlier[s.flag].dump() : "none") + " there";
  }
  if (!differ.empty())
    throw Error(out + " holds " + listed + " of another run named " + run + " (" + differ + "): " + keep);
  std::printf("%s: replacing %s, left by an earlier run with the same settings\n", run.c_str(), listed.c_str());
}

namespace {

// What the program can see of the machine by itself (tools/machine_stamp.sh, which the figure
// scripts run, also asks nvidia-smi, nvcc, mpirun and dpkg).
json machine() {
  std::string cpu = "unknown";
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);)
    if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos) {
      cpu = line.substr(line.find(':') + 2);
      break;
    }
#if defined(__clang__)
  const std::string compiler = std::string("clang ") + __clang_version__;
#elif defined(__GNUC__)
  const std::string compiler = std::string("g++ ") + __VERSION__;
#else
  const std::string compiler = "unknown";
#endif
  return {{"backend", kBackendName},
          {"gpus", gpu_names()},
          {"cpu", cpu},
          {"cores", std::thread::hardware_concurrency()},
          {"compiler", compiler}};
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&t, &utc);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return buf;
}

// Appends `line` to the file at `path` and flushes it to the system, checking every step: a row
// that cannot be written (a full disk, a folder that went away) throws, naming the file.
void append_line(const std::string& path, const std::string& line) {
  std::FILE* f = std::fopen(path.c_str(), "ab");
  if (!f) throw Error(path + ": cannot be appended to: " + std::strerror(errno));
  const bool written = std::fwrite(line.data(), 1, line.size(), f) == line.size() && std::fflush(f) == 0;
  const int write_error = errno;
  const bool closed = std::fclose(f) == 0;
  if (!written || !closed)
    throw Error(path + ": cannot be appended to: " + std::strerror(written ? errno : write_error));
}

}  // namespace

RunLock::RunLock(const std::string& lock_path, const std::function<std::string(const std::string& pid)>& held)
    : path_(lock_path) {
  for (int attempt = 0;; ++attempt) {
    fd_ = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd_ < 0) throw Error(lock_path + ": cannot open the lock: " + std::strerror(errno));
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      const int error = errno;
      char holder[32] = {};  // the process id the holder wrote
      const ssize_t got = ::pread(fd_, holder, sizeof holder - 1, 0);
      ::close(fd_);
      fd_ = -1;
      if (error != EWOULDBLOCK) throw Error(lock_path + ": cannot lock: " + std::strerror(error));
      std::string pid = got > 0 ? std::string(holder, std::size_t(got)) : "";
      pid.erase(std::remove(pid.begin(), pid.end(), '\n'), pid.end());
      throw Error(held(pid));
    }
    // Locked: but on the file the name now names? (The previous holder may have removed it
    // between our open and our flock, and a third run made a new one.)
    struct stat ours {}, named {};
    if (::fstat(fd_, &ours) == 0 && ::stat(lock_path.c_str(), &named) == 0 && ours.st_dev == named.st_dev &&
        ours.st_ino == named.st_ino)
      break;
    ::close(fd_);
    fd_ = -1;
    if (attempt == 100) throw Error(lock_path + ": cannot lock: the file keeps being removed or replaced");
  }
  // The process id, for a second run's message: a courtesy, which the lock does not depend on.
  const std::string pid = std::to_string(::getpid()) + "\n";
  [[maybe_unused]] const bool noted = ::ftruncate(fd_, 0) == 0 && ::pwrite(fd_, pid.data(), pid.size(), 0) >= 0;
}

void RunLock::release() {
  if (fd_ < 0) return;
  ::unlink(path_.c_str());  // while still holding the lock: no one else holds one on this file
  ::close(fd_);
  fd_ = -1;
}

RunLock::~RunLock() { release(); }

RunLock::RunLock(RunLock&& other) noexcept : fd_(std::exchange(other.fd_, -1)), path_(std::move(other.path_)) {}

RunLock& RunLock::operator=(RunLock&& other) noexcept {
  if (this != &other) {
    release();
    fd_ = std::exchange(other.fd_, -1);
    path_ = std::move(other.path_);
  }
  return *this;
}

TrainingLog::TrainingLog(std::string chapter, std::string run, const Options& options, RunSettings settings,
                         int devices, int train_examples)
    : chapter_(std::move(chapter)), run_(std::move(run)), options_(options), settings_(std::move(settings)),
      devices_(devices), train_examples_(train_examples), started_(utc_now()) {
  prepare_output_folder(options_.out);
  check_run_name_length(run_);
  // First: a run writing these files now is not "an earlier run" whose files may be replaced.
  const std::string lock = (fs::path(options_.out) / (run_ + ".lock")).string();
  lock_ = RunLock(lock, [&](const std::string& pid) {
    return options_.out + ": another run named " + run_ + (pid.empty() ? "" : " (process " + pid + ")") +
           " is writing " + run_ + ".csv and .json there now (it holds " + lock +
           "): wait for it to end, or give this run another --run-name or --out";
  });
  claim_run_files(options_.out, run_, settings_);
  // A plot of the earlier run would outlive this one if it stopped before drawing its own.
  std::error_code ignored;
  fs::remove(fs::path(options_.out) / (run_ + ".png"), ignored);
  // in_sec_per_epoch: 0 for the first epoch (one-time set-up included, left out of the mean
  // when there are more epochs), 1 for those the result line's sec_per_epoch averages.
  try {
    write_whole_file(csv_path(), "epoch,train_loss,train_acc,test_acc,seconds,in_sec_per_epoch\n");
    write_json(false);
  } catch (const Error&) {
    // (A disk that fills between the two.) A CSV without its JSON would be "another run's" to
    // the next run of this name, which would refuse to replace it: nothing is left behind.
    fs::remove(csv_path(), ignored);
    fs::remove(json_path(), ignored);
    throw;
  }
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

bool TrainingLog::shows_progress() const { return progress_style(options_.progress) != ProgressStyle::Off; }

void TrainingLog::progress(int epoch, int batch, int batches) {
  const ProgressStyle style = progress_style(options_.progress);
  if (style == ProgressStyle::Off) return;
  const double now = steady_seconds();
  const bool first = epoch != progress_epoch_;  // the epoch's first report: its clock starts
  if (first) {
    progress_epoch_ = epoch;
    epoch_started_s_ = last_shown_s_ = now;
    last_shown_batch_ = -1;
  }
  // A live line is drawn at once and redrawn at most 5 times a second; a plain line each time
  // the count passes a multiple of --print-every (the finished count may step by several), or
  // about every 10 s.
  const bool last = batch + 1 == batches;
  const int every = options_.print_every;
  const bool due = style == ProgressStyle::Live ? first || now - last_shown_s_ >= 0.2 || last
                   : every > 0                  ? (batch + 1) / every > (last_shown_batch_ + 1) / every
                                                : now - last_shown_s_ >= 10;
  if (!due) return;
  last_shown_s_ = now;
  last_shown_batch_ = batch;
  // "batch k": k batches finished by the devices (the epoch loop counts them: train_loop.h's
  // devices). The rate shown is the last epoch's, measured with the devices synchronized (none
  // in the first). The time left is the longer of two guesses: the last epoch's rate, and this
  // epoch's so far (finished batches by the clock), counted once the epoch has run a second;
  // where this epoch is slower than the last (another machine's load, a first epoch), the second
  // is the better guess.
  char line[192];
  int n = std::snprintf(line, sizeof line, "  epoch %d/%d  batch %d/%d", epoch, options_.epochs, batch + 1, batches);
  const double left = batches - 1 - batch, elapsed = now - epoch_started_s_;
  double eta = -1;  // unknown
  if (elapsed >= 1.0) eta = elapsed / (batch + 1) * left;
  if (!records_.empty() && records_.back().seconds > 0) {
    const double epoch_s = records_.back().seconds;
    n += std::snprintf(line + n, sizeof line - n, "  %.0f images/s (last epoch)", train_examples_ / epoch_s);
    eta = std::max(eta, epoch_s * left / batches);
  }
  if (eta >= 0) std::snprintf(line + n, sizeof line - n, "  ETA %.1f s", eta);
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
  std::ostringstream row;
  row << r.epoch << ',' << r.train_loss << ',' << r.train_acc << ',' << r.test_acc << ',' << r.seconds << ','
      << (in_sec_per_epoch(records_.size() - 1) ? 1 : 0) << '\n';
  append_line(csv_path(), row.str());
  write_json(false);
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

// Decided when the epoch ends, before the run knows whether another follows: the first epoch is
// left out when the run asks for more (--epochs), as seconds_per_epoch() leaves it out once
// there are more. (A run stopped after its first epoch keeps the 0: it was meant to be left out.)
bool TrainingLog::in_sec_per_epoch(std::size_t i) const {
  return i > 0 || records_[0].epoch >= options_.epochs;
}

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

std::vector<std::pair<std::string, std::string>> TrainingLog::result_fields() const {
  const double sec = seconds_per_epoch();
  auto fixed = [](double x, int digits) {
    char buf[48];
    std::snprintf(buf, sizeof buf, "%.*f", digits, x);
    return std::string(buf);
  };
  return {{"chapter", chapter_},
          {"backend", kBackendName},
          {"devices", std::to_string(devices_)},
          {"epochs", std::to_string(options_.epochs)},
          {"batch", std::to_string(options_.batch_size)},
          {"lr", real_text(options_.lr)},
          {"test_acc", fixed(records_.empty() ? 0.0 : records_.back().test_acc, 4)},
          {"sec_per_epoch", fixed(sec, 3)},
          {"samples_per_sec", fixed(sec > 0 ? train_examples_ / sec : 0.0, 0)},
          {"first_epoch_sec", fixed(records_.empty() ? 0.0 : records_.front().seconds, 3)},
          {"peak_mib", peak_device_bytes_ ? fixed(double(*peak_device_bytes_) / (1 << 20), 1) : "none"}};
}

std::string TrainingLog::result_line() const {
  std::string line = "result:";
  for (const auto& [key, value] : result_fields()) line += " " + key + "=" + value;
  return line;
}

std::string TrainingLog::csv_path() const { return (fs::path(options_.out) / (run_ + ".csv")).string(); }
std::string TrainingLog::json_path() const { return (fs::path(options_.out) / (run_ + ".json")).string(); }

void TrainingLog::write_json(bool finished) const {
  json settings = json::object();
  for (const Setting& s : settings_) settings[s.flag] = setting_value(s.value);
  json epochs = json::array();
  for (std::size_t i = 0; i < records_.size(); ++i) {
    const EpochRecord& r = records_[i];
    epochs.push_back({{"epoch", r.epoch},
                      {"train_loss", r.train_loss},  // a NaN is written as null: JSON has no NaN
                      {"train_acc", r.train_acc},
                      {"test_acc", r.test_acc},
                      {"seconds", r.seconds},
                      {"in_sec_per_epoch", in_sec_per_epoch(i)}});
  }
  json j = {{"run", run_},
            {"chapter", chapter_},
            {"started", started_},
            {"finished", finished},
            {"commit", build_commit()},
            {"machine", machine()},
            {"settings", settings},
            {"epochs", epochs}};
  if (finished) {
    json result = json::object();
    for (const auto& [key, value] : result_fields()) result[key] = setting_value(value);
    j["result"] = result;
  }
  write_whole_file(json_path(), j.dump(2) + "\n");
}

void TrainingLog::finish() const {
  write_json(true);
  std::printf("wrote %s\nwrote %s\n", json_path().c_str(), csv_path().c_str());
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
// when it could not be started (not installed); what gnuplot wrote to its stderr goes into
// `remarks` (its warnings, or the reason it failed), not onto the user's terminal.
int run_gnuplot_in(const fs::path& folder, const std::string& script, std::string& remarks) {
  int pipe_fds[2];
  if (pipe(pipe_fds) != 0) throw Error(std::string("cannot start gnuplot: pipe: ") + std::strerror(errno));
  std::fflush(stdout);  // the child must not print what the parent has buffered
  std::fflush(stderr);
  const pid_t child = fork();
  if (child < 0) {
    close(pipe_fds[0]);
    close(pipe_fds[1]);
    throw Error(std::string("cannot start gnuplot: fork: ") + std::strerror(errno));
  }
  if (child == 0) {  // only async-signal-safe calls from here to exec
    close(pipe_fds[0]);
    if (dup2(pipe_fds[1], STDERR_FILENO) < 0) _exit(126);
    close(pipe_fds[1]);
    const std::string where = folder.empty() ? "." : folder.string();
    if (chdir(where.c_str()) != 0) _exit(126);
    execlp("gnuplot", "gnuplot", script.c_str(), static_cast<char*>(nullptr));
    _exit(127);  // exec failed: gnuplot is not on the PATH
  }
  close(pipe_fds[1]);
  char buffer[4096];
  for (;;) {  // until gnuplot closes its end (it exits)
    const ssize_t got = read(pipe_fds[0], buffer, sizeof buffer);
    if (got > 0) {
      remarks.append(buffer, std::size_t(got));
    } else if (got == 0 || errno != EINTR) {
      break;
    }
  }
  close(pipe_fds[0]);
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
  // gnuplot's remarks are shown only when it fails: a warning about, say, a long title in the
  // key says nothing about the run, and the picture is drawn all the same.
  std::string remarks;
  const int status = run_gnuplot_in(script_path.parent_path(), script_path.filename().string(), remarks);
  if (status == 127) {
    std::fprintf(stderr, "warning: gnuplot not found (apt-get install gnuplot-nox): no plot, the CSV has the numbers\n");
    return false;
  }
  if (status != 0) {
    std::fprintf(stderr, "warning: gnuplot failed (exit status %d) on %s: no plot, the CSV has the numbers\n%s", status,
                 script_path.string().c_str(), remarks.c_str());
    return false;
  }
  // gnuplot ends with status 0 even when the disk filled under it: a picture is whole only if
  // it ends with PNG's closing chunk, "IEND" and its 4-byte checksum.
  std::error_code error;
  const auto bytes = fs::file_size(png_path, error);
  char end[4] = {};
  if (!error && bytes >= 8) {
    std::ifstream in(png_path, std::ios::binary);
    in.seekg(std::streamoff(bytes - 8));
    in.read(end, 4);
  }
  if (error || std::string(end, 4) != "IEND") {
    const std::string what = error ? "not written" : std::to_string(bytes) + " bytes";
    fs::remove(png_path, error);
    std::fprintf(stderr,
                 "warning: gnuplot left %s incomplete (%s; a full disk?): removed; no plot, the CSV has the numbers\n%s",
                 png_path.c_str(), what.c_str(), remarks.c_str());
    return false;
  }
  return true;
}

namespace {
// The epochs a run's CSV holds: its rows after the header.
int epochs_in(const std::string& csv) {
  std::ifstream in(csv);
  int rows = 0;
  for (std::string line; std::getline(in, line);) rows += !line.empty();
  return std::max(0, rows - 1);
}
}  // namespace

// Text a user may have typed (a title, a run's label) as a gnuplot string: single-quoted, a
// quote doubled (gnuplot's escape inside single quotes), and every control character a space. A
// new line would end the string and the command, and gnuplot would run the next line as a
// command of its own (`system "..."`).
namespace {
bool is_control(char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; }
}  // namespace

bool has_control_character(const std::string& text) {
  return std::any_of(text.begin(), text.end(), is_control);
}

std::string gnuplot_text(const std::string& text) {
  std::string quoted = "'";
  for (const char c : text) {
    if (c == '\'') quoted += "''";
    else if (is_control(c)) quoted += ' ';
    else quoted += c;
  }
  return quoted + "'";
}

bool plot_runs(const std::string& png_path, const std::string& title,
               const std::vector<std::pair<std::string, std::string>>& runs) {
  // Epochs 1..N on the x-axis, half an epoch of margin each side, so that a run of one epoch is
  // a point in the middle of the plot (an x range of one value makes gnuplot warn); a tick at
  // every epoch up to 20, never at a fraction of one.
  int epochs = 1;
  for (const auto& run : runs) epochs = std::max(epochs, epochs_in(run.second));
  // The keys lie below the plots, never over a curve: the curves' under the left one, a row each;
  // the runs' under the right one, a row each and one for the open circle. Both plots keep the
  // same bottom margin, so that their axes line up; the picture grows by a row per run past two.
  const int key_rows = std::max<int>(3, static_cast<int>(runs.size()) + 1);
  std::ostringstream gp;
  gp << "set terminal pngcairo size 1000," << 400 + 16 * (key_rows - 3) << " font 'sans,10' noenhanced\n"
     << "set grid\n"
     << "set xrange [0.5:" << epochs + 0.5 << "]\n"
     << (epochs <= 20 ? "set xtics 1\n" : "set xtics 1, 1 + (" + std::to_string(epochs) + " - 1) / 10\n")
     << "set bmargin " << 4 + key_rows << "\n"
     << "set offsets 0, 0, graph 0.05, 0\n"  // no point on the top border
     << "set multiplot layout 1,2 title " << gnuplot_text(title) << "\n";
  // d2l's picture of training: the training loss (column 2), the training accuracy (3) and the
  // test accuracy (4) per epoch, on one axis, each curve in a colour of its own (d2l's blue,
  // magenta and green, as told apart by readers who do not see red from green: Okabe and Ito's).
  // Runs are told apart by their dash type and point type, the same in both plots; in the plot of
  // the time per epoch, by their colour too (the colours Okabe and Ito keep for other things).
  const char* curves[3][3] = {
      {"2", "train loss", "#0072b2"}, {"3", "train acc", "#cc79a7"}, {"4", "test acc", "#009e73"}};
  const int points[] = {7, 5, 9, 13, 11, 15};
  const char* run_colours[] = {"#000000", "#e69f00", "#56b4e9", "#d55e00", "#808080", "#f0e442"};
  const auto run_style = [&](std::size_t i) {
    return " dt " + std::to_string(i + 1) + " pt " + std::to_string(points[i % 6]);
  };
  gp << "set key below left vertical maxrows 3\nset xlabel 'epoch'\nset ylabel 'loss, accuracy'\nset yrange [0:*]\nplot ";
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const std::string file = gnuplot_file(runs[i].second, png_path);
    for (int c = 0; c < 3; ++c)
      gp << (i || c ? ", " : "") << file << " using 1:" << curves[c][0] << " with linespoints lc rgb '" << curves[c][2]
         << "'" << run_style(i) << " notitle";
  }
  // The key names the curves by their colours alone (the runs' styles are named beside the other plot).
  for (const auto& curve : curves) gp << ", 1/0 with lines lw 2 lc rgb '" << curve[2] << "' title '" << curve[1] << "'";
  gp << "\n";
  // Time per epoch: the epochs that sec_per_epoch averages (column 6, in_sec_per_epoch, is 1) as
  // a line; the first epoch, which also pays one-time set-up, as an open circle. A run alone is
  // named by the title already: its line is "seconds per epoch" (a long run name would not fit
  // below the plot, and gnuplot would drop the key).
  gp << "set key below left vertical maxrows " << key_rows << "\nset xlabel 'epoch'\nset ylabel 'seconds per epoch'\n"
     << "set yrange [0:*]\nplot ";
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const std::string file = gnuplot_file(runs[i].second, png_path);
    const std::string time_colour = std::string(" lc rgb '") + run_colours[i % 6] + "'";
    gp << (i ? ", " : "") << file << " using 1:($6 == 1 ? $5 : 1/0) with linespoints" << time_colour << run_style(i)
       << " title " << gnuplot_text(runs.size() > 1 ? runs[i].first : "seconds per epoch") << ", " << file << " using 1:($6 == 1 ? 1/0 : $5) with points pt 6 ps 1.5"
       << time_colour << " notitle";
  }
  gp << ", 1/0 with points pt 6 ps 1.5 lc rgb '#000000' title 'first epoch: one-time set-up included'";
  gp << "\nunset multiplot\n";
  return run_gnuplot(png_path, gp.str());
}

}  // namespace mgpu
