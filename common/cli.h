// The command line every chapter shares:
//   --epochs N  --batch-size N  --lr X  --devices K  --data-dir DIR  --limit-train N
//   --seed N  --out DIR  --progress auto|on|off  --print-every N  --warmup-epochs N  --help
// Defaults are d2l's (10 epochs, batch 256, lr 0.2). A bad value or an unknown flag
// prints the reason and the usage, and exits with status 2.
//
// Below it, the small flag parser that reads it, for any program's own flags too (chapter 03's
// benchmark uses it), so that every program of the repository reads a command line the same way.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace mgpu {

// ---- The flag parser -----------------------------------------------------------------------
//
// A program describes its flags as a table: flag -> setter. A setter stores its value, or
// returns why it refuses it (an empty string: accepted). parse_flags() reads the words in order:
//   --flag value, --flag=value   the flag's setter gets the value; "--flag --other" is refused
//                                (a forgotten value), "--flag=--x" gives a value that starts with --
//   --help, -h                   stop: the caller prints the usage
//   anything else                refused: an unknown option, a stray word
// Pure (no printing, no exiting), so the tests can call it.
using FlagSetter = std::function<std::string(const std::string& flag, const std::string& value)>;
using FlagTable = std::map<std::string, FlagSetter>;

struct FlagsResult {
  bool help = false;  // --help or -h was given
  std::string error;  // non-empty: why the command line was refused
};
FlagsResult parse_flags(const std::vector<std::string>& args, const FlagTable& flags);

// Whole-string number parsing, strict: "12abc", "", "1e3" (as an integer), " 3" and "+3" (which
// strtoll and strtod would take: a value typed that way is a slip, and chapter 08 once carried
// it into a file name), out-of-range and non-finite values give nullopt.
std::optional<long long> to_integer(const std::string& s);
std::optional<double> to_real(const std::string& s);

// Setters for the usual kinds of value. Each refusal names the flag and quotes the value.
// A whole number from lo to hi ("--epochs must be at least 1, got 0").
std::string read_integer(const std::string& flag, const std::string& value, long long lo, long long hi,
                         long long& n);
template <class Int>
FlagSetter integer_flag(Int& dst, long long lo, long long hi = 1'000'000'000) {
  return [&dst, lo, hi](const std::string& flag, const std::string& value) {
    long long n = 0;
    std::string why = read_integer(flag, value, lo, hi, n);
    if (why.empty()) dst = static_cast<Int>(n);
    return why;
  };
}
// A real number, checked as the float or double it is stored in, not as the number written:
// "1e300" is inf as a float and "1e-46" is 0, and neither is what was asked for.
FlagSetter positive_real_flag(float& dst);                  // > 0 (a learning rate)
FlagSetter real_flag(double& dst, double lo, double hi);  // from lo to hi
// Text that may not be empty (a directory, a file); `what` names it: "--out needs a directory".
FlagSetter text_flag(std::string& dst, const std::string& what);

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

struct ParseResult {
  Options options;
  bool help = false;     // --help was given
  std::string error;     // non-empty: why the command line was refused
};

// Pure function (no printing, no exiting), so the tests can call it. `own`: a chapter's flags
// of its own, read beside the shared ones (their setters store into the chapter's variables).
ParseResult parse_options(const std::vector<std::string>& args, const ChapterInfo& chapter,
                          const FlagTable& own = {});

// The pieces of parse_options, for a program that reads its command line its own way (chapter
// 05, under MPI): start from default_options(chapter), add its flags to
// common_flags(options, chapter), call parse_flags() once, then check_options() (the checks
// between flags, once all are read).
Options default_options(const ChapterInfo& chapter);
FlagTable common_flags(Options& o, const ChapterInfo& chapter);
std::string check_options(const Options& o, const ChapterInfo& chapter);

// The shared flags' usage; with `own_usage` (the lines of a chapter's own flags) after it,
// under "this chapter:".
std::string usage(const ChapterInfo& chapter, const std::string& own_usage = "");

// For main(): parse, or print the reason and the usage and exit(2); --help exits 0. `own` and
// `own_usage`: the chapter's own flags, as for parse_options() and usage().
Options parse_command_line(int argc, char** argv, const ChapterInfo& chapter, const FlagTable& own = {},
                           const std::string& own_usage = "");

}  // namespace mgpu
