// The command line every chapter shares, read with CLI11 (Debian's libcli11-dev):
//   -b,--batch-size N  --epochs N  --lr X  --devices K  --data-dir DIR  --limit-train N
//   --seed N  --out DIR  --run-name NAME  --progress auto|on|off  -p,--print-every N
//   --warmup-epochs N  -h,--help
// Defaults are d2l's (10 epochs, batch 256, lr 0.2). Flags are written as in most tools:
// "--epochs 3", "--epochs=3", "-b 64", "-b64"; a flag given twice keeps the last value.
// A bad value or an unknown flag prints one line that names the flag and the value, then
// "run with --help for the usage", and exits with status 2; --help prints the usage, exit 0.
//
// This header keeps CLI11 itself out of sight (its header costs seconds per file that includes
// it, and this one is included everywhere through report.h): the files that declare flags
// include <CLI/CLI.hpp>, and give CLI11 the checks below.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace CLI {  // CLI11's two types these declarations name; <CLI/CLI.hpp> defines them
class App;
class Validator;
}  // namespace CLI

namespace mgpu {

// ---- Checks of a value as typed --------------------------------------------------------------
//
// CLI11 converts a flag's text to the variable it is bound to, and takes more than a number
// typed on a command line should be: "+3" and " 3" (strtoll skips the blank), "1e3" for an
// integer, and "0064" as octal 52 (it converts integers in base 0). So every number flag runs
// one of these first, in CLI11's own way; an integer flag as a transform, which may rewrite the
// text CLI11 then converts ("0064" becomes "64"; a check's rewrite would be thrown away):
//   app.add_option("--epochs", o.epochs, "passes over the training set")->transform(mgpu::integer(1));
// A check returns "" to accept the text, or why not; CLI11 puts the flag in front of it:
//   --epochs: must be at least 1, got 0
// and it states its bounds in the usage, after the flag's type: `--epochs INT:[1, 1000000000]=10`.
using Check = CLI::Validator;

// A whole number from lo to hi, written in decimal (leading zeros allowed: "0064" is 64), handed
// on rewritten as plain decimal. Give it to ->transform(), not ->check() (see above).
Check integer(long long lo, long long hi = 1'000'000'000);
// A number from lo to hi, checked as the double it is stored in.
Check real(double lo, double hi);
// A number > 0, checked as the float it is stored in, not as the number written: "1e300" is inf
// as a float and "1e-46" is 0, and neither is what was asked for (a learning rate).
Check positive_float();
// A path: text that may not be empty nor start with "--" (a forgotten value), of at most
// kMaxPath characters and kMaxPathPart between two '/' (Linux's limits: a longer one cannot be
// opened); `what` names it: "needs a directory".
constexpr std::size_t kMaxPath = 4095, kMaxPathPart = 255;
Check text(const std::string& what);
// Letters, digits, '_', '-' and '.', not starting with '.' or '-': a name that goes into file
// names as it is (a leading '.' hides the file, a leading '-' reads as an option to gnuplot),
// and at most kMaxRunName characters.
Check file_name_part();
// The longest run name: the longest file a run writes is the name, a suffix of its own (chapter
// 08's "_staleness.png", 14 characters; 24 allowed) and, while it is written, ".<pid>.tmp" (at
// most 12 more), and a file name may have 255 bytes (NAME_MAX): 200 leaves room to spare, so a
// run never fails at its end for a name it was given at its start.
inline constexpr std::size_t kMaxRunName = 200;

// A flag that is "on" or "off", stored in `value` (whose value now is the default the usage shows):
//   mgpu::add_on_off(app, "--graph", graph, "replay one recorded training step");
void add_on_off(CLI::App& app, const std::string& name, bool& value, const std::string& help);

// Whole-string number parsing, strict: "12abc", "", "1e3" (as an integer), " 3" and "+3" (which
// strtoll and strtod would take: a value typed that way is a slip, and chapter 08 once carried
// it into a file name), out-of-range and non-finite values give nullopt.
std::optional<long long> to_integer(const std::string& s);
std::optional<double> to_real(const std::string& s);
// The shortest text that reads back as this very float: "0.2", "0.50000006", not "0.200000"
// (std::to_string) or "0.200000003": for messages that compare two values.
std::string exact_text(float v);

// ---- The shared command line ---------------------------------------------------------------

struct Options {
  int epochs = 10;
  int batch_size = 256;
  float lr = 0.2f;
  int warmup_epochs = 0;    // the rate ramps up over the first N epochs (learning_rate_at); 0: none
  int devices = 1;          // the chapter sets its own default
  std::string data_dir;     // empty: search (see fashion_mnist.h)
  int limit_train = 0;      // 0: all training images
  std::uint64_t seed = 42;
  std::string out = "results";
  bool eval_all_devices = true;  // --eval all|device0 (chapters with several devices)
  // --progress: how an epoch shows its progress while it runs (see TrainingLog::progress). Auto:
  // a live line that redraws itself on a real terminal; where the output is a log (a file, a
  // pipe, mpirun's or a scheduler's), a plain line now and then. On: the live line. Off: neither.
  enum class Progress { Auto, On, Off } progress = Progress::Auto;
  int print_every = 0;  // --print-every N: in a log, a line every N batches; 0: about every 10 s
  std::string run_name;  // --run-name NAME: the results files' name; empty: made from the settings (report.h)
};

// The rate of step `step` (0-based) of epoch `epoch`, with `steps_per_epoch` steps an epoch.
// Without warm-up, o.lr. With --warmup-epochs N, the gradual warm-up of Goyal et al. (2017):
// the rate grows linearly, o.lr * t / T for step t = 1..T of the first T = N * steps_per_epoch
// steps, then stays at o.lr. A large batch taken with a linearly scaled rate (chapter 02's
// learning-rate exercise) can diverge in its first steps, while the weights are far from any
// minimum; a few epochs of smaller steps carry it past that.
float learning_rate_at(const Options& o, int epoch, int step, int steps_per_epoch);

// What a chapter tells the parser about itself.
struct ChapterInfo {
  std::string name;         // "01_lenet": the program, the result line, the files written
  std::string summary;      // one line for --help
  int default_devices = 1;
  int max_devices = 1 << 10;  // chapter 01 trains on exactly one device
  float default_lr = 0.2f;    // d2l's LeNet rate; chapter 09's ResNet-18 recipe is 0.1
  // Whether the chapter offers --eval all|device0 (with several devices). Chapters 06-08
  // evaluate one way only (on device 0, replica 0, a worker's pull): there the flag is refused.
  bool eval_flag = true;
};

// A chapter's flags of its own, declared on the same CLI11 app as the shared ones (they land
// under "this chapter" in the usage): a function that adds them.
using OwnFlags = std::function<void(CLI::App& app)>;

// What every program's app has, before its first flag: -h/--help, and a flag given twice keeps
// its last value (CLI11's default would refuse the second).
void prepare_app(CLI::App& app);
// The shared flags, bound to `o` with the chapter's defaults (o = default_options(chapter)):
// one place where they are declared. `o` must outlive the app: CLI11 stores into it.
void add_common_flags(CLI::App& app, Options& o, const ChapterInfo& chapter);
Options default_options(const ChapterInfo& chapter);
// The checks between flags, once all are read: "" or why they do not fit together.
std::string check_options(const Options& o, const ChapterInfo& chapter);

struct ParseResult {
  Options options;
  bool help = false;     // --help was given
  std::string error;     // non-empty: why the command line was refused
};

// Reads `args` (the words after the program's name) into `app`: help, or "" when all is well,
// or the reason for refusing them. Pure (no printing, no exiting), so the tests can call it.
struct Parsed {
  bool help = false;
  std::string error;
};
Parsed parse(CLI::App& app, const std::vector<std::string>& args);

// The shared flags and `own`, parsed and checked. Pure, like parse().
ParseResult parse_options(const std::vector<std::string>& args, const ChapterInfo& chapter, const OwnFlags& own = {});
// The usage --help prints: the shared flags and `own`'s.
std::string usage(const ChapterInfo& chapter, const OwnFlags& own = {});

// For main(): parse, or refuse_command_line(); --help prints the usage and exits 0.
Options parse_command_line(int argc, char** argv, const ChapterInfo& chapter, const OwnFlags& own = {});

// What every program does with a command line it cannot run: one line on stderr,
// "<program>: <why>", then "run with --help for the usage", and exit status 2.
[[noreturn]] void refuse_command_line(const std::string& program, const std::string& why);

}  // namespace mgpu
