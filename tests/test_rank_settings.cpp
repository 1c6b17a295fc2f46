// Chapter 05's start-up check that every rank runs the same training (options.h): which
// settings are compared, how they travel, and the message that names where the ranks differ.
// All of it pure; the runs of two ranks started with different options are ctest cases
// (05_multi_process_ranks_disagree_*, tests/CMakeLists.txt).
#include <doctest/doctest.h>

#include <cmath>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "chapters/05_multi_process/options.h"
#include "common/random.h"
#include "helpers.h"

namespace {

using mp::Settings;

mp::Config parsed(const std::vector<std::string>& args, int world_size = 2) {
  const mp::CommandLine cl = mp::parse_command_line(args, world_size);
  REQUIRE_MESSAGE(cl.error.empty(), cl.error);
  return cl.config;
}

std::string value_of(const Settings& s, const std::string& key) {
  for (const mp::Setting& x : s)
    if (x.key == key) return x.value;
  return "(missing)";
}

// The options the usage lists: every --word on a line that starts with a flag (CLI11's usage
// writes "-b,--batch-size INT=256" and "--epochs INT=10").
std::set<std::string> options_in_usage() {
  std::set<std::string> found;
  const std::string usage = mp::usage();
  const std::regex line("(^|\n) +-[^\n]*"), option("--[a-z][a-z-]*");
  for (std::sregex_iterator l(usage.begin(), usage.end(), line), end; l != end; ++l) {
    const std::string text = l->str();
    for (std::sregex_iterator o(text.begin(), text.end(), option); o != end; ++o) found.insert(o->str());
  }
  return found;
}

TEST_CASE("disagreement: ranks with the same settings agree") {
  const Settings s{{"--epochs", "1"}, {"--lr", "0.2"}};
  CHECK(mp::disagreement({}) == "");
  CHECK(mp::disagreement({s}) == "");
  CHECK(mp::disagreement({s, s, s}) == "");
}

TEST_CASE("disagreement: names the setting, each value and its ranks") {
  const Settings a{{"--epochs", "1"}, {"--lr", "0.2"}}, b{{"--epochs", "2"}, {"--lr", "0.2"}};
  CHECK(mp::disagreement({a, b}) == "ranks disagree on --epochs: rank 0 has 1, rank 1 has 2");
  // The values in the order the ranks have them; runs of ranks as ranges.
  CHECK(mp::disagreement({b, b, b, a, b, a, a}) ==
        "ranks disagree on --epochs: ranks 0-2,4 have 2, ranks 3,5-6 have 1");
}

TEST_CASE("disagreement: one line per setting that differs, in the order of the settings") {
  const Settings a{{"--epochs", "1"}, {"--batch-size", "64"}, {"--lr", "0.2"}};
  const Settings b{{"--epochs", "2"}, {"--batch-size", "64"}, {"--lr", "0.1"}};
  CHECK(mp::disagreement({a, b}) ==
        "ranks disagree on --epochs: rank 0 has 1, rank 1 has 2\n"
        "ranks disagree on --lr: rank 0 has 0.2, rank 1 has 0.1");
}

TEST_CASE("disagreement: a setting that a rank lacks is a difference, not a match") {
  const Settings a{{"--epochs", "1"}}, b{{"--epochs", "1"}, {"--overlap", "on"}};
  CHECK(mp::disagreement({a, b}) == "ranks disagree on --overlap: rank 0 has (none), rank 1 has on");
}

TEST_CASE("to_text and from_text: the settings travel as key=value lines and come back the same") {
  const Settings s{{"--epochs", "3"}, {"--checkpoint", "/tmp/a=b.ckpt"}, {"--lr", "0.2"}};
  CHECK(mp::to_text(s) == "--epochs=3\n--checkpoint=/tmp/a=b.ckpt\n--lr=0.2\n");
  CHECK(mp::from_text(mp::to_text(s)) == s);
  CHECK(mp::from_text("").empty());
}

// The class, not the cases: an option added to the chapter must be compared across ranks or
// be named here as one a rank may have to itself (see settings_to_agree_on in options.cpp).
TEST_CASE("settings_to_agree_on: every option of the usage is compared, or listed as per-rank") {
  const std::set<std::string> per_rank{"--data-dir", "--out", "--progress", "--print-every", "--devices", "--help",
                                     "--run-name"};
  const Settings s = mp::settings_to_agree_on(parsed({}));
  std::set<std::string> compared;
  for (const mp::Setting& x : s) compared.insert(x.key);
  for (const std::string& option : options_in_usage()) {
    CAPTURE(option);
    CHECK(compared.count(option) + per_rank.count(option) == 1);
  }
  CHECK(options_in_usage().count("--epochs") == 1);  // the usage was read at all
}

TEST_CASE("settings_to_agree_on: each compared option shows in its value, the per-rank ones in none") {
  const std::vector<std::string> fault{"--fail-rank", "1", "--fail-at-step", "3"};
  struct Change {
    std::string key;
    std::vector<std::string> before, after;
  };
  const std::vector<Change> changes{
      {"--epochs", {}, {"--epochs", "2"}},
      {"--batch-size", {}, {"--batch-size", "128"}},
      {"--lr", {"--lr", "0.2"}, {"--lr", "0.20000002"}},  // the next float up: no rounding hides it
      {"--warmup-epochs", {}, {"--warmup-epochs", "1"}},
      {"--limit-train", {}, {"--limit-train", "100"}},
      {"--seed", {}, {"--seed", "43"}},
      {"--eval", {}, {"--eval", "device0"}},
      {"--overlap", {}, {"--overlap", "off"}},
      {"--checkpoint", {}, {"--checkpoint", "run.ckpt"}},
      {"--resume", {}, {"--resume", "run.ckpt"}},
      {"--profile-steps", {}, {"--profile-steps", "3"}},
      {"--fail-rank", {}, fault},
      {"--fail-at-step", fault, {"--fail-rank", "1", "--fail-at-step", "end"}},
      {"--fail-how", fault, {"--fail-rank", "1", "--fail-at-step", "3", "--fail-how", "kill"}},
  };
  for (const Change& c : changes) {
    CAPTURE(c.key);
    CHECK(value_of(mp::settings_to_agree_on(parsed(c.before)), c.key) !=
          value_of(mp::settings_to_agree_on(parsed(c.after)), c.key));
  }
  CHECK(value_of(mp::settings_to_agree_on(parsed({"--lr", "0.1"})), "--lr") == "0.1");  // read as written

  // --collective: an explicit nccl is refused where ranks share a GPU, the default falls back.
  mp::Config given = parsed({}), by_default = given;
  given.collective = by_default.collective = mp::CollectiveKind::Nccl;
  given.collective_given = true;
  CHECK(value_of(mp::settings_to_agree_on(given), "--collective") == "nccl");
  CHECK(value_of(mp::settings_to_agree_on(by_default), "--collective") == "nccl (the default)");

  const Settings plain = mp::settings_to_agree_on(parsed({}));
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--data-dir", "/elsewhere"}, {"--out", "/tmp/mine"}, {"--progress", "on"},
        {"--print-every", "5"}, {"--devices", "2"}}) {
    CAPTURE(args[0]);
    CHECK(mp::settings_to_agree_on(parsed(args)) == plain);
  }
}

