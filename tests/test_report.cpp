// What a run leaves behind (common/report.h): the CSV, the plot, the result line. The plot is
// drawn by gnuplot, a separate program: no path the user typed may reach a shell or a gnuplot
// script, whatever characters it holds.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "common/check.h"
#include "common/cli.h"
#include "common/report.h"
#include "resource_limits.h"  // FileSizeLimit

namespace {

namespace fs = std::filesystem;

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

// Two epochs logged and finished into `out`.
void finish_a_run(const fs::path& out) {
  mgpu::Options o;
  o.epochs = 2;
  o.out = out.string();
  mgpu::TrainingLog log("01_lenet", "report_test", o, 1, 1000);
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

  mgpu::Options o;
  o.epochs = 2;
  o.out = out.string();
  mgpu::TrainingLog log("01_lenet", "timing", o, 1, 1000);
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
  mgpu::Options o;
  o.out = out.string();
  o.lr = 5.0f;
  mgpu::TrainingLog log("01_lenet", "diverged", o, 1, 1000);
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

TEST_CASE("a run's CSV that cannot be written is an error, and the earlier run's CSV survives it") {
  const fs::path out = fresh_folder("full");
  finish_a_run(out);
  const std::string earlier = read_file(out / "report_test.csv");
  REQUIRE(earlier.find("\n2,1.6,0.4,0.6,2,1\n") != std::string::npos);

  mgpu::Options o;
  o.epochs = 400;
  o.out = out.string();
  mgpu::TrainingLog log("01_lenet", "report_test", o, 1, 1000);
  for (int e = 1; e <= o.epochs; ++e) log.end_epoch({e, 0.5, 0.8, 0.8, 1.0});  // a CSV of ~10 KB
  {
    const testing::FileSizeLimit disk_fills(2048);
    CHECK_THROWS_WITH_AS(log.finish(), doctest::Contains("report_test.csv: cannot be written"), mgpu::Error);
  }
  CHECK(read_file(out / "report_test.csv") == earlier);
  CHECK(temporaries_in(out) == 0);
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

// What `f` prints on stdout (fd 1 sent to a file while it runs).
template <class F>
std::string stdout_of(F f) {
  const fs::path file = fs::temp_directory_path() / ("mgpu_test_stdout_" + std::to_string(getpid()));
  std::fflush(stdout);
  const int saved = dup(1);
  FILE* capture = std::fopen(file.c_str(), "w");
  dup2(fileno(capture), 1);
  f();
  std::fflush(stdout);
  dup2(saved, 1);
  close(saved);
  std::fclose(capture);
  const std::string text = read_file(file);
  fs::remove(file);
  return text;
}

TEST_CASE("--progress: on draws a live line and erases it; off draws nothing; auto, in a log, plain lines") {
  const fs::path out = fresh_folder("progress");
  mgpu::Options o;
  o.out = out.string();
  for (const auto p : {mgpu::Options::Progress::On, mgpu::Options::Progress::Off, mgpu::Options::Progress::Auto}) {
    o.progress = p;
    CAPTURE(static_cast<int>(p));
    mgpu::TrainingLog log("01_lenet", "progress", o, 1, 1000);
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
  mgpu::Options o;
  o.out = out.string();
  o.print_every = 4;
  mgpu::TrainingLog log("01_lenet", "print_every", o, 1, 1000);
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

}  // namespace
