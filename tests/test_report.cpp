// What a run leaves behind (common/report.h): files named after the run's settings, the CSV
// row by row, the JSON, the plot, the result line. The plot is drawn by gnuplot, a separate
// program: no path the user typed may reach a shell or a gnuplot script, whatever characters
// it holds.
#include <doctest/doctest.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "common/backend.h"  // kBackendName
#include "common/check.h"
#include "common/cli.h"
#include "common/report.h"
#include "captured_output.h"  // output_of, stdout_of
#include "resource_limits.h"  // FileSizeLimit

namespace {

namespace fs = std::filesystem;
using testing::output_of;
using testing::stdout_of;

// A fresh, empty folder under the system's temporary folder.
fs::path fresh_folder(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / ("mgpu_test_report_" + std::to_string(getpid())) / name;
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

bool gnuplot_installed() {
  for (std::string dir : {"/usr/bin", "/usr/local/bin", "/bin"})
    if (fs::exists(fs::path(dir) / "gnuplot")) return true;
  return false;
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_text(const fs::path& p, const std::string& text) { std::ofstream(p) << text; }

// A run's options writing into `out`, of `epochs` epochs (d2l's 10 unless given).
mgpu::Options options_into(const fs::path& out, int epochs = mgpu::Options{}.epochs) {
  mgpu::Options o;
  o.epochs = epochs;
  o.out = out.string();
  return o;
}

// Two epochs logged and finished into `out`.
void finish_a_run(const fs::path& out) {
  mgpu::Options o = options_into(out, 2);
  mgpu::TrainingLog log("01_lenet", "report_test", o, {}, 1, 1000);
  log.end_epoch({1, 2.3, 0.1, 0.1, 4.0});
  log.end_epoch({2, 1.6, 0.4, 0.6, 2.0});
  log.finish();
}

TEST_CASE("gnuplot_file: a plain name in the plot's folder, quoted; anything else is refused") {
  CHECK(mgpu::gnuplot_file("out/run_k2.csv", "out/plot.png") == "'run_k2.csv'");
  CHECK(mgpu::gnuplot_file("run.csv", "plot.png") == "'run.csv'");
  CHECK_THROWS_WITH_AS(mgpu::gnuplot_file("elsewhere/run.csv", "out/plot.png"),
                       doctest::Contains("is not in the plot's folder"), mgpu::Error);
  for (const char* name : {"it's.csv", "a`b`.csv", "a b.csv", "$(x).csv"})
    CHECK_THROWS_WITH_AS(mgpu::gnuplot_file(std::string("out/") + name, "out/plot.png"),
                         doctest::Contains("is not a plain file name"), mgpu::Error);
}

TEST_CASE("gnuplot_text: any text as one gnuplot string, which no quote or new line can end") {
  CHECK(mgpu::gnuplot_text("C++ vs PyTorch") == "'C++ vs PyTorch'");
  CHECK(mgpu::gnuplot_text("it's") == "'it''s'");  // gnuplot's escape of a quote inside single quotes
  CHECK(mgpu::gnuplot_text("a\nsystem \"touch x\"") == "'a system \"touch x\"'");  // one line: nothing runs
  CHECK(mgpu::gnuplot_text(std::string("tab\there\x1b[0m")) == "'tab here [0m'");
  CHECK(mgpu::gnuplot_text("") == "''");
}

TEST_CASE("--out with quotes, a command substitution or a leading '-': plotted, and nothing is run") {
  const fs::path base = fresh_folder("odd");
  const fs::path witness = base / "INJECTED";
  // Each would run `touch INJECTED` (in `base`) if the folder's name reached a shell or the
  // script as text; the last would be read by gnuplot as an option if passed as an argument.
  for (const std::string name : {"x'; touch INJECTED; echo '", "$(touch INJECTED)", "`touch INJECTED`",
                                 "-e system('touch INJECTED')"}) {
    CAPTURE(name);
    const fs::path out = base / name;
    const fs::path previous = fs::current_path();
    fs::current_path(base);  // a relative injection would land here
    finish_a_run(out);
    fs::current_path(previous);
    CHECK_FALSE(fs::exists(witness));
    CHECK(fs::exists(out / "report_test.csv"));
    if (gnuplot_installed()) {
      CHECK(fs::exists(out / "report_test.png"));
      CHECK(fs::file_size(out / "report_test.png") > 1000);
    } else {
      MESSAGE("gnuplot is not installed: only the CSV and the absence of an injection are checked");
    }
  }
  fs::remove_all(base.parent_path());
}

TEST_CASE("the CSV marks the first epoch as left out of sec_per_epoch, and the result line says it") {
  const fs::path out = fresh_folder("timing");
  finish_a_run(out);
  const std::string csv = read_file(out / "report_test.csv");
  CHECK(csv.rfind("epoch,train_loss,train_acc,test_acc,seconds,in_sec_per_epoch\n", 0) == 0);
  CHECK(csv.find("\n1,2.3,0.1,0.1,4,0\n") != std::string::npos);
  CHECK(csv.find("\n2,1.6,0.4,0.6,2,1\n") != std::string::npos);

  mgpu::Options o = options_into(out, 2);
  mgpu::TrainingLog log("01_lenet", "timing", o, {}, 1, 1000);
  log.end_epoch({1, 2.3, 0.1, 0.1, 4.0});
  CHECK(log.seconds_per_epoch() == doctest::Approx(4.0));  // one epoch: it is all there is
  log.end_epoch({2, 1.6, 0.4, 0.6, 2.0});
  log.end_epoch({3, 1.2, 0.5, 0.7, 3.0});
  CHECK(log.seconds_per_epoch() == doctest::Approx(2.5));  // epochs 2 and 3
  CHECK(log.result_line().find("sec_per_epoch=2.500 samples_per_sec=400 first_epoch_sec=4.000") != std::string::npos);
  CHECK(log.timing_note().find("mean of epochs 2-3; epoch 1 took 4.000 s") != std::string::npos);
  fs::remove_all(out.parent_path());
}

}  // namespace

namespace {

TEST_CASE("a run whose training loss is not finite stops, after printing the epoch, naming --lr") {
  const fs::path out = fresh_folder("diverged");
  mgpu::Options o = options_into(out);
  o.lr = 5.0f;
  mgpu::TrainingLog log("01_lenet", "diverged", o, {}, 1, 1000);
  log.end_epoch({1, 2.3, 0.1, 0.1, 1.0});
  CHECK_THROWS_WITH_AS(log.end_epoch({2, std::nan(""), 0.1, 0.1, 1.0}),
                       doctest::Contains("training diverged in epoch 2: the training loss is NaN; try a smaller --lr than 5"),
                       mgpu::Error);
  CHECK_THROWS_WITH_AS(log.end_epoch({3, HUGE_VAL, 0.1, 0.1, 1.0}), doctest::Contains("the training loss is infinite"),
                       mgpu::Error);
  fs::remove_all(out.parent_path());
}

// Files in `folder` whose names end in ".tmp": what a failed or finished write must not leave.
int temporaries_in(const fs::path& folder) {
  int n = 0;
  for (const fs::directory_entry& e : fs::directory_iterator(folder)) n += e.path().extension() == ".tmp";
  return n;
}

TEST_CASE("write_whole_file: the whole new file or the old one, never a part, and no temporary left") {
  const fs::path folder = fresh_folder("whole");
  const fs::path csv = folder / "run.csv";
  mgpu::write_whole_file(csv.string(), "old\n");
  CHECK(read_file(csv) == "old\n");
  mgpu::write_whole_file(csv.string(), "new\n");  // replaces it
  CHECK(read_file(csv) == "new\n");
  CHECK(temporaries_in(folder) == 0);

  // A disk that fills up part-way: refused, naming the file, and the earlier file is intact.
  const std::string big(1 << 20, 'x');
  const std::string refusal = csv.string() + ": cannot be written (writing ";
  {
    const testing::FileSizeLimit disk_fills(4096);  // as a full disk, after 4 KiB of any one file
    CHECK_THROWS_WITH_AS(mgpu::write_whole_file(csv.string(), big), doctest::Contains(refusal.c_str()), mgpu::Error);
  }
  CHECK(read_file(csv) == "new\n");
  CHECK(temporaries_in(folder) == 0);

  // A folder that went away, and a path that is a folder: refused, nothing left behind.
  CHECK_THROWS_WITH_AS(mgpu::write_whole_file((folder / "gone" / "x.csv").string(), "x"),
                       doctest::Contains("x.csv: cannot be written (creating "), mgpu::Error);
  fs::create_directories(folder / "a_folder" / "inside");
  CHECK_THROWS_WITH_AS(mgpu::write_whole_file((folder / "a_folder").string(), "x"),
                       doctest::Contains("a_folder: cannot be written (renaming "), mgpu::Error);
  CHECK(fs::is_directory(folder / "a_folder" / "inside"));
  CHECK(temporaries_in(folder) == 0);
  fs::remove_all(folder.parent_path());
}

TEST_CASE("a CSV row that cannot be written stops the run, naming the file; the rows before it stay") {
  const fs::path out = fresh_folder("full");
  mgpu::Options o = options_into(out, 10);
  mgpu::TrainingLog log("01_lenet", "report_test", o, {}, 1, 1000);
  log.end_epoch({1, 0.5, 0.8, 0.8, 1.0});
  const std::string before = read_file(out / "report_test.csv");
  {
    // As a full disk: the CSV may not grow by a whole row (about 20 bytes).
    const testing::FileSizeLimit disk_fills(fs::file_size(out / "report_test.csv") + 4);
    CHECK_THROWS_WITH_AS(log.end_epoch({2, 0.4, 0.9, 0.9, 1.0}), doctest::Contains("report_test.csv: cannot be appended to"),
                         mgpu::Error);
  }
  CHECK(read_file(out / "report_test.csv").rfind(before, 0) == 0);  // the header and epoch 1, as written
  fs::remove_all(out.parent_path());
}

TEST_CASE("a run whose first files cannot be written leaves none: the next run of that name starts clean") {
  const fs::path out = fresh_folder("full_at_start");
  mgpu::Options o = options_into(out, 2);
  {
    // As a disk that fills after the CSV's header (about 60 bytes) and before the JSON (about 1 KB).
    const testing::FileSizeLimit disk_fills(200);
    CHECK_THROWS_WITH_AS(mgpu::TrainingLog("01_lenet", "first_files", o, {}, 1, 1000),
                         doctest::Contains("first_files.json: cannot be written"), mgpu::Error);
  }
  CHECK_FALSE(fs::exists(out / "first_files.csv"));
  CHECK_FALSE(fs::exists(out / "first_files.json"));
  CHECK_FALSE(fs::exists(out / "first_files.lock"));
  // A run of that name with other settings is not refused as "another run's" files.
  o.epochs = 3;
  CHECK_NOTHROW(mgpu::TrainingLog("01_lenet", "first_files", o, {{"epochs", "3", "2"}}, 1, 1000));
  fs::remove_all(out.parent_path());
}

TEST_CASE("prepare_output_folder makes the folder, and refuses one that cannot be made or written") {
  const fs::path base = fresh_folder("out");
  CHECK_NOTHROW(mgpu::prepare_output_folder((base / "a" / "b").string()));
  CHECK(fs::is_directory(base / "a" / "b"));
  CHECK(fs::is_empty(base / "a" / "b"));  // the probe file is gone
  std::ofstream(base / "file") << "x";
  CHECK_THROWS_WITH_AS(mgpu::prepare_output_folder((base / "file").string()), doctest::Contains("cannot create the folder"),
                       mgpu::Error);
  CHECK_THROWS_WITH_AS(mgpu::prepare_output_folder("/proc/mgpu_test"), doctest::Contains("--out /proc/mgpu_test"),
                       mgpu::Error);
  fs::remove_all(base.parent_path());
}

}  // namespace

namespace {

TEST_CASE("--progress: on draws a live line and erases it; off draws nothing; auto, in a log, plain lines") {
  const fs::path out = fresh_folder("progress");
  mgpu::Options o = options_into(out);
  for (const auto p : {mgpu::Options::Progress::On, mgpu::Options::Progress::Off, mgpu::Options::Progress::Auto}) {
    o.progress = p;
    CAPTURE(static_cast<int>(p));
    mgpu::TrainingLog log("01_lenet", "progress_" + std::to_string(static_cast<int>(p)), o, {}, 1, 1000);
    const std::string text = stdout_of([&] {
      log.progress(1, 16, 40);
      log.end_epoch({1, 2.3, 0.1, 0.1, 1.0});
    });
    CAPTURE(text);
    const bool codes = text.find('\r') != std::string::npos || text.find('\33') != std::string::npos;
    // Under ctest stdout is not a terminal: auto writes plain lines, and none this soon.
    CHECK(codes == (p == mgpu::Options::Progress::On));
    CHECK((text.find("epoch 1/10  batch 17/40") != std::string::npos) == (p == mgpu::Options::Progress::On));
    CHECK(text.find("epoch  1/10  loss 2.3000") != std::string::npos);
  }
  fs::remove_all(out.parent_path());
}

TEST_CASE("--print-every N: in a log, a plain line every N batches, with the last epoch's rate and the time left") {
  const fs::path out = fresh_folder("print_every");
  mgpu::Options o = options_into(out);
  o.print_every = 4;
  mgpu::TrainingLog log("01_lenet", "print_every", o, {}, 1, 1000);
  const std::string text = stdout_of([&] {
    for (int b = 0; b < 8; ++b) log.progress(1, b, 8);
    log.end_epoch({1, 2.3, 0.1, 0.1, 2.0});  // 1,000 images in 2 s: 500 images/s
    for (int b = 0; b < 8; ++b) log.progress(2, b, 8);
  });
  CAPTURE(text);
  CHECK(text.find('\r') == std::string::npos);  // a log gets no terminal codes
  CHECK(text.find("  epoch 1/10  batch 4/8\n  epoch 1/10  batch 8/8\nepoch  1/10  loss") != std::string::npos);
  CHECK(text.find("  epoch 2/10  batch 4/8  500 images/s (last epoch)  ETA 1.0 s\n") != std::string::npos);
  CHECK(text.find("  epoch 2/10  batch 8/8  500 images/s (last epoch)  ETA 0.0 s\n") != std::string::npos);
  CHECK(text.find("batch 3/8") == std::string::npos);
  fs::remove_all(out.parent_path());
}

TEST_CASE("--print-every N: a count that steps past a multiple of N shows a line there") {
  // The epoch loop counts batches the devices have finished, which may advance by several at once.
  const fs::path out = fresh_folder("print_every_steps");
  mgpu::Options o = options_into(out);
  o.print_every = 4;
  mgpu::TrainingLog log("01_lenet", "print_every_steps", o, {}, 1, 1000);
  const std::string text = stdout_of([&] {
    for (int b : {2, 6, 7, 8, 11}) log.progress(1, b, 12);  // 3, 7, 8, 9 and 12 batches done
  });
  CAPTURE(text);
  CHECK(text == "  epoch 1/10  batch 7/12\n  epoch 1/10  batch 8/12\n  epoch 1/10  batch 12/12\n");
  fs::remove_all(out.parent_path());
}

TEST_CASE("plot_runs: d2l's three curves over epochs 1..N, the time per epoch, and no gnuplot warning for one epoch") {
  const fs::path out = fresh_folder("plot_runs");
  const std::string header = "epoch,train_loss,train_acc,test_acc,seconds,in_sec_per_epoch\n";
  write_text(out / "one.csv", header + "1,2.3,0.1,0.1,1.5,0\n");
  write_text(out / "three.csv", header + "1,2.3,0.1,0.1,1.5,0\n2,1.2,0.5,0.45,1.1,1\n3,0.7,0.7,0.68,1.0,1\n");
  const std::string one = (out / "one.png").string(), both = (out / "both.png").string();
  bool drew_one = false, drew_both = false;
  const std::string warnings = output_of(2, [&] {
    drew_one = mgpu::plot_runs(one, "a run of one epoch", {{"one", (out / "one.csv").string()}});
    drew_both = mgpu::plot_runs(both, "two runs", {{"one", (out / "one.csv").string()},
                                                    {"three", (out / "three.csv").string()}});
  });
  // The scripts are written whether or not gnuplot is there: epochs 1..N with half an epoch of
  // margin, and the training loss, training accuracy and test accuracy of every run.
  const std::string script_one = read_file(out / "one.gp"), script_both = read_file(out / "both.gp");
  CHECK(script_one.find("set xrange [0.5:1.5]") != std::string::npos);
  CHECK(script_both.find("set xrange [0.5:3.5]") != std::string::npos);
  // Each curve in a colour of its own, the same in every run; the runs told apart by dash and
  // point type; the key names the curves and the runs; every key lies below its plot, none over
  // a curve; a tick at every epoch, none between.
  const auto count = [](const std::string& text, const std::string& what) {
    std::size_t n = 0;
    for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
    return n;
  };
  for (const char* curve : {"using 1:2 with linespoints lc rgb '#0072b2'", "using 1:3 with linespoints lc rgb '#cc79a7'",
                            "using 1:4 with linespoints lc rgb '#009e73'"})
    CHECK_MESSAGE(count(script_both, curve) == 2, curve);
  for (const char* title : {"title 'train loss'", "title 'train acc'", "title 'test acc'", "title 'one'", "title 'three'"})
    CHECK_MESSAGE(count(script_both, title) == 1, title);
  CHECK(script_both.find("dt 1 pt 7") != std::string::npos);
  CHECK(script_both.find("dt 2 pt 5") != std::string::npos);
  CHECK(count(script_both, "set key below") == 2);
  CHECK(script_both.find("set key inside") == std::string::npos);
  CHECK(script_both.find("set xtics 1\n") != std::string::npos);
  CHECK(script_one.find("title 'seconds per epoch'") != std::string::npos);  // a run alone: its name is the title's
  CHECK(script_one.find("title 'one'") == std::string::npos);
  if (gnuplot_installed()) {
    CHECK(drew_one);
    CHECK(drew_both);
    CHECK(fs::file_size(one) > 0);
    CHECK(warnings.empty());  // nothing on the terminal (gnuplot's remarks only show when it fails)
  } else {
    CHECK_FALSE(drew_one);  // and the warning says gnuplot is missing
    CHECK(warnings.find("gnuplot not found") != std::string::npos);
  }
  fs::remove_all(out.parent_path());
}

TEST_CASE("RunLock: a second run of the same name in the same folder is refused at its start, naming the first") {
  const fs::path out = fresh_folder("results_lock");
  mgpu::Options o = options_into(out, 2);
  {
    mgpu::TrainingLog first("01_lenet", "shared", o, {}, 1, 1000);
    first.end_epoch({1, 2.3, 0.1, 0.1, 4.0});
    // A second log of that run while the first writes (a second program, as far as the lock
    // can tell: another open file description): refused, with the first's process id, and
    // before it writes anything.
    const std::string csv_before = read_file(out / "shared.csv");
    const std::string names_the_first = "another run named shared (process " + std::to_string(::getpid()) +
                                        ") is writing shared.csv and .json there now";
    CHECK_THROWS_WITH_AS(mgpu::TrainingLog("01_lenet", "shared", o, {}, 1, 1000),
                         doctest::Contains(names_the_first.c_str()), mgpu::Error);
    CHECK(read_file(out / "shared.csv") == csv_before);
    // Another name in the same folder is another run's files: not held.
    mgpu::TrainingLog other("01_lenet", "other", o, {}, 1, 1000);
    first.end_epoch({2, 1.6, 0.4, 0.6, 2.0});
    first.finish();
  }
  // Once the first has ended, the name is free (and its lock file gone): the next run replaces
  // its files as before, and holds the lock file while it lives.
  CHECK_FALSE(fs::exists(out / "shared.lock"));
  {
    mgpu::TrainingLog again("01_lenet", "shared", o, {}, 1, 1000);
    CHECK(fs::exists(out / "shared.lock"));
  }
  CHECK_FALSE(fs::exists(out / "shared.lock"));
  // A lock file a killed run left (its process id inside, no lock held): taken over, and removed
  // at the end as the taker's own.
  write_text(out / "shared.lock", "999999\n");
  {
    mgpu::TrainingLog after_a_kill("01_lenet", "shared", o, {}, 1, 1000);
    CHECK(read_file(out / "shared.lock") == std::to_string(::getpid()) + "\n");
  }
  CHECK_FALSE(fs::exists(out / "shared.lock"));
  fs::remove_all(out.parent_path());
}

TEST_CASE("run_gnuplot: gnuplot's warnings stay off the terminal when it draws; its reason shows when it fails") {
  if (!gnuplot_installed()) {
    MESSAGE("gnuplot is not installed: nothing to check");
    return;
  }
  const fs::path out = fresh_folder("gnuplot_remarks");
  write_text(out / "flat.csv", "x,y\n1,2\n");
  bool drew = false, failed_drew = true;
  // An x range of one value: gnuplot warns ("empty x range") and draws all the same.
  const std::string quiet = output_of(2, [&] {
    drew = mgpu::run_gnuplot((out / "flat.png").string(), "plot 'flat.csv' using 1:2 with points\n");
  });
  CHECK(drew);
  CHECK(fs::file_size(out / "flat.png") > 0);
  CHECK(quiet.empty());
  // A script gnuplot cannot run: the warning names the script and carries gnuplot's own words.
  const std::string loud = output_of(2, [&] {
    failed_drew = mgpu::run_gnuplot((out / "bad.png").string(), "plott 'flat.csv'\n");
  });
  CHECK_FALSE(failed_drew);
  CHECK(loud.find("warning: gnuplot failed") != std::string::npos);
  CHECK(loud.find("bad.gp") != std::string::npos);
  CHECK(loud.find("invalid command") != std::string::npos);
  // A disk that fills while gnuplot writes (it still ends with status 0): the cut picture is
  // not reported drawn, and not left behind.
  bool cut_drew = true;
  std::string cut;
  {
    const testing::FileSizeLimit disk_fills(2000);  // a whole picture is about 10 KB or more
    cut = output_of(2, [&] {
      cut_drew = mgpu::run_gnuplot((out / "cut.png").string(), "plot 'flat.csv' using 1:2 with points\n");
    });
  }
  CHECK_FALSE(cut_drew);
  CHECK(cut.find("cut.png incomplete") != std::string::npos);
  CHECK_FALSE(fs::exists(out / "cut.png"));
  fs::remove_all(out.parent_path());
}

TEST_CASE("progress: an epoch slower than the last gets the time left from its own rate") {
  const fs::path out = fresh_folder("slow_epoch");
  mgpu::Options o = options_into(out);
  o.print_every = 1;
  mgpu::TrainingLog log("01_lenet", "slow_epoch", o, {}, 1, 1000);
  const std::string text = stdout_of([&] {
    log.end_epoch({1, 2.3, 0.1, 0.1, 0.001});  // a last epoch of 1 ms: an ETA of well under 1 ms
    log.progress(2, 0, 4);
    std::this_thread::sleep_for(std::chrono::milliseconds(1100));
    log.progress(2, 1, 4);  // 2 batches in 1.1 s or more: 2 left take 1.1 s or more
  });
  CAPTURE(text);
  const std::size_t at = text.find("  epoch 2/10  batch 2/4  1000000 images/s (last epoch)  ETA ");
  REQUIRE(at != std::string::npos);
  const double eta = std::stod(text.substr(text.find("ETA ", at) + 4));
  CHECK(eta >= 1.0);   // this epoch's rate, not the last epoch's 0.0005 s
  CHECK(eta < 60.0);
  fs::remove_all(out.parent_path());
}

}  // namespace

// ---- Run names, files that are there already, the CSV of a run stopped part-way, the JSON ----

namespace {

using nlohmann::json;

const mgpu::ChapterInfo kLenet{"01_lenet", "LeNet", 1, 1};

std::string name_of(const std::vector<std::string>& args, const mgpu::ChapterInfo& chapter = kLenet) {
  const mgpu::ParseResult r = mgpu::parse_options(args, chapter);
  REQUIRE(r.error.empty());
  return mgpu::run_name(chapter.name, r.options.run_name, mgpu::shared_settings(r.options, chapter));
}

TEST_CASE("run_name: the chapter's name, then each setting that differs from its default, in --help's order") {
  CHECK(name_of({}) == "01_lenet");
  // The quick look of chapter 01's README, its flags in any order: one name.
  CHECK(name_of({"--epochs", "5", "--limit-train", "10000", "--batch-size", "64"}) ==
        "01_lenet_epochs-5_batch-size-64_limit-train-10000");
  CHECK(name_of({"--batch-size", "64", "--epochs", "5", "--limit-train", "10000"}) ==
        "01_lenet_epochs-5_batch-size-64_limit-train-10000");
  CHECK(name_of({"--lr", "0.1", "--seed", "7", "--warmup-epochs", "2"}) == "01_lenet_lr-0.1_warmup-epochs-2_seed-7");
  // A default given on the command line is still the default.
  CHECK(name_of({"--epochs", "10", "--lr", "0.2"}) == "01_lenet");
  // Where the files go and how progress shows change nothing the run computes.
  CHECK(name_of({"--out", "elsewhere", "--data-dir", "/data", "--progress", "off", "--print-every", "3"}) == "01_lenet");
  // --run-name wins; the chapter's defaults are its own (chapter 02's: 2 devices).
  CHECK(name_of({"--epochs", "5", "--run-name", "quick.look-1"}) == "quick.look-1");
  const mgpu::ChapterInfo ch02{"02_data_parallel", "", 2, 1024};
  CHECK(name_of({"--devices", "2"}, ch02) == "02_data_parallel");
  CHECK(name_of({"--devices", "4", "--eval", "device0"}, ch02) == "02_data_parallel_devices-4_eval-device0");
  // A chapter's own settings follow; a character that is not a plain one in a file name becomes 'x'.
  mgpu::RunSettings own{{"mode", "ssp", "bsp"}, {"straggler", "0:3", "none"}, {"checkpoint", "/tmp/a b", "", false}};
  CHECK(mgpu::run_name("08_parameter_server", "", own) == "08_parameter_server_mode-ssp_straggler-0x3");
}

TEST_CASE("--run-name takes letters, digits, '_', '-' and '.': a name, not a path") {
  CHECK(mgpu::parse_options({"--run-name", "lenet_quick-2.1"}, kLenet).error.empty());
  for (const char* bad : {"a b", "../up", "dir/name", ".hidden", "-x", "it's"}) {
    CAPTURE(bad);
    CHECK(mgpu::parse_options({std::string("--run-name=") + bad}, kLenet).error.find("--run-name: '") == 0);
  }
  CHECK(mgpu::usage(kLenet).find("--run-name") != std::string::npos);
}

TEST_CASE("a run's name that its files could not carry is refused at the start, given or made from settings") {
  // Chapter 07's _timeline.csv and chapter 08's _staleness.csv, written at a run's end, once
  // failed there with "File name too long" for a name of 232 characters.
  const std::string longest(mgpu::kMaxRunName, 'n'), too_long(mgpu::kMaxRunName + 1, 'n');
  CHECK(mgpu::parse_options({"--run-name", longest}, kLenet).error.empty());
  CHECK(mgpu::parse_options({"--run-name", too_long}, kLenet).error.find("--run-name: a name of 201 characters; at most 200") == 0);
  // Every file a run may write fits in NAME_MAX with the longest name: its suffix and the
  // temporary's ".<pid>.tmp" (a pid has at most 7 digits: pid_max is at most 4,194,304).
  for (const char* suffix : {".json", "_staleness.png", "_staleness.csv", "_timeline.csv", "_workers.csv", "_model.csv"})
    CHECK(longest.size() + std::string(suffix).size() + std::string(".4194304.tmp").size() <= 255);
  // A name made from settings is checked where the run claims its files, before training.
  const fs::path out = fresh_folder("long_name");
  CHECK_THROWS_WITH_AS(mgpu::claim_run_files(out.string(), too_long, {}),
                       doctest::Contains("has 201 characters; at most 200 fit the files it names"), mgpu::Error);
  CHECK_NOTHROW(mgpu::claim_run_files(out.string(), longest, {}));
  fs::remove_all(out.parent_path());
}

// A run of `settings` named `run` in `out`: `epochs` epochs logged, finished or not.
void a_run(const fs::path& out, const std::string& run, const mgpu::RunSettings& settings, int epochs, bool finish) {
  mgpu::Options o = options_into(out, 3);
  mgpu::TrainingLog log("01_lenet", run, o, settings, 1, 1000);
  for (int e = 1; e <= epochs; ++e) log.end_epoch({e, 2.0 / e, 0.2 * e, 0.25 * e, 3.0 - e * 0.5});
  if (finish) log.finish();
}

TEST_CASE("the same settings again replace their files, saying so; another run's files are never replaced") {
  const fs::path out = fresh_folder("claims");
  const mgpu::RunSettings quick{{"epochs", "3", "10"}, {"out", out.string(), "results", false}};
  a_run(out, "01_lenet_epochs-3", quick, 3, true);
  const std::string first = read_file(out / "01_lenet_epochs-3.json");

  // The same settings (another --out text: not compared): replaced, after one line.
  mgpu::RunSettings same = quick;
  same[1].value = "./" + out.string();
  const std::string said = stdout_of([&] { a_run(out, "01_lenet_epochs-3", same, 1, false); });
  CHECK(said.find("01_lenet_epochs-3: replacing 01_lenet_epochs-3.csv, .json") == 0);
  CHECK(read_file(out / "01_lenet_epochs-3.csv") ==
        "epoch,train_loss,train_acc,test_acc,seconds,in_sec_per_epoch\n1,2,0.2,0.25,2.5,0\n");
  CHECK_FALSE(fs::exists(out / "01_lenet_epochs-3.png"));  // the earlier run's plot went with it

  // Other settings under that name (--run-name chose it): refused before anything is written.
  a_run(out, "01_lenet_epochs-3", quick, 3, true);
  const std::string csv = read_file(out / "01_lenet_epochs-3.csv"), json_text = read_file(out / "01_lenet_epochs-3.json");
  const mgpu::RunSettings other{{"epochs", "4", "10"}, {"seed", "7", "42"}};
  CHECK_THROWS_WITH_AS(a_run(out, "01_lenet_epochs-3", other, 1, false),
                       doctest::Contains("of another run named 01_lenet_epochs-3 (--epochs 4 here, 3 there, --seed 7 "
                                         "here, none there): they are kept; name this run otherwise (--run-name NAME)"),
                       mgpu::Error);
  CHECK(read_file(out / "01_lenet_epochs-3.csv") == csv);
  CHECK(read_file(out / "01_lenet_epochs-3.json") == json_text);

  // A flag added since the earlier run (its JSON does not name it), at its default here: the
  // same run, replaced; the same flag set to something else: another run's, kept.
  mgpu::RunSettings newer = quick;
  newer.push_back({"graph", "off", "off"});
  CHECK_NOTHROW(a_run(out, "01_lenet_epochs-3", newer, 3, true));
  newer.back().value = "on";
  a_run(out, "01_lenet_epochs-3", quick, 3, true);  // again an earlier version's files, without --graph
  CHECK_THROWS_WITH_AS(a_run(out, "01_lenet_epochs-3", newer, 1, false),
                       doctest::Contains("(--graph on here, none there)"), mgpu::Error);

  // A CSV with no JSON beside it (an older version's run, or someone's file): nobody can say
  // whose settings it holds, so it is kept.
  std::ofstream(out / "01_lenet.csv") << "epoch,train_loss\n1,2\n";
  CHECK_THROWS_WITH_AS(a_run(out, "01_lenet", {}, 1, false),
                       doctest::Contains("holds 01_lenet.csv with no 01_lenet.json to say which settings made it"),
                       mgpu::Error);
  CHECK(read_file(out / "01_lenet.csv") == "epoch,train_loss\n1,2\n");
  CHECK_FALSE(fs::exists(out / "01_lenet.json"));
  (void)first;
  fs::remove_all(out.parent_path());
}

TEST_CASE("a run stopped after its first epoch leaves the CSV's header and that epoch's row, and a JSON that says so") {
  const fs::path out = fresh_folder("stopped");
  const mgpu::RunSettings settings{{"epochs", "3", "10"}, {"graph", "off", "on"}};
  a_run(out, "stopped", settings, 1, false);  // the log is gone without finish(), as in a run that failed
  CHECK(read_file(out / "stopped.csv") ==
        "epoch,train_loss,train_acc,test_acc,seconds,in_sec_per_epoch\n1,2,0.2,0.25,2.5,0\n");
  const json j = json::parse(read_file(out / "stopped.json"));
  CHECK(j.at("finished") == false);
  CHECK_FALSE(j.contains("result"));
  REQUIRE(j.at("epochs").size() == 1);
  CHECK(j["epochs"][0].at("test_acc") == doctest::Approx(0.25));
  CHECK(j.at("settings").at("epochs") == 3);
  CHECK(j["settings"].at("graph") == "off");
  CHECK_FALSE(fs::exists(out / "stopped.png"));
  fs::remove_all(out.parent_path());
}

TEST_CASE("the JSON of a finished run: its settings, every epoch, the result line's fields, the machine, the commit") {
  const fs::path out = fresh_folder("json");
  const mgpu::ParseResult parsed = mgpu::parse_options({"--epochs", "3", "--lr", "0.1", "--out", out.string()}, kLenet);
  REQUIRE(parsed.error.empty());
  const mgpu::RunSettings settings = mgpu::shared_settings(parsed.options, kLenet);
  mgpu::TrainingLog log("01_lenet", mgpu::run_name("01_lenet", "", settings), parsed.options, settings, 1, 1000);
  for (int e = 1; e <= 3; ++e) log.end_epoch({e, 2.0 / e, 0.2 * e, 0.25 * e, 3.0 - e * 0.5});
  const std::string said = stdout_of([&] { log.finish(); });
  CHECK(said.find("wrote " + (out / "01_lenet_epochs-3_lr-0.1.json").string() + "\n") != std::string::npos);

  const json j = json::parse(read_file(out / "01_lenet_epochs-3_lr-0.1.json"));
  CHECK(j.at("run") == "01_lenet_epochs-3_lr-0.1");
  CHECK(j.at("finished") == true);
  const json& s = j.at("settings");  // every shared flag, with its value as the run had it
  CHECK(s.at("epochs") == 3);
  CHECK(s.at("lr") == doctest::Approx(0.1));
  CHECK(s.at("batch-size") == 256);
  CHECK(s.at("seed") == 42);
  CHECK(s.at("out") == out.string());
  CHECK(s.at("progress") == "auto");
  REQUIRE(j.at("epochs").size() == 3);
  CHECK(j["epochs"][0].at("in_sec_per_epoch") == false);
  CHECK(j["epochs"][2].at("seconds") == doctest::Approx(1.5));
  // The result line's fields, the same values.
  const json& r = j.at("result");
  CHECK(r.at("test_acc") == doctest::Approx(0.75));
  CHECK(r.at("sec_per_epoch") == doctest::Approx(1.75));  // epochs 2 and 3
  CHECK(r.at("first_epoch_sec") == doctest::Approx(2.5));
  CHECK(r.at("samples_per_sec") == 571);
  CHECK(r.at("backend") == mgpu::kBackendName);
  for (const auto& field : log.result_fields()) {  // (key, value); no structured binding: CAPTURE is a lambda
    const std::string& key = field.first;
    CAPTURE(key);
    CHECK(r.contains(key));
  }
  CHECK(j.at("machine").at("backend") == mgpu::kBackendName);
  CHECK(j["machine"].at("cores").get<int>() >= 1);
  CHECK_FALSE(j["machine"].at("compiler").get<std::string>().empty());
  CHECK(j.at("commit") == mgpu::build_commit());
  CHECK_FALSE(mgpu::build_commit().empty());
  // The CSV says the same, row by row.
  CHECK(read_file(out / "01_lenet_epochs-3_lr-0.1.csv") ==
        "epoch,train_loss,train_acc,test_acc,seconds,in_sec_per_epoch\n1,2,0.2,0.25,2.5,0\n2,1,0.4,0.5,2,1\n"
        "3,0.666667,0.6,0.75,1.5,1\n");
  fs::remove_all(out.parent_path());
}

}  // namespace
