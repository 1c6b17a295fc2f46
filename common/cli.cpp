#include "cli.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

namespace mgpu {

// ---- The flag parser -----------------------------------------------------------------------

namespace {

// "--epochs" is an option; "-3" is a value (a negative number), and so is any other word.
bool is_option(const std::string& word) { return word.rfind("--", 0) == 0; }

// 1000000 rather than 1e+06, and 3.40282e+38 rather than 39 digits.
std::string number_text(double x) {
  char buf[32];
  const bool whole = std::abs(x) < 1e15 && x == std::floor(x);
  std::snprintf(buf, sizeof buf, whole ? "%.0f" : "%g", x);
  return buf;
}

// Why `x`, written `value`, changes when stored as a Real ("" if it does not): too large, it
// becomes inf; too small, 0 or a denormal (fewer significant digits than written).
template <class Real>
std::string check_fits(const std::string& flag, const std::string& value, double x) {
  const Real r = static_cast<Real>(x);
  const char* type = sizeof(Real) == sizeof(float) ? "a float" : "a double";
  if (!std::isfinite(r))
    return flag + " " + value + " is too large for " + type + " (at most " +
           number_text(std::numeric_limits<Real>::max()) + ")";
  if (x != 0 && !std::isnormal(r))
    return flag + " " + value + " is too small for " + type + " (at least " +
           number_text(std::numeric_limits<Real>::min()) + ")";
  return "";
}

}  // namespace

FlagsResult parse_flags(const std::vector<std::string>& args, const FlagTable& flags) {
  FlagsResult r;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& word = args[i];
    if (word == "--help" || word == "-h") {
      r.help = true;
      return r;
    }
    // "--epochs=3" carries its value; "--epochs 3" takes the next word.
    const std::size_t eq = word.find('=');
    const bool inline_value = is_option(word) && eq != std::string::npos;
    const std::string flag = inline_value ? word.substr(0, eq) : word;
    const auto it = flags.find(flag);
    if (it == flags.end()) {
      r.error = (word.rfind('-', 0) == 0 ? "unknown option '" : "unexpected argument '") + word + "'";
      return r;
    }
    std::string value;
    if (inline_value) {
      value = word.substr(eq + 1);
    } else if (i + 1 == args.size()) {
      r.error = flag + " needs a value";
      return r;
    } else if (is_option(args[i + 1])) {
      // "--out --epochs 3": the value was forgotten; taking "--epochs" as it would misreport the "3".
      r.error = flag + " needs a value, got the option '" + args[i + 1] + "'";
      return r;
    } else {
      value = args[++i];
    }
    r.error = it->second(flag, value);
    if (!r.error.empty()) return r;
  }
  return r;
}

namespace {

// What strtoll and strtod accept but a number typed on a command line should not start with:
// white space (they skip it) and '+'.
bool starts_as_a_number(const std::string& s) {
  return !s.empty() && (std::isdigit(static_cast<unsigned char>(s[0])) || s[0] == '-' || s[0] == '.');
}

}  // namespace

std::optional<long long> to_integer(const std::string& s) {
  if (!starts_as_a_number(s)) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (errno != 0 || *end != '\0') return std::nullopt;
  return v;
}

std::optional<double> to_real(const std::string& s) {
  if (!starts_as_a_number(s)) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (errno != 0 || *end != '\0' || !std::isfinite(v)) return std::nullopt;
  return v;
}

std::string read_integer(const std::string& flag, const std::string& value, long long lo, long long hi,
                         long long& n) {
  const auto v = to_integer(value);
  if (!v) return flag + " needs an integer, got '" + value + "'";
  if (*v < lo)
    return flag + " must be " + (lo == 0 ? "zero or more" : "at least " + std::to_string(lo)) + ", got " + value;
  if (*v > hi) return flag + " must be at most " + std::to_string(hi) + ", got " + value;
  n = *v;
  return "";
}

