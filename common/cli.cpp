#include "cli.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>

namespace mgpu {

std::optional<long long> to_integer(const std::string& s) {
  if (s.empty()) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (errno != 0 || *end != '\0') return std::nullopt;
  return v;
}

std::optional<double> to_real(const std::string& s) {
  if (s.empty()) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (errno != 0 || *end != '\0' || !std::isfinite(v)) return std::nullopt;
  return v;
}

std::string usage(const ChapterInfo& c) {
  std::string u = "usage: " + c.name + " [options]\n  " + c.summary + "\n\noptions:\n";
  u += "  --epochs N        passes over the training set (default 10)\n";
  u += "  --batch-size N    examples per step, summed over all devices (default 256)\n";
  u += "  --lr X            SGD learning rate (default 0.2)\n";
  u += "  --devices K       logical devices to train on (default " + std::to_string(c.default_devices) +
       (c.max_devices == 1 ? "; this chapter uses exactly one)\n" : ")\n");
  u += "  --data-dir DIR    Fashion-MNIST directory (default: search, see data/README.md)\n";
  u += "  --limit-train N   use only the first N training images (default 0: all)\n";
  u += "  --seed N          seed for the initial weights and the shuffling (default 42)\n";
  u += "  --out DIR         where the CSV and the plot go (default results/)\n";
  if (c.max_devices > 1)
    u += "  --eval all|device0  test accuracy on all devices (default) or on device 0 only, as d2l\n";
  u += "  --help            this text\n";
  return u;
}

ParseResult parse_options(const std::vector<std::string>& args, const ChapterInfo& chapter) {
  ParseResult r;
  r.options.devices = chapter.default_devices;
  Options& o = r.options;

  // Each flag: how to store its value, or the reason the value is refused.
  auto positive_int = [](int& dst, long long lo) {
    return [&dst, lo](const std::string& flag, const std::string& v) -> std::string {
      const auto n = to_integer(v);
      if (!n) return flag + " needs an integer, got '" + v + "'";
      if (*n < lo) return flag + " must be " + (lo == 0 ? "zero or more" : "at least " + std::to_string(lo)) +
                          ", got " + v;
      if (*n > 1'000'000'000) return flag + " is too large: " + v;
      dst = static_cast<int>(*n);
      return "";
    };
  };
  std::map<std::string, std::function<std::string(const std::string&, const std::string&)>> flags = {
      {"--epochs", positive_int(o.epochs, 1)},
      {"--batch-size", positive_int(o.batch_size, 1)},
      {"--devices", positive_int(o.devices, 1)},
      {"--limit-train", positive_int(o.limit_train, 0)},
      {"--lr",
       [&o](const std::string& flag, const std::string& v) -> std::string {
         const auto x = to_real(v);
         if (!x) return flag + " needs a number, got '" + v + "'";
         if (*x <= 0) return flag + " must be positive, got " + v;
         o.lr = static_cast<float>(*x);
         return "";
       }},
      {"--seed",
       [&o](const std::string& flag, const std::string& v) -> std::string {
         const auto n = to_integer(v);
         if (!n || *n < 0) return flag + " needs a non-negative integer, got '" + v + "'";
         o.seed = static_cast<std::uint64_t>(*n);
         return "";
       }},
      {"--data-dir",
       [&o](const std::string& flag, const std::string& v) -> std::string {
         if (v.empty()) return flag + " needs a directory";
         o.data_dir = v;
         return "";
       }},
      {"--eval",
       [&o, &chapter](const std::string& flag, const std::string& v) -> std::string {
         if (chapter.max_devices == 1) return flag + " is for chapters with several devices";
         if (v != "all" && v != "device0") return flag + " must be 'all' or 'device0', got '" + v + "'";
         o.eval_all_devices = v == "all";
         return "";
       }},
      {"--out",
       [&o](const std::string& flag, const std::string& v) -> std::string {
         if (v.empty()) return flag + " needs a directory";
         o.out = v;
         return "";
       }},
  };

  for (std::size_t i = 0; i < args.size(); ++i) {
    std::string flag = args[i], value;
    if (flag == "--help" || flag == "-h") {
      r.help = true;
      return r;
    }
    bool inline_value = false;
    if (const auto eq = flag.find('='); flag.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = flag.substr(eq + 1);  // --epochs=3
      flag = flag.substr(0, eq);
      inline_value = true;
    }
    const auto it = flags.find(flag);
    if (it == flags.end()) {
      r.error = "unknown option '" + args[i] + "'";
      return r;
    }
    if (!inline_value) {
      if (i + 1 >= args.size()) {
        r.error = flag + " needs a value";
        return r;
      }
      value = args[++i];
    }
    if (std::string why = it->second(flag, value); !why.empty()) {
      r.error = why;
      return r;
    }
  }

  if (o.devices > chapter.max_devices)
    r.error = chapter.name + " trains on " + std::to_string(chapter.max_devices) +
              " device(s); --devices " + std::to_string(o.devices) + " is not possible here" +
              (chapter.max_devices == 1 ? " (chapter 02 splits a batch across devices)" : "");
  else if (o.batch_size < o.devices)
    r.error = "--batch-size " + std::to_string(o.batch_size) + " is smaller than --devices " +
              std::to_string(o.devices) + ": every device needs at least one example";
  return r;
}

Options parse_command_line(int argc, char** argv, const ChapterInfo& chapter) {
  const ParseResult r = parse_options(std::vector<std::string>(argv + 1, argv + argc), chapter);
  if (r.help) {
    std::fputs(usage(chapter).c_str(), stdout);
    std::exit(0);
  }
  if (!r.error.empty()) {
    std::fprintf(stderr, "%s: %s\n\n%s", chapter.name.c_str(), r.error.c_str(), usage(chapter).c_str());
    std::exit(2);
  }
  return r.options;
}

}  // namespace mgpu
