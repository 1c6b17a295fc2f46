#include "cli.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <charconv>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

namespace mgpu {

// ---- Checks of a value as typed --------------------------------------------------------------

namespace {

// What strtoll and strtod accept but a number typed on a command line should not start with:
// white space (they skip it) and '+'.
bool starts_as_a_number(const std::string& s) {
  return !s.empty() && (std::isdigit(static_cast<unsigned char>(s[0])) || s[0] == '-' || s[0] == '.');
}

// 1000000 rather than 1e+06, and 3.40282e+38 rather than 39 digits.
std::string number_text(double x) {
  char buf[32];
  const bool whole = std::abs(x) < 1e15 && x == std::floor(x);
  std::snprintf(buf, sizeof buf, whole ? "%.0f" : "%g", x);
  return buf;
}

std::string at_least(double lo) { return lo == 0 ? "zero or more" : "at least " + number_text(lo); }

// Why `x`, written `value`, changes when stored as a Real ("" if it does not): too large, it
// becomes inf; too small, 0 or a denormal (fewer significant digits than written).
template <class Real>
std::string check_fits(const std::string& value, double x) {
  const Real r = static_cast<Real>(x);
  const char* type = sizeof(Real) == sizeof(float) ? "a float" : "a double";
  if (!std::isfinite(r))
    return value + " is too large for " + type + " (at most " + number_text(std::numeric_limits<Real>::max()) + ")";
  if (x != 0 && !std::isnormal(r))
    return value + " is too small for " + type + " (at least " + number_text(std::numeric_limits<Real>::min()) + ")";
  return "";
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

std::string exact_text(float v) {
  char text[32];
  return std::string(text, std::to_chars(text, text + sizeof text, v).ptr);
}

std::optional<double> to_real(const std::string& s) {
  // Decimal only, as the integers are: strtod would also read C's hexadecimal floats (0x1p-3).
  if (!starts_as_a_number(s) || s.find_first_of("xX") != std::string::npos) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (errno != 0 || *end != '\0' || !std::isfinite(v)) return std::nullopt;
  return v;
}

namespace {
// A check from its test of the text and the bounds the usage states ("" for none).
Check check(std::function<std::string(const std::string&)> test, const std::string& bounds) {
  return CLI::Validator([test](std::string& value) { return test(value); }, bounds);
}
}  // namespace

Check integer(long long lo, long long hi) {
  // An accepted value is handed on rewritten in plain decimal: CLI11 then converts the text with
  // strtoll in base 0, which reads "0064" as octal 52 and "0x40" as hexadecimal. So whatever the
  // spelling this check accepts ("0064"), the number stored is the one it checked (64).
  return CLI::Validator(
      [lo, hi](std::string& value) -> std::string {
        const auto v = to_integer(value);
        if (!v) return "needs an integer, got '" + value + "'";
        if (*v < lo) return "must be " + at_least(static_cast<double>(lo)) + ", got " + value;
        if (*v > hi) return "must be at most " + std::to_string(hi) + ", got " + value;
        value = std::to_string(*v);
        return "";
      },
      "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
}

Check real(double lo, double hi) {
  return check([lo, hi](const std::string& value) -> std::string {
    const auto x = to_real(value);
    if (!x) return "needs a number, got '" + value + "'";
    if (*x < lo) return "must be " + at_least(lo) + ", got " + value;
    if (*x > hi) return "must be at most " + number_text(hi) + ", got " + value;
    return check_fits<double>(value, *x);
  }, "[" + number_text(lo) + ", " + number_text(hi) + "]");
}

Check positive_float() {
  return check([](const std::string& value) -> std::string {
    const auto x = to_real(value);
    if (!x) return "needs a number, got '" + value + "'";
    if (*x <= 0) return "must be positive, got " + value;
    return check_fits<float>(value, *x);
  }, "positive");
}

Check text(const std::string& what) {
  return check([what](const std::string& value) -> std::string {
    if (value.empty()) return "needs " + what;
    // CLI11, as getopt, takes the next word as the value whatever it is: in "--out --epochs 3"
    // the value was forgotten, and a folder called "--epochs" is not what was meant.
    if (value.rfind("--", 0) == 0) return "needs " + what + ", got the option '" + value + "'";
    // The system's limits (Linux's PATH_MAX and NAME_MAX): a longer path cannot be opened at all.
    // Refused here, naming its start, rather than in a message that quotes all of it later.
    const std::string start = value.substr(0, 40) + "...";
    if (value.size() > kMaxPath)
      return "needs " + what + ", got a path of " + std::to_string(value.size()) + " characters (" + start +
             "); at most " + std::to_string(kMaxPath);
    for (std::size_t begin = 0; begin < value.size();) {
      const std::size_t end = std::min(value.find('/', begin), value.size());
      if (end - begin > kMaxPathPart)
        return "needs " + what + ", got a name of " + std::to_string(end - begin) + " characters in the path (" +
               start + "); at most " + std::to_string(kMaxPathPart) + " between two '/'";
      begin = end + 1;
    }
    return "";
  }, "");
}

Check file_name_part() {
  return check([](const std::string& value) -> std::string {
    if (value.empty()) return "needs a name";
    for (const char c : value)
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-' && c != '.')
        return "'" + value + "' may hold only letters, digits, '_', '-' and '.' (it names files)";
    // ".name" would hide the files; "-name" reads as an option to the tools run on them (gnuplot).
    if (value[0] == '.' || value[0] == '-') return "'" + value + "' may not start with '.' or '-' (it names files)";
    if (value.size() > kMaxRunName)
      return "a name of " + std::to_string(value.size()) + " characters; at most " + std::to_string(kMaxRunName) +
             " (the run's files add their suffixes to it, and a file name may have 255)";
    return "";
  }, "");
}

void add_on_off(CLI::App& app, const std::string& name, bool& value, const std::string& help) {
  app.add_option_function<std::string>(name, [&value](const std::string& v) { value = v == "on"; }, help)
      ->check(CLI::IsMember({"on", "off"}))
      ->default_str(value ? "on" : "off");
}

// ---- The shared command line ---------------------------------------------------------------

float learning_rate_at(const Options& o, int epoch, int step, int steps_per_epoch) {
  const long long warmup_steps = static_cast<long long>(o.warmup_epochs) * steps_per_epoch;
  const long long t = static_cast<long long>(epoch) * steps_per_epoch + step + 1;  // 1-based
  if (t >= warmup_steps) return o.lr;
  return static_cast<float>(static_cast<double>(o.lr) * static_cast<double>(t) / static_cast<double>(warmup_steps));
}

void prepare_app(CLI::App& app) {
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast)->group("options");
  // -h answers as soon as it is read, before the checks of the flags around it run: CLI11's own
  // help flag would wait for them ("--epochs 0 --help" would be refused, not explained).
  app.set_help_flag();
  app.add_flag_callback("-h,--help", [] { throw CLI::CallForHelp(); }, "print this usage and exit")
      ->trigger_on_parse();
}

Options default_options(const ChapterInfo& chapter) {
  Options o;
  o.devices = chapter.default_devices;
  o.lr = chapter.default_lr;
  return o;
}

void add_common_flags(CLI::App& app, Options& o, const ChapterInfo& chapter) {
  // Each flag: its names (a short one only where d2l's and PyTorch's scripts use it: -b for the
  // batch size, -p for how often to print), the variable CLI11 stores into, the usage line, the
  // check of the text as typed, and the default shown in the usage (`=256`).
  app.add_option("--epochs", o.epochs, "passes over the training set")->transform(integer(1))->capture_default_str();
  app.add_option("-b,--batch-size", o.batch_size, "examples per step, summed over all devices")
      ->transform(integer(1))
      ->capture_default_str();
  app.add_option("--lr", o.lr, "SGD learning rate, a positive float")->check(positive_float())->capture_default_str();
  app.add_option("--devices", o.devices,
                 chapter.max_devices == 1 ? "logical devices to train on (this chapter uses exactly one)"
                                          : "logical devices to train on")
      // The chapter's own bound in the usage; a larger count is refused by check_options, saying why.
      ->transform(integer(1).description("[1, " + std::to_string(chapter.max_devices) + "]"))
      ->capture_default_str();
  app.add_option("--data-dir", o.data_dir, "Fashion-MNIST's directory (default: search, see data/README.md)")
      ->check(text("a directory"));
  app.add_option("--limit-train", o.limit_train, "use only the first N training images (0: all)")
      ->transform(integer(0))
      ->capture_default_str();
  app.add_option("--warmup-epochs", o.warmup_epochs, "raise the rate linearly to --lr over the first N epochs")
      ->transform(integer(0))
      ->capture_default_str();
  app.add_option("--seed", o.seed, "seed for the initial weights and the shuffling")
      ->transform(integer(0, std::numeric_limits<long long>::max()))
      ->capture_default_str();
  app.add_option("--out", o.out, "where the CSV and the plot go")->check(text("a directory"))->capture_default_str();
  app.add_option("--run-name", o.run_name,
                 "name this run's results files (default: derived from the settings)")
      ->check(file_name_part());
  // A choice is read as text, checked against its names (CLI11's IsMember, which the usage shows
  // as {auto,on,off}), then stored as what it means.
  app.add_option_function<std::string>(
         "--progress",
         [&o](const std::string& v) {
           o.progress = v == "on" ? Options::Progress::On : v == "off" ? Options::Progress::Off : Options::Progress::Auto;
         },
         "how an epoch shows its progress: a live line on a terminal and a plain one now and then in a log "
         "(auto), the live line (on), or none (off)")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->default_str("auto");
  app.add_option("-p,--print-every", o.print_every, "in a log, a progress line every N batches (0: about every 10 s)")
      ->transform(integer(0))
      ->capture_default_str();
  // --eval is offered where there are several devices to evaluate on and the chapter can use
  // either way. Elsewhere it is still declared, out of the usage (no group), so that it is
  // refused with the reason rather than as an unknown flag.
  if (chapter.max_devices > 1 && chapter.eval_flag) {
    app.add_option_function<std::string>(
           "--eval", [&o](const std::string& v) { o.eval_all_devices = v == "all"; },
           "test accuracy on all devices, or on device 0 only, as d2l")
        ->check(CLI::IsMember({"all", "device0"}))
        ->default_str("all");
  } else {
    const std::string why = chapter.max_devices == 1
                                ? "--eval is for chapters with several devices"
                                : "--eval is not an option of " + chapter.name + ": it computes test accuracy one way only";
    app.add_option_function<std::string>("--eval", [why](const std::string&) { throw CLI::ValidationError(why); })
        ->group("");
  }
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

namespace {

// The command line with every occurrence but the last of each flag that takes one value left
// out: a flag given twice keeps its last value, and only that value is checked (CLI11 checks
// every occurrence before it keeps the last: "--epochs 0 --epochs 3" would be refused).
// A flag is found by its long name (--epochs 3, --epochs=3) or short one (-b 64, -b64); its
// value is the next word unless given inline. Words that are no flag stay where they are.
std::vector<std::string> last_of_each_flag(const CLI::App& app, const std::vector<std::string>& args) {
  struct Occurrence {
    const CLI::Option* option;
    std::size_t begin, end;  // its words: [begin, end)
  };
  std::vector<Occurrence> found;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& w = args[i];
    if (w == "--") break;  // the rest is not flags
    const CLI::Option* option = nullptr;
    bool inline_value = false;
    for (const CLI::Option* o : app.get_options()) {
      if (o->get_items_expected_max() != 1) continue;  // flags without a value, lists
      if (w.rfind("--", 0) == 0) {
        const std::size_t eq = w.find('=');
        const std::string name = w.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
        const auto& names = o->get_lnames();
        if (std::find(names.begin(), names.end(), name) == names.end()) continue;
        inline_value = eq != std::string::npos;
      } else if (w.size() >= 2 && w[0] == '-' && w[1] != '-') {
        const auto& names = o->get_snames();
        if (std::find(names.begin(), names.end(), w.substr(1, 1)) == names.end()) continue;
        inline_value = w.size() > 2;
      } else {
        continue;
      }
      option = o;
      break;
    }
    if (!option) continue;
    const std::size_t end = inline_value ? i + 1 : std::min(i + 2, args.size());
    found.push_back({option, i, end});
    i = end - 1;
  }
  std::vector<bool> left_out(args.size(), false);
  for (std::size_t a = 0; a < found.size(); ++a)
    for (std::size_t b = a + 1; b < found.size(); ++b)
      if (found[b].option == found[a].option) {
        for (std::size_t i = found[a].begin; i < found[a].end; ++i) left_out[i] = true;
        break;
      }
  std::vector<std::string> kept;
  for (std::size_t i = 0; i < args.size(); ++i)
    if (!left_out[i]) kept.push_back(args[i]);
  return kept;
}

}  // namespace

Parsed parse(CLI::App& app, const std::vector<std::string>& args) {
  // "--out=" gives --out an empty value; CLI11 would take the next word for it instead.
  for (const std::string& w : args) {
    if (w == "--") break;
    if (w.size() > 3 && w.rfind("--", 0) == 0 && w.back() == '=' && w.find('=') == w.size() - 1)
      for (const CLI::Option* o : app.get_options())
        if (o->check_lname(w.substr(2, w.size() - 3)))
          return {false, w.substr(0, w.size() - 1) + " needs a value, got none after '='"};
  }
  const std::vector<std::string> last = last_of_each_flag(app, args);
  // CLI11 reads a vector from its back: the first word goes last.
  std::vector<std::string> words(last.rbegin(), last.rend());
  try {
    app.parse(words);
  } catch (const CLI::CallForHelp&) {
    return {true, ""};
  } catch (const CLI::ExtrasError&) {
    // CLI11 says "The following arguments were not expected: ..."; name the first word of the
    // command line among those it could not place.
    const std::vector<std::string> rest = app.remaining();
    const auto first = std::find_first_of(args.begin(), args.end(), rest.begin(), rest.end());
    const std::string word = first != args.end() ? *first : rest.empty() ? "?" : rest.front();
    return {false, (word.rfind('-', 0) == 0 ? "unknown option '" : "unexpected argument '") + word + "'"};
  } catch (const CLI::ArgumentMismatch& e) {
    // "--seed: 1 required UINT missing": the flag was given without its value.
    const std::string what = e.what();
    if (what.find("missing") == std::string::npos) return {false, what};
    return {false, what.substr(0, what.find(':')) + " needs a value"};
  } catch (const CLI::ParseError& e) {
    return {false, e.what()};
  }
  return {};
}

namespace {

// The app of a chapter: the shared flags under "options", the chapter's own under "this chapter".
void declare(CLI::App& app, Options& o, const ChapterInfo& chapter, const OwnFlags& own) {
  prepare_app(app);
  add_common_flags(app, o, chapter);
  app.option_defaults()->group("this chapter");
  if (own) own(app);
}

}  // namespace

ParseResult parse_options(const std::vector<std::string>& args, const ChapterInfo& chapter, const OwnFlags& own) {
  ParseResult r;
  r.options = default_options(chapter);
  CLI::App app{chapter.summary, chapter.name};
  declare(app, r.options, chapter, own);
  const Parsed p = parse(app, args);
  r.help = p.help;
  r.error = p.error;
  if (!r.help && r.error.empty()) r.error = check_options(r.options, chapter);
  return r;
}

std::string usage(const ChapterInfo& chapter, const OwnFlags& own) {
  Options o = default_options(chapter);
  CLI::App app{chapter.summary, chapter.name};
  declare(app, o, chapter, own);
  return app.help();
}

Options parse_command_line(int argc, char** argv, const ChapterInfo& chapter, const OwnFlags& own) {
  const ParseResult r = parse_options(std::vector<std::string>(argv + 1, argv + argc), chapter, own);
  if (r.help) {
    std::fputs(usage(chapter, own).c_str(), stdout);
    std::exit(0);
  }
  if (!r.error.empty()) refuse_command_line(chapter.name, r.error);
  return r.options;
}

void refuse_command_line(const std::string& program, const std::string& why) {
  std::fprintf(stderr, "%s: %s\nrun with --help for the usage\n", program.c_str(), why.c_str());
  std::exit(2);
}

}  // namespace mgpu