TEST_CASE("data_to_agree_on: any pixel, label or image count, or the parameter count, shows") {
  mgpu::Rng rng(5);
  mgpu::FashionMnist data;
  data.train = testing::random_set(20, rng);
  data.test = testing::random_set(10, rng);
  const Settings same = mp::data_to_agree_on(data, 129068);
  CHECK(mp::data_to_agree_on(data, 129068) == same);
  CHECK(value_of(same, "the training set").rfind("20 images of 28x28 (checksum ", 0) == 0);

  auto differs_in = [&](const mgpu::FashionMnist& other, std::int64_t parameters) {
    const std::string why = mp::disagreement({same, mp::data_to_agree_on(other, parameters)});
    return why.substr(0, why.find(':'));
  };
  mgpu::FashionMnist pixel = data;
  pixel.train.pixels[123] = std::nextafter(pixel.train.pixels[123], 2.0f);
  CHECK(differs_in(pixel, 129068) == "ranks disagree on the training set");
  mgpu::FashionMnist label = data;
  label.test.labels[3] = (label.test.labels[3] + 1) % 10;
  CHECK(differs_in(label, 129068) == "ranks disagree on the test set");
  mgpu::FashionMnist fewer = data;
  fewer.train.count = 19;
  fewer.train.pixels.resize(19 * 28 * 28);
  fewer.train.labels.resize(19);
  CHECK(differs_in(fewer, 129068) == "ranks disagree on the training set");
  CHECK(differs_in(data, 129069) == "ranks disagree on the model");
}

}  // namespace
