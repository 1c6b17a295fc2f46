// The command line every chapter shares (common/cli.h), read with CLI11. parse_options is a pure
// function, so every good and bad command line can be tried here without starting a program.
#include <CLI/CLI.hpp>
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/cli.h"

namespace {

using Args = std::vector<std::string>;

// Chapter 01 trains on exactly one device; a later chapter takes up to 1024, 2 by default.
const mgpu::ChapterInfo kLenet{"01_lenet", "LeNet on one device", 1, 1};
const mgpu::ChapterInfo kMulti{"02_x", "LeNet on several devices", 2, 1024};
// A chapter with several devices that evaluates one way only (as chapters 06-08 do).
const mgpu::ChapterInfo kOneEval{"07_x", "LeNet split across devices", 2, 64, 0.2f, /*eval_flag=*/false};

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// `args` must be refused with a reason that contains `says` (the flag, at least).
void check_refused(const Args& args, const mgpu::ChapterInfo& chapter, const std::string& says) {
  const mgpu::ParseResult r = mgpu::parse_options(args, chapter);
  std::string line;
  for (const std::string& a : args) line += a + " ";
  INFO("command line: ", line, " -> error: '", r.error, "'");
  CHECK_FALSE(r.error.empty());
  CHECK(contains(r.error, says));
  CHECK_FALSE(r.help);
}

TEST_CASE("no arguments: d2l's defaults") {
  const mgpu::ParseResult r = mgpu::parse_options({}, kLenet);
  CHECK(r.error == "");
  CHECK_FALSE(r.help);
  CHECK(r.options.epochs == 10);
  CHECK(r.options.batch_size == 256);
  CHECK(r.options.lr == 0.2f);
  CHECK(r.options.devices == 1);
  CHECK(r.options.data_dir == "");
  CHECK(r.options.limit_train == 0);
  CHECK(r.options.seed == 42u);
  CHECK(r.options.out == "results");
  CHECK(r.options.eval_all_devices);
  CHECK(r.options.progress == mgpu::Options::Progress::Auto);
  // The device count's default is the chapter's.
  CHECK(mgpu::parse_options({}, kMulti).options.devices == 2);
}

TEST_CASE("every flag with a good value, as '--flag value' and as '--flag=value'") {
  const mgpu::ParseResult r = mgpu::parse_options({"--epochs", "3", "--batch-size", "64", "--lr", "0.05", "--devices",
                                                   "4", "--data-dir", "/tmp/fm", "--limit-train", "1000", "--seed",
                                                   "7", "--out", "/tmp/r"},
                                                  kMulti);
  REQUIRE(r.error == "");
  CHECK(r.options.epochs == 3);
  CHECK(r.options.batch_size == 64);
  CHECK(r.options.lr == 0.05f);
  CHECK(r.options.devices == 4);
  CHECK(r.options.data_dir == "/tmp/fm");
  CHECK(r.options.limit_train == 1000);
  CHECK(r.options.seed == 7u);
  CHECK(r.options.out == "/tmp/r");

  const mgpu::ParseResult e = mgpu::parse_options({"--epochs=3", "--lr=1e-2", "--out=x", "--limit-train=0"}, kLenet);
  REQUIRE(e.error == "");
  CHECK(e.options.epochs == 3);
  CHECK(e.options.lr == 0.01f);
  CHECK(e.options.out == "x");
  CHECK(e.options.limit_train == 0);

  CHECK_FALSE(mgpu::parse_options({"--eval", "device0"}, kMulti).options.eval_all_devices);
  CHECK(mgpu::parse_options({"--eval=all"}, kMulti).options.eval_all_devices);
  // Offered only where it does something: refused, not ignored, elsewhere.
  check_refused({"--eval", "device0"}, kLenet, "--eval is for chapters with several devices");
  check_refused({"--eval", "all"}, kOneEval, "--eval is not an option of 07_x");
  CHECK(contains(mgpu::usage(kMulti), "--eval"));
  CHECK_FALSE(contains(mgpu::usage(kOneEval), "--eval"));
  CHECK_FALSE(contains(mgpu::usage(kLenet), "--eval"));

  using Progress = mgpu::Options::Progress;
  CHECK(mgpu::parse_options({"--progress", "on"}, kLenet).options.progress == Progress::On);
  CHECK(mgpu::parse_options({"--progress=off"}, kLenet).options.progress == Progress::Off);
  CHECK(mgpu::parse_options({"--progress", "auto"}, kLenet).options.progress == Progress::Auto);
  check_refused({"--progress", "yes"}, kLenet, "--progress: yes not in {auto,on,off}");

  // Chapter 01 accepts the one device it has.
  CHECK(mgpu::parse_options({"--devices", "1"}, kLenet).error == "");
}

TEST_CASE("--help and -h ask for the usage, wherever they are and whatever is around them") {
  CHECK(mgpu::parse_options({"--help"}, kLenet).help);
  CHECK(mgpu::parse_options({"-h"}, kLenet).help);
  CHECK(mgpu::parse_options({"--epochs", "3", "--help"}, kLenet).help);
  // Answered as soon as it is read: flags that would be refused do not hide the usage.
  CHECK(mgpu::parse_options({"--epochs", "0", "-h"}, kLenet).help);
  CHECK(mgpu::parse_options({"--help", "--bogus"}, kLenet).help);
  CHECK_FALSE(mgpu::parse_options({"--epochs", "3"}, kLenet).help);
}

TEST_CASE("the usage names the program and every flag, with the short forms and the defaults") {
  const std::string u = mgpu::usage(kLenet);
  CHECK(contains(u, "Usage: 01_lenet"));
  for (const char* flag : {"--epochs", "-b,--batch-size", "--lr", "--devices", "--data-dir", "--limit-train", "--seed",
                           "--out", "--run-name", "--progress", "-p,--print-every", "-h,--help"}) {
    INFO("flag ", std::string(flag));
    CHECK(contains(u, flag));
  }
  CHECK(contains(u, "-b,--batch-size INT:[1, 1000000000]=256"));  // the bounds, then the default (from Options)
  CHECK(contains(mgpu::usage(kOneEval), "--lr FLOAT:positive=0.2"));
  // Every number's bounds: the chapter's own device count among them.
  CHECK(contains(u, "--epochs INT:[1, 1000000000]=10"));
  CHECK(contains(u, "--devices INT:[1, 1]=1"));
  CHECK(contains(mgpu::usage(kOneEval), "--devices INT:[1, " + std::to_string(kOneEval.max_devices) + "]"));
  CHECK(contains(u, "--limit-train INT:[0, 1000000000]=0"));
  CHECK(contains(u, "--seed UINT:[0, 9223372036854775807]=42"));
}

TEST_CASE("the short forms people know: -b for the batch size, -p for how often to print") {
  const mgpu::ParseResult r = mgpu::parse_options({"-b", "64", "-p", "5"}, kLenet);
  REQUIRE(r.error == "");
  CHECK(r.options.batch_size == 64);
  CHECK(r.options.print_every == 5);
  CHECK(mgpu::parse_options({"-b128"}, kLenet).options.batch_size == 128);  // glued, as getopt takes it
  // Refused as the long form is, and named by it.
  check_refused({"-b", "0"}, kLenet, "--batch-size: must be at least 1, got 0");
  check_refused({"-b", "+3"}, kLenet, "--batch-size: needs an integer, got '+3'");
  check_refused({"-b"}, kLenet, "--batch-size");
  // Only those: -e, -n and -s are nobody's epochs, count or seed here.
  check_refused({"-e", "3"}, kLenet, "-e");
  check_refused({"-s", "3"}, kLenet, "-s");
}

TEST_CASE("a flag given twice keeps its last value, as most tools do") {
  const mgpu::ParseResult r = mgpu::parse_options({"--epochs", "3", "-b", "64", "--epochs=5", "--batch-size", "32"}, kLenet);
  REQUIRE(r.error == "");
  CHECK(r.options.epochs == 5);
  CHECK(r.options.batch_size == 32);
  // Only the value kept is checked (a script's flags, then one's own after them): an earlier
  // one is not refused, in any of the forms; the last one is.
  const mgpu::ParseResult later = mgpu::parse_options(
      {"--epochs", "0", "-b", "x", "--lr=-1", "--eval", "bad", "--epochs", "3", "--batch-size=64", "--lr", "0.1",
       "--eval", "all", "--devices", "2"},
      kMulti);
  REQUIRE(later.error == "");
  CHECK(later.options.epochs == 3);
  CHECK(later.options.batch_size == 64);
  CHECK(later.options.lr == 0.1f);
  CHECK(later.options.eval_all_devices);
  check_refused({"--epochs", "5", "--epochs", "0"}, kLenet, "--epochs: must be at least 1, got 0");
  check_refused({"-b64", "-b0"}, kLenet, "--batch-size: must be at least 1, got 0");
  // A value that looks like a flag is still the value it follows (and refused as before).
  check_refused({"--run-name", "--epochs", "--epochs", "2"}, kLenet, "--run-name");
}

TEST_CASE("--run-name: letters, digits, '_', '-' and '.', for file names") {
  CHECK(mgpu::parse_options({}, kLenet).options.run_name == "");  // the default: named from the settings
  CHECK(mgpu::parse_options({"--run-name", "lr0.1_try-2"}, kLenet).options.run_name == "lr0.1_try-2");
  check_refused({"--run-name", "a/b"}, kLenet, "--run-name: 'a/b' may hold only letters, digits");
  check_refused({"--run-name", "two words"}, kLenet, "--run-name: 'two words'");
  check_refused({"--run-name="}, kLenet, "--run-name");
}

TEST_CASE("zero and negative values are refused, naming the flag") {
  check_refused({"--epochs", "0"}, kLenet, "--epochs");
  check_refused({"--epochs", "-3"}, kLenet, "--epochs");
  // The whole reason, value included: a parser that took "-1" for the next option would also
  // name the flag, but not say this.
  check_refused({"--batch-size", "0"}, kLenet, "--batch-size: must be at least 1, got 0");
  check_refused({"--batch-size", "-256"}, kLenet, "--batch-size: must be at least 1, got -256");
  check_refused({"--lr", "0"}, kLenet, "--lr: must be positive, got 0");
  check_refused({"--lr", "-0.1"}, kLenet, "--lr: must be positive, got -0.1");
  check_refused({"--devices", "0"}, kMulti, "--devices: must be at least 1, got 0");
  check_refused({"--devices", "-2"}, kMulti, "--devices: must be at least 1, got -2");
  check_refused({"--limit-train", "-1"}, kLenet, "--limit-train: must be zero or more, got -1");
  check_refused({"--seed", "-1"}, kLenet, "--seed: must be zero or more, got -1");
}

TEST_CASE("values that are not numbers (or not whole ones) are refused, naming the flag") {
  check_refused({"--epochs", "abc"}, kLenet, "--epochs");
  check_refused({"--epochs", "12abc"}, kLenet, "--epochs");
  check_refused({"--epochs", "1.5"}, kLenet, "--epochs");
  check_refused({"--epochs", "1e3"}, kLenet, "--epochs");
  check_refused({"--batch-size", "x"}, kLenet, "--batch-size");
  check_refused({"--devices", "two"}, kMulti, "--devices");
  check_refused({"--limit-train", "all"}, kLenet, "--limit-train");
  check_refused({"--seed", "0x"}, kLenet, "--seed");
  check_refused({"--lr", "abc"}, kLenet, "--lr");
  check_refused({"--lr", "0.1x"}, kLenet, "--lr");
  check_refused({"--lr", "nan"}, kLenet, "--lr");
  check_refused({"--lr", "inf"}, kLenet, "--lr");
  check_refused({"--epochs", "99999999999999999999"}, kLenet, "--epochs");  // beyond long long
  check_refused({"--epochs", "2000000000"}, kLenet, "--epochs: must be at most 1000000000");  // beyond the limit
  // What strtoll and strtod would take, but a number typed on a command line is not: a leading
  // space (a quoted ' 3') or '+'.
  check_refused({"--epochs", " 3"}, kLenet, "--epochs: needs an integer, got ' 3'");
  check_refused({"--epochs", "+3"}, kLenet, "--epochs: needs an integer, got '+3'");
  check_refused({"--lr", "\t0.1"}, kLenet, "--lr: needs a number");
  check_refused({"--lr", "+0.1"}, kLenet, "--lr: needs a number, got '+0.1'");
}

TEST_CASE("exact_text: the shortest text that reads back as the same float") {
  CHECK(mgpu::exact_text(0.2f) == "0.2");
  CHECK(mgpu::exact_text(std::nextafter(0.5f, 1.0f)) == "0.50000006");
  CHECK(mgpu::exact_text(5.0f) == "5");
  for (const float v : {0.1f, 1e-7f, 3.4e38f, -0.007f, std::nextafter(0.2f, 0.0f)})
    CHECK(std::strtof(mgpu::exact_text(v).c_str(), nullptr) == v);
}

TEST_CASE("to_integer and to_real read the whole string as typed: sign '-' and a leading '.' only") {
  CHECK(mgpu::to_integer("-3") == -3);
  CHECK(mgpu::to_integer("42") == 42);
  CHECK_FALSE(mgpu::to_integer(" 42").has_value());
  CHECK_FALSE(mgpu::to_integer("+42").has_value());
  CHECK_FALSE(mgpu::to_integer("42 ").has_value());
  CHECK(mgpu::to_real(".5") == 0.5);
  CHECK(mgpu::to_real("-2.5e1") == -25.0);
  CHECK_FALSE(mgpu::to_real(" 3").has_value());
  CHECK_FALSE(mgpu::to_real("+3").has_value());
  CHECK_FALSE(mgpu::to_real("").has_value());
  // Decimal only, as the integers: no C hexadecimal floats, no "1e3" for an integer.
  CHECK_FALSE(mgpu::to_real("0x1p-3").has_value());
  CHECK_FALSE(mgpu::to_real("0X10").has_value());
  CHECK_FALSE(mgpu::to_integer("0x10").has_value());
  CHECK_FALSE(mgpu::to_integer("1e3").has_value());
}

TEST_CASE("--lr is checked as the float it becomes, not as the number written") {
  // 1e300 and 1e-46 are fine doubles but no floats: they would train with lr = inf and lr = 0.
  check_refused({"--lr", "1e300"}, kLenet, "--lr: 1e300 is too large for a float");
  check_refused({"--lr", "1e39"}, kLenet, "--lr: 1e39 is too large for a float");
  check_refused({"--lr", "1e-46"}, kLenet, "--lr: 1e-46 is too small for a float");
  check_refused({"--lr", "1e-40"}, kLenet, "--lr: 1e-40 is too small for a float");  // denormal: digits lost
  // The ends of the float range still pass.
  CHECK(mgpu::parse_options({"--lr", "3e38"}, kLenet).options.lr == 3e38f);
  CHECK(mgpu::parse_options({"--lr", "1e-37"}, kLenet).options.lr == 1e-37f);
}

TEST_CASE("empty values are refused, naming the flag") {
  check_refused({"--epochs", ""}, kLenet, "--epochs: needs an integer, got ''");
  check_refused({"--epochs="}, kLenet, "--epochs");
  check_refused({"--lr", ""}, kLenet, "--lr");
  check_refused({"--data-dir", ""}, kLenet, "--data-dir");
  check_refused({"--out="}, kLenet, "--out");
}

TEST_CASE("a path the system cannot open (too long, or a name in it too long) is refused, naming its start") {
  const std::string long_path = "/tmp/" + std::string(5000, 'a');
  check_refused({"--data-dir", long_path}, kLenet, "--data-dir: needs a directory, got a path of 5005 characters (/tmp/aaa");
  check_refused({"--out", long_path}, kLenet, "at most 4095");
  std::string deep = "/tmp";
  for (int i = 0; i < 2100; ++i) deep += "/a";
  check_refused({"--out", deep}, kLenet, "--out: needs a directory, got a path of 4204 characters");
  check_refused({"--out", "/tmp/" + std::string(256, 'b') + "/x"}, kLenet,
                "got a name of 256 characters in the path (/tmp/bbb");
  const mgpu::ParseResult fits = mgpu::parse_options({"--out", "/tmp/" + std::string(255, 'b')}, kLenet);
  CHECK(fits.error == "");
}

TEST_CASE("a flag without its value at the end of the line is refused") {
  check_refused({"--epochs"}, kLenet, "--epochs needs a value");
  check_refused({"--epochs", "3", "--lr"}, kLenet, "--lr needs a value");
  // A flag where a value should be: CLI11, as getopt, takes it as the value. A number flag then
  // refuses it as a number; a text flag refuses a value that starts with "--": '--out --epochs 3'
  // would have written to a folder called '--epochs' (and refused the '3').
  check_refused({"--out", "--epochs", "3"}, kLenet, "--out: needs a directory, got the option '--epochs'");
  check_refused({"--out", "--epochs"}, kLenet, "--out: needs a directory, got the option '--epochs'");
  check_refused({"--epochs", "--lr", "0.1"}, kLenet, "--epochs: needs an integer, got '--lr'");
}

TEST_CASE("an unknown flag or a stray word is refused, quoting it") {
  check_refused({"--bogus"}, kLenet, "unknown option '--bogus'");
  check_refused({"--bogus=1"}, kLenet, "--bogus");
  check_refused({"--epochs", "3", "extra"}, kLenet, "unexpected argument 'extra'");
  check_refused({"-x", "3"}, kLenet, "-x");
}

TEST_CASE("the checks, on a program's own CLI11 app") {
  // What a chapter's own flags and the benchmark's do: CLI11 stores, mgpu's checks read the text.
  int n = 0;
  double x = 1;
  std::string name;
  auto parse = [&](const std::vector<std::string>& args) {
    CLI::App app{"a test", "t"};
    mgpu::prepare_app(app);
    app.add_option("-n", n)->transform(mgpu::integer(0, 10));
    app.add_option("--x", x)->check(mgpu::real(0, 100));
    app.add_option("--name", name)->check(mgpu::text("a name"));
    return mgpu::parse(app, args);
  };
  CHECK(parse({"-n", "3", "--x=2.5", "--name", "a=b"}).error == "");
  CHECK(n == 3);
  CHECK(x == 2.5);
  CHECK(name == "a=b");  // only a flag's first '=' splits it
  CHECK(parse({"-h"}).help);
  CHECK(parse({"-n", "11"}).error == "-n: must be at most 10, got 11");
  CHECK(parse({"-n", "-1"}).error == "-n: must be zero or more, got -1");  // "-1" is a value, not a flag
  CHECK(parse({"--x", "101"}).error == "--x: must be at most 100, got 101");
  CHECK(parse({"--x", "-0.5"}).error == "--x: must be zero or more, got -0.5");
  CHECK(parse({"--x", "1e-320"}).error.rfind("--x: ", 0) == 0);  // a denormal double: digits lost
  CHECK(parse({"--name", ""}).error == "--name: needs a name");
  CHECK(parse({"-n"}).error == "-n needs a value");
  CHECK(parse({"-n", "1", "--bogus"}).error == "unknown option '--bogus'");
  // An empty inline value is refused as such, not filled with the next word.
  CHECK(parse({"--x=", "1"}).error == "--x needs a value, got none after '='");
  CHECK(parse({"--name=", "-n", "1"}).error == "--name needs a value, got none after '='");
  CHECK(parse({"--name", "x=", "-n", "1"}).error == "");  // a value may end with '='
  CHECK(name == "x=");
  // The value's error comes before the stray word's.
  CHECK(parse({"-n", "x", "--bogus"}).error == "-n: needs an integer, got 'x'");
}

TEST_CASE("integers are decimal, whatever their leading zeros: '0064' is 64, never octal 52") {
  // CLI11 converts integers in base 0; mgpu::integer hands it the checked number in decimal.
  const Args zeros = {"--epochs", "010", "-b", "0064", "--devices", "02", "--limit-train", "0100",
                      "--warmup-epochs", "01", "--seed", "0077", "-p", "08"};
  const mgpu::ParseResult r = mgpu::parse_options(zeros, kMulti);
  REQUIRE(r.error == "");
  CHECK(r.options.epochs == 10);
  CHECK(r.options.batch_size == 64);
  CHECK(r.options.devices == 2);
  CHECK(r.options.limit_train == 100);
  CHECK(r.options.warmup_epochs == 1);
  CHECK(r.options.seed == 77);
  CHECK(r.options.print_every == 8);  // "08" is not even octal: it must not be refused as such
  // The bound is checked on the decimal value, and the message quotes what was typed.
  check_refused({"--epochs", "0"}, kMulti, "--epochs: must be at least 1, got 0");
  check_refused({"-b", "00"}, kMulti, "--batch-size: must be at least 1, got 00");
  // Other bases stay refused.
  check_refused({"-b", "0x40"}, kMulti, "--batch-size: needs an integer, got '0x40'");
  // A chapter's own integer flag, declared the same way, reads the same.
  int stage = -1;
  const mgpu::OwnFlags own = [&stage](CLI::App& app) { app.add_option("--zero", stage)->transform(mgpu::integer(0, 20)); };
  CHECK(mgpu::parse_options({"--zero", "011"}, kMulti, own).error == "");
  CHECK(stage == 11);
}

TEST_CASE("a chapter's own flags are read beside the shared ones, and listed under 'this chapter'") {
  std::string mode = "off";
  const mgpu::OwnFlags own = [&mode](CLI::App& app) { app.add_option("--mode", mode, "how"); };
  const mgpu::ParseResult r = mgpu::parse_options({"--mode", "fast", "--epochs", "3"}, kLenet, own);
  CHECK(r.error == "");
  CHECK(mode == "fast");
  CHECK(r.options.epochs == 3);
  CHECK(contains(mgpu::parse_options({"--bogus", "1"}, kLenet, own).error, "--bogus"));
  const std::string u = mgpu::usage(kLenet, own);
  CHECK(contains(u, "\nthis chapter:\n  --mode TEXT"));
  CHECK(u.find("this chapter:") > u.find("--epochs"));  // after the shared flags
  CHECK_FALSE(contains(mgpu::usage(kLenet), "this chapter:"));
}

TEST_CASE("--warmup-epochs: the rate rises linearly to --lr over the first N epochs, then stays") {
  const mgpu::ParseResult r = mgpu::parse_options({"--lr", "0.8", "--warmup-epochs", "2", "--epochs", "3"}, kLenet);
  REQUIRE(r.error == "");
  const mgpu::Options& o = r.options;
  CHECK(o.warmup_epochs == 2);
  // 4 steps an epoch: 8 steps of warm-up, step t (1-based) at 0.8 * t / 8.
  CHECK(mgpu::learning_rate_at(o, 0, 0, 4) == doctest::Approx(0.1));
  CHECK(mgpu::learning_rate_at(o, 0, 3, 4) == doctest::Approx(0.4));
  CHECK(mgpu::learning_rate_at(o, 1, 2, 4) == doctest::Approx(0.7));
  CHECK(mgpu::learning_rate_at(o, 1, 3, 4) == 0.8f);  // the last warm-up step reaches --lr exactly
  CHECK(mgpu::learning_rate_at(o, 2, 0, 4) == 0.8f);
  mgpu::Options none = o;
  none.warmup_epochs = 0;  // the default: --lr from the first step
  CHECK(mgpu::learning_rate_at(none, 0, 0, 4) == 0.8f);
  CHECK(mgpu::default_options(kLenet).warmup_epochs == 0);
  check_refused({"--warmup-epochs", "-1"}, kLenet, "--warmup-epochs: must be zero or more, got -1");
  check_refused({"--warmup-epochs", "4", "--epochs", "3"}, kLenet, "--warmup-epochs 4 is more than --epochs 3");
}

TEST_CASE("device counts the chapter cannot run are refused") {
  // Chapter 01 trains on one device only.
  check_refused({"--devices", "2"}, kLenet, "--devices 2");
  // Every device needs at least one example of each batch.
  check_refused({"--devices", "4", "--batch-size", "2"}, kMulti, "--batch-size 2");
  check_refused({"--devices", "4", "--batch-size", "2"}, kMulti, "--devices 4");
  check_refused({"--batch-size", "1"}, kMulti, "--batch-size 1");  // against the default of 2 devices
  check_refused({"--devices", "1025"}, kMulti, "--devices 1025");
  CHECK(mgpu::parse_options({"--devices", "4", "--batch-size", "4"}, kMulti).error == "");
}

}  // namespace