FlagSetter positive_real_flag(float& dst) {
  return [&dst](const std::string& flag, const std::string& value) -> std::string {
    const auto x = to_real(value);
    if (!x) return flag + " needs a number, got '" + value + "'";
    if (*x <= 0) return flag + " must be positive, got " + value;
    if (std::string why = check_fits<float>(flag, value, *x); !why.empty()) return why;
    dst = static_cast<float>(*x);
    return "";
  };
}

FlagSetter real_flag(double& dst, double lo, double hi) {
  return [&dst, lo, hi](const std::string& flag, const std::string& value) -> std::string {
    const auto x = to_real(value);
    if (!x) return flag + " needs a number, got '" + value + "'";
    if (*x < lo)
      return flag + " must be " + (lo == 0 ? "zero or more" : "at least " + number_text(lo)) + ", got " + value;
    if (*x > hi) return flag + " must be at most " + number_text(hi) + ", got " + value;
    if (std::string why = check_fits<double>(flag, value, *x); !why.empty()) return why;
    dst = *x;
    return "";
  };
}

FlagSetter text_flag(std::string& dst, const std::string& what) {
  return [&dst, what](const std::string& flag, const std::string& value) -> std::string {
    if (value.empty()) return flag + " needs " + what;
    dst = value;
    return "";
  };
}

// ---- The shared command line ---------------------------------------------------------------

float learning_rate_at(const Options& o, int epoch, int step, int steps_per_epoch) {
  const long long warmup_steps = static_cast<long long>(o.warmup_epochs) * steps_per_epoch;
  const long long t = static_cast<long long>(epoch) * steps_per_epoch + step + 1;  // 1-based
  if (t >= warmup_steps) return o.lr;
  return static_cast<float>(static_cast<double>(o.lr) * static_cast<double>(t) / static_cast<double>(warmup_steps));
}

std::string usage(const ChapterInfo& c, const std::string& own_usage) {
  std::string u = "usage: " + c.name + " [options]\n  " + c.summary +
                  "\n\noptions (--flag value or --flag=value):\n";
  u += "  --epochs N        passes over the training set (default 10)\n";
  u += "  --batch-size N    examples per step, summed over all devices (default 256)\n";
  char lr[32];
  std::snprintf(lr, sizeof lr, "%g", c.default_lr);
  u += "  --lr X            SGD learning rate, a positive float (default " + std::string(lr) + ")\n";
  u += "  --devices K       logical devices to train on (default " + std::to_string(c.default_devices) +
       (c.max_devices == 1 ? "; this chapter uses exactly one)\n" : ")\n");
  u += "  --data-dir DIR    Fashion-MNIST directory (default: search, see data/README.md)\n";
  u += "  --limit-train N   use only the first N training images (default 0: all)\n";
  u += "  --warmup-epochs N raise the rate linearly to --lr over the first N epochs (default 0: none)\n";
  u += "  --seed N          seed for the initial weights and the shuffling (default 42)\n";
  u += "  --out DIR         where the CSV and the plot go (default results/)\n";
  u += "  --run-name NAME   name the results files NAME.csv, .json, .png (default: from the settings)\n";
  u += "  --progress P      auto, on or off: how an epoch shows its progress (default auto: a live\n"
       "                    line on a terminal; in a log, mpirun's or srun's too, a plain line now and then)\n";
  u += "  --print-every N   in a log, a progress line every N batches (default 0: about every 10 s)\n";
  if (c.max_devices > 1 && c.eval_flag)
    u += "  --eval all|device0  test accuracy on all devices (default) or on device 0 only, as d2l\n";
  u += "  --help, -h        this text\n";
  if (!own_usage.empty()) u += "\nthis chapter:\n" + own_usage;
  return u;
}

Options default_options(const ChapterInfo& chapter) {
  Options o;
  o.devices = chapter.default_devices;
  o.lr = chapter.default_lr;
  return o;
}

