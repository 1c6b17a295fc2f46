#include "options.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>

namespace mp {

const mgpu::ChapterInfo kChapter{"05_multi_process",
                                 "one process per device, launched by mpirun or srun: the gradients are summed with "
                                 "NCCL or MPI",
                                 /*default_devices=*/1, /*max_devices=*/1 << 20};

namespace {

// The app of this chapter: the shared flags (common/cli.h) and its own, bound to `c`. Its
// options, once parsed, say which flags were given (CLI::Option::count).
struct App {
  CLI::App app{kChapter.summary, kChapter.name};
  CLI::Option *devices, *fail_rank, *fail_at_step, *fail_how;

  explicit App(Config& c) {
    mgpu::prepare_app(app);
    mgpu::add_common_flags(app, c.o, kChapter);
    devices = app.get_option("--devices");
    devices->description("must equal the number of processes (mpirun -np K), if given");
    app.option_defaults()->group("this chapter (launch K processes, one per device: mpirun -np K " + kChapter.name +
                                 " ...)");
    app.add_option_function<std::string>(
           "--collective",
           [&c](const std::string& v) {
             c.collective = v == "mpi" ? CollectiveKind::Mpi : CollectiveKind::Nccl;
             c.collective_given = true;
           },
           nccl_available() ? "what sums the gradients (default: nccl, or mpi where ranks share a GPU)"
                            : "what sums the gradients (default: mpi; nccl needs a cuda build with NCCL)")
        ->check(CLI::IsMember({"nccl", "mpi"}));
    mgpu::add_on_off(app, "--overlap", c.overlap,
                     "sum each layer's gradients while backward computes the earlier ones");
    app.add_option("--checkpoint", c.checkpoint,
                   "after every epoch rank 0 saves the run to FILE (written to FILE.tmp, then renamed)")
        ->check(mgpu::text("a file name"));
    app.add_option("--resume", c.resume, "continue the run saved in FILE, with any number of processes")
        ->check(mgpu::text("a file name"));
    app.add_option("--profile-steps", c.profile_steps,
                   "after training, time N steps without overlap and N with it, 0 to 10000 (0: skip)")
        ->transform(mgpu::integer(0, 10000))
        ->capture_default_str();
    // Fault injection: rank R fails at step S (counted from 0 over the whole run), or with 'end' at
    // the end of the run, while rank 0 writes the results.
    fail_rank = app.add_option("--fail-rank", c.fault.rank, "fault injection: rank R fails (with --fail-at-step)")
                    ->transform(mgpu::integer(0));
    fail_at_step = app.add_option_function<std::string>(
                          "--fail-at-step",
                          [&c](const std::string& v) {
                            c.fault.at_end = v == "end";
                            if (!c.fault.at_end) c.fault.step = static_cast<int>(*mgpu::to_integer(v));
                          },
                          "the step S (from 0 over the whole run) at which --fail-rank fails, or 'end' (while "
                          "rank 0 writes the results)")
                       ->check([](const std::string& v) -> std::string {
                         if (v == "end" || mgpu::integer(0)(v).empty()) return "";
                         return "needs a step (a non-negative integer up to 1000000000) or 'end', got '" + v + "'";
                       });
    fail_how = app.add_option_function<std::string>(
                      "--fail-how", [&c](const std::string& v) { c.fault.how = v == "kill" ? FailHow::Kill : FailHow::Error; },
                      "how --fail-rank fails: an error, or killed by a signal")
                   ->check(CLI::IsMember({"error", "kill"}))
                   ->default_str("error");
  }
};

}  // namespace

std::string usage() {
  Config c;
  c.o = mgpu::default_options(kChapter);
  return App(c).app.help();
}

CommandLine parse_command_line(const std::vector<std::string>& args, int world_size) {
  CommandLine r;
  Config& c = r.config;
  c.o = mgpu::default_options(kChapter);
  c.collective = default_collective();
  App app(c);
  const mgpu::Parsed parsed = mgpu::parse(app.app, args);
  r.help = parsed.help;
  r.error = parsed.help || !parsed.error.empty() ? parsed.error : mgpu::check_options(c.o, kChapter);
  if (r.help || !r.error.empty()) return r;

  const bool fail_rank_given = app.fail_rank->count() > 0, fail_step_given = app.fail_at_step->count() > 0;
  const std::string K = std::to_string(world_size);
  if (app.devices->count() > 0 && c.o.devices != world_size)
    r.error = "--devices " + std::to_string(c.o.devices) + " does not match the " + K +
              " process(es) of this run: here every process drives one device, so start " +
              std::to_string(c.o.devices) + " of them (mpirun -np " + std::to_string(c.o.devices) + ")";
  else if (c.o.batch_size < world_size)
    r.error = "--batch-size " + std::to_string(c.o.batch_size) + " is smaller than the " + K +
              " processes: every rank needs at least one example of every full batch";
  else if (c.collective == CollectiveKind::Nccl && !nccl_available())
    r.error = std::string("--collective nccl needs a cuda build with NCCL; this is the ") + mgpu::kBackendName +
              " build: use --collective mpi";
  else if (fail_rank_given != fail_step_given)
    r.error = "--fail-rank and --fail-at-step go together: give both or neither";
  else if (app.fail_how->count() > 0 && !fail_rank_given)
    r.error = "--fail-how needs --fail-rank and --fail-at-step";
  else if (fail_rank_given && c.fault.rank >= world_size)
    r.error = "--fail-rank " + std::to_string(c.fault.rank) + " is not a rank of this run (ranks 0.." +
              std::to_string(world_size - 1) + ")";
  c.o.devices = world_size;
  return r;
}

// Every option of the command line is either here or in the list below of those a rank may
// have to itself; tests/test_rank_settings.cpp fails when a new option is in neither.
// Left out, as they may differ from rank to rank without changing what any rank computes:
//   --data-dir   where this rank finds Fashion-MNIST: machines may keep it in different
//                folders. What the ranks read is compared instead (data_to_agree_on).
//   --out        only rank 0 writes the CSV, the plot and the timeline.
//   --progress, --print-every   only rank 0 shows the progress.
//   --run-name   only rank 0 writes the files it names.
//   --devices    once parsed, it is the number of processes, on every rank.
// --checkpoint and --resume name files that rank 0 alone writes and reads, but they are
// compared: they name the run's one file, and whether --checkpoint is given decides whether
// every rank joins the save after each epoch (a collective).
Settings settings_to_agree_on(const Config& c) {
  const mgpu::Options& o = c.o;
  const FaultInjection& f = c.fault;
  const bool fault = f.rank >= 0;
  const std::string none = "(not given)";
  return {
      {"--epochs", std::to_string(o.epochs)},
      {"--batch-size", std::to_string(o.batch_size)},
      {"--lr", mgpu::exact_text(o.lr)},  // 0.2, not 0.200000003
      {"--warmup-epochs", std::to_string(o.warmup_epochs)},
      {"--limit-train", std::to_string(o.limit_train)},
      {"--seed", std::to_string(o.seed)},
      {"--eval", o.eval_all_devices ? "all" : "device0"},
      // An explicit nccl is refused where ranks share a GPU; the default falls back to mpi.
      {"--collective", c.collective == CollectiveKind::Nccl && !c.collective_given ? "nccl (the default)"
                                                                                : collective_name(c.collective)},
      {"--overlap", c.overlap ? "on" : "off"},
      {"--checkpoint", c.checkpoint.empty() ? none : c.checkpoint},
      {"--resume", c.resume.empty() ? none : c.resume},
      {"--profile-steps", std::to_string(c.profile_steps)},
      {"--fail-rank", fault ? std::to_string(f.rank) : none},
      {"--fail-at-step", !fault ? none : f.at_end ? "end" : std::to_string(f.step)},
      {"--fail-how", !fault ? none : f.how == FailHow::Kill ? "kill" : "error"},
  };
}

namespace {

// FNV-1a (64-bit) over the pixels' bit patterns and the labels: one cheap pass (some 50 ms for
// all of Fashion-MNIST, one core) that tells two different data sets apart. Not a defence
// against anyone crafting a collision; nobody here is.
std::string describe(const mgpu::LabeledImages& set) {
  std::uint64_t h = 14695981039346656037ull;
  auto mix = [&h](std::uint32_t word) { h = (h ^ word) * 1099511628211ull; };
  for (const float x : set.pixels) {
    std::uint32_t bits;
    std::memcpy(&bits, &x, sizeof bits);
    mix(bits);
  }
  for (const std::int32_t y : set.labels) mix(static_cast<std::uint32_t>(y));
  char text[96];
  std::snprintf(text, sizeof text, "%d images of %dx%d (checksum %016llx)", set.count, set.rows, set.cols,
                static_cast<unsigned long long>(h));
  return text;
}

// "rank 3"; "ranks 0-2,5": runs of consecutive ranks as ranges, so that 64 ranks stay one line.
std::string rank_list(const std::vector<int>& ranks) {
  std::string list;
  for (std::size_t i = 0, j = 0; i < ranks.size(); i = ++j) {
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    list += (list.empty() ? "" : ",") + std::to_string(ranks[i]) + (j > i ? "-" + std::to_string(ranks[j]) : "");
  }
  return (ranks.size() == 1 ? "rank " : "ranks ") + list;
}

}  // namespace

Settings data_to_agree_on(const mgpu::FashionMnist& data, std::int64_t parameters) {
  return {{"the training set", describe(data.train)},
          {"the test set", describe(data.test)},
          {"the model", "LeNet, " + std::to_string(parameters) + " parameters"}};
}

std::string to_text(const Settings& s) {
  std::string text;
  for (const Setting& x : s) text += x.key + "=" + x.value + "\n";
  return text;
}

Settings from_text(const std::string& text) {
  Settings s;
  std::size_t start = 0;
  while (start < text.size()) {
    std::size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(start, end - start);
    const std::size_t eq = line.find('=');  // the first: keys hold none, values may
    if (!line.empty()) s.push_back({line.substr(0, eq), eq == std::string::npos ? "" : line.substr(eq + 1)});
    start = end + 1;
  }
  return s;
}

std::string disagreement(const std::vector<Settings>& per_rank) {
  // Every key any rank sent, in the order they first appear.
  std::vector<std::string> keys;
  for (const Settings& s : per_rank)
    for (const Setting& x : s)
      if (std::find(keys.begin(), keys.end(), x.key) == keys.end()) keys.push_back(x.key);
  auto value_of = [](const Settings& s, const std::string& key) -> std::string {
    const auto it = std::find_if(s.begin(), s.end(), [&](const Setting& x) { return x.key == key; });
    return it == s.end() ? "(none)" : it->value;
  };
  std::string lines;
  for (const std::string& key : keys) {
    // Each distinct value, in the order the ranks have it, with the ranks that have it.
    std::vector<std::pair<std::string, std::vector<int>>> groups;
    for (int r = 0; r < static_cast<int>(per_rank.size()); ++r) {
      const std::string v = value_of(per_rank[r], key);
      const auto g = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == v; });
      if (g == groups.end()) groups.push_back({v, {r}});
      else g->second.push_back(r);
    }
    if (groups.size() < 2) continue;
    std::string line = "ranks disagree on " + key + ":";
    for (std::size_t i = 0; i < groups.size(); ++i)
      line += (i ? ", " : " ") + rank_list(groups[i].second) + (groups[i].second.size() == 1 ? " has " : " have ") +
              groups[i].first;
    lines += (lines.empty() ? "" : "\n") + line;
  }
  return lines;
}

}  // namespace mp
