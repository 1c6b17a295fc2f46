// The command line every chapter shares:
//   --epochs N  --batch-size N  --lr X  --devices K  --data-dir DIR  --limit-train N
//   --seed N  --out DIR  --help
// Defaults are d2l's (10 epochs, batch 256, lr 0.2). A bad value or an unknown flag
// prints the reason and the usage, and exits with status 2.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace mgpu {

struct Options {
  int epochs = 10;
  int batch_size = 256;
  float lr = 0.2f;
  int devices = 1;          // the chapter sets its own default
  std::string data_dir;     // empty: search (see fashion_mnist.h)
  int limit_train = 0;      // 0: all training images
  std::uint64_t seed = 42;
  std::string out = "results";
  bool eval_all_devices = true;  // --eval all|device0 (chapters with several devices)
};

// What a chapter tells the parser about itself.
struct ChapterInfo {
  std::string name;         // "01_lenet": the program, the result line, the files written
  std::string summary;      // one line for --help
  int default_devices = 1;
  int max_devices = 1 << 10;  // chapter 01 trains on exactly one device
};

struct ParseResult {
  Options options;
  bool help = false;     // --help was given
  std::string error;     // non-empty: why the command line was refused
};

// Pure function (no printing, no exiting), so the tests can call it.
ParseResult parse_options(const std::vector<std::string>& args, const ChapterInfo& chapter);

std::string usage(const ChapterInfo& chapter);

// Whole-string number parsing, for any program's own flags: "12abc", "", "1e3" (as an
// integer), out-of-range and non-finite values give nullopt.
std::optional<long long> to_integer(const std::string& s);
std::optional<double> to_real(const std::string& s);

// For main(): parse, or print the reason and the usage and exit(2); --help exits 0.
Options parse_command_line(int argc, char** argv, const ChapterInfo& chapter);

}  // namespace mgpu