FlagTable common_flags(Options& o, const ChapterInfo& chapter) {
  return {
      {"--epochs", integer_flag(o.epochs, 1)},
      {"--batch-size", integer_flag(o.batch_size, 1)},
      {"--devices", integer_flag(o.devices, 1)},
      {"--limit-train", integer_flag(o.limit_train, 0)},
      {"--print-every", integer_flag(o.print_every, 0)},
      {"--warmup-epochs", integer_flag(o.warmup_epochs, 0)},
      {"--seed", integer_flag(o.seed, 0, std::numeric_limits<long long>::max())},
      {"--lr", positive_real_flag(o.lr)},
      {"--data-dir", text_flag(o.data_dir, "a directory")},
      {"--out", text_flag(o.out, "a directory")},
      {"--run-name",
       [&o](const std::string& flag, const std::string& v) -> std::string {
         if (v.empty() || v.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.") !=
                              std::string::npos || v[0] == '.' || v[0] == '-')
           return flag + " takes letters, digits, '_', '-' and '.', not first a '.' or '-', got '" + v + "'";
         o.run_name = v;
         return "";
       }},
      {"--progress",
       [&o](const std::string& flag, const std::string& v) -> std::string {
         if (v == "auto") o.progress = Options::Progress::Auto;
         else if (v == "on") o.progress = Options::Progress::On;
         else if (v == "off") o.progress = Options::Progress::Off;
         else return flag + " must be 'auto', 'on' or 'off', got '" + v + "'";
         return "";
       }},
      {"--eval",
       [&o, several = chapter.max_devices > 1, offered = chapter.eval_flag,
        name = chapter.name](const std::string& flag, const std::string& v) -> std::string {
         if (!several) return flag + " is for chapters with several devices";
         if (!offered) return flag + " is not an option of " + name + ": it computes test accuracy one way only";
         if (v != "all" && v != "device0") return flag + " must be 'all' or 'device0', got '" + v + "'";
         o.eval_all_devices = v == "all";
         return "";
       }},
  };
}

std::string check_options(const Options& o, const ChapterInfo& chapter) {
  if (o.devices > chapter.max_devices)
    return chapter.name + " trains on " + std::to_string(chapter.max_devices) + " device(s); --devices " +
           std::to_string(o.devices) + " is not possible here" +
           (chapter.max_devices == 1 ? " (chapter 02 splits a batch across devices)" : "");
  if (o.warmup_epochs > o.epochs)
    return "--warmup-epochs " + std::to_string(o.warmup_epochs) + " is more than --epochs " +
           std::to_string(o.epochs) + ": the rate would never reach --lr";
  if (o.batch_size < o.devices)
    return "--batch-size " + std::to_string(o.batch_size) + " is smaller than --devices " +
           std::to_string(o.devices) + ": every device needs at least one example";
  return "";
}

ParseResult parse_options(const std::vector<std::string>& args, const ChapterInfo& chapter, const FlagTable& own) {
  ParseResult r;
  r.options = default_options(chapter);
  FlagTable flags = common_flags(r.options, chapter);
  flags.insert(own.begin(), own.end());
  const FlagsResult f = parse_flags(args, flags);
  r.help = f.help;
  r.error = f.error;
  if (!r.help && r.error.empty()) r.error = check_options(r.options, chapter);
  return r;
}

Options parse_command_line(int argc, char** argv, const ChapterInfo& chapter, const FlagTable& own,
                           const std::string& own_usage) {
  const ParseResult r = parse_options(std::vector<std::string>(argv + 1, argv + argc), chapter, own);
  if (r.help) {
    std::fputs(usage(chapter, own_usage).c_str(), stdout);
    std::exit(0);
  }
  if (!r.error.empty()) {
    std::fprintf(stderr, "%s: %s\n\n%s", chapter.name.c_str(), r.error.c_str(), usage(chapter, own_usage).c_str());
    std::exit(2);
  }
  return r.options;
}

}  // namespace mgpu
