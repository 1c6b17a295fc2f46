// plot_runs: several runs' CSVs in one picture, as every run draws its own (common/report.h's
// plot_runs: the training loss, training accuracy and test accuracy per epoch, and the seconds
// per epoch beside them), to compare one's own runs or a run with its PyTorch twin's.
//
//   build/bin/plot_runs --out results/lr.png results/01_lenet.csv results/01_lenet_lr-0.5.csv
//   build/bin/plot_runs --out cmp.png --title "C++ vs PyTorch" a.csv=ours b.csv=PyTorch
//
// Each CSV is a run's `<run>.csv` as the chapters write it (header
// epoch,train_loss,train_acc,test_acc,seconds,in_sec_per_epoch); `=LABEL` names its curves
// (default: the file's name without .csv). The CSVs are copied beside the picture (as
// NAME_1.csv, NAME_2.csv, ...), with the gnuplot script NAME.gp: the folder then holds all a
// reader needs to restyle and redraw it, and no path typed here reaches gnuplot.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "common/cli.h"      // prepare_app, parse, refuse_command_line: the chapters' conventions
#include "common/program.h"  // start_program, run_or_report
#include "common/report.h"   // plot_runs, write_whole_file

namespace fs = std::filesystem;

namespace {

const char* kHeader = "epoch,train_loss,train_acc,test_acc,seconds,in_sec_per_epoch";

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// "" when `text` is a run's CSV with at least one epoch; otherwise what is wrong with it.
std::string check_run_csv(const std::string& text) {
  std::istringstream in(text);
  std::string header, row;
  std::getline(in, header);
  if (!header.empty() && header.back() == '\r') header.pop_back();
  if (header != kHeader) return "its first line is not a run's CSV header (" + std::string(kHeader) + ")";
  if (!std::getline(in, row) || row.empty()) return "it holds no epoch";
  return "";
}

const std::string kProgram = "plot_runs";

// What to draw: the picture, its title, and each run's label, its CSV's text and where its copy
// beside the picture goes.
struct Request {
  fs::path png;
  std::string title;
  std::vector<std::pair<std::string, std::string>> runs;  // label, the copy beside the picture
  std::vector<std::string> texts;                          // each run's CSV, read and checked
};

// The command line, every CSV read and checked: a bad one is refused (exit 2) before anything is written.
Request parse_request(int argc, char** argv) {
  std::string out, title;
  std::vector<std::string> runs_given;
  CLI::App app{"Draws several runs' CSVs in one picture: training loss, training accuracy and test accuracy "
               "per epoch, and the seconds per epoch",
               kProgram};
  mgpu::prepare_app(app);
  app.add_option("--out", out, "the picture to write, FOLDER/NAME.png (the folder is made if need be)")
      ->required()
      ->check(mgpu::text("a file name ending in .png"));
  app.add_option("--title", title, "the picture's title (default: the labels)");
  app.add_option("runs", runs_given, "RUN.csv or RUN.csv=LABEL, one per run (a run's CSV as the chapters write it)")
      ->required();
  const mgpu::Parsed parsed = mgpu::parse(app, std::vector<std::string>(argv + 1, argv + argc));
  if (parsed.help) {
    std::printf("%s", app.help().c_str());
    std::exit(0);
  }
  if (!parsed.error.empty()) mgpu::refuse_command_line(kProgram, parsed.error);

  Request r;
  r.png = fs::path(out);
  if (r.png.extension() != ".png") mgpu::refuse_command_line(kProgram, "--out " + out + ": the picture's name must end in .png");
  // Its files are the name with _N.csv and .gp, written through a temporary ".<pid>.tmp": the
  // same bound as a run's name (common/cli.h), so that none fails for its length half way.
  if (r.png.stem().string().size() > mgpu::kMaxRunName)
    mgpu::refuse_command_line(kProgram, "--out " + out + ": a picture's name of " + std::to_string(r.png.stem().string().size()) +
                                            " characters; at most " + std::to_string(mgpu::kMaxRunName));
  const fs::path folder = r.png.has_parent_path() ? r.png.parent_path() : fs::path(".");
  for (const std::string& given : runs_given) {
    const std::size_t eq = given.rfind('=');
    const fs::path csv = eq == std::string::npos ? fs::path(given) : fs::path(given.substr(0, eq));
    const std::string label = eq == std::string::npos ? csv.stem().string() : given.substr(eq + 1);
    if (label.empty() || label.find('\'') != std::string::npos || mgpu::has_control_character(label))
      mgpu::refuse_command_line(kProgram, given + ": a label may not be empty, nor hold a quote or a control character (a new line)");
    if (!fs::is_regular_file(csv)) mgpu::refuse_command_line(kProgram, csv.string() + ": not a file");
    const std::string text = read_text(csv);
    if (const std::string why = check_run_csv(text); !why.empty())
      mgpu::refuse_command_line(kProgram, csv.string() + ": " + why);
    r.texts.push_back(text);
    r.runs.emplace_back(label, (folder / (r.png.stem().string() + "_" + std::to_string(r.runs.size() + 1) + ".csv")).string());
  }
  r.title = title;
  if (r.title.empty())
    for (const auto& run : r.runs) r.title += (r.title.empty() ? "" : " vs ") + run.first;
  if (r.title.find('\'') != std::string::npos || mgpu::has_control_character(r.title))
    mgpu::refuse_command_line(kProgram, "--title may not hold a quote or a control character (a new line)");
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  mgpu::start_program(argv);  // line-buffered output, and a failed write of it fails the program
  const Request r = parse_request(argc, argv);
  return mgpu::run_or_report(kProgram, [&] {
    const fs::path folder = r.png.has_parent_path() ? r.png.parent_path() : fs::path(".");
    mgpu::prepare_output_folder(folder.string());  // made, or refused with the reason
    for (std::size_t i = 0; i < r.runs.size(); ++i) mgpu::write_whole_file(r.runs[i].second, r.texts[i]);
    if (!mgpu::plot_runs(r.png.string(), r.title, r.runs)) return 1;  // gnuplot missing or failing: it said why
    std::printf("wrote %s (and beside it the runs' CSVs and the gnuplot script %s)\n", r.png.string().c_str(),
                fs::path(r.png).replace_extension(".gp").filename().string().c_str());
    return 0;
  });
}
