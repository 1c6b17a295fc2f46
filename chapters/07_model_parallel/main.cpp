// Chapter 07: LeNet split across devices. Stage s of the model runs on device s; a batch is cut
// into micro-batches that flow through the stages (GPipe or 1F1B); with --data-parallel R, R
// copies of that pipeline train side by side and sum each stage's gradients (the hybrid).
//   build/bin/07_model_parallel [--devices 2] [--split 2] [--schedule gpipe] [--micro-batches 4] ...
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>  // CLI::App: where the chapter declares its own flags

#include "common/batches.h"  // largest_batch, check_batches_fit
#include "common/cli.h"  // parse_command_line: the flags every chapter shares
#include "common/fashion_mnist.h"  // load_fashion_mnist: the dataset, found and checked
#include "common/program.h"  // start_program, load_data, run_or_report: what every program does
#include "common/report.h"  // TrainingLog, plot_runs: the epoch lines, the CSV, the plot
#include "pipeline.h"  // Pipeline: stages on devices, GPipe and 1F1B schedules, the hybrid
#include "train.h"  // train: the epoch loop over the pipeline

namespace {

struct ChapterOptions {
  std::vector<int> cuts;  // --split; empty: pp::default_cuts
  bool split_given = false;
  int micro_batches = 4;
  bool micro_given = false;  // --micro-batches given, not the default
  pp::Schedule schedule = pp::Schedule::GPipe;
  int replicas = 1;        // --data-parallel
  int profile_steps = 10;  // --profile-steps
};

// "2" or "1,2": the first layer of each stage after the first. "" when the cuts are good, else why not.
std::string parse_cuts(const std::string& v, std::vector<int>& cuts) {
  std::vector<int> out;
  std::stringstream in(v);
  for (std::string word; std::getline(in, word, ',');) {
    const auto n = mgpu::to_integer(word);
    if (!n) return "needs layer numbers separated by commas, e.g. 2 or 1,2, got '" + v + "'";
    out.push_back(static_cast<int>(std::clamp<long long>(*n, -1000, 1000)));
  }
  if (out.empty()) return "needs at least one layer number, got '" + v + "'";
  const std::string why = pp::check_cuts(out);
  if (!why.empty()) return v + ": " + why;
  cuts = out;
  return "";
}

// This chapter's flags, beside the shared ones; `split_given` and `micro_given` tell what the
// user chose from the defaults.
void add_flags(CLI::App& app, ChapterOptions& c) {
  app.add_option_function<std::string>(
         "--split",
         [&c](const std::string& v) {
           parse_cuts(v, c.cuts);  // the check below has accepted v
           c.split_given = true;
         },
         "the first layer (1-3) of each stage after the first, e.g. 2 or 1,2: layers are 0 conv1, 1 conv2, "
         "2 dense3, 3 dense4 (default for 2 stages: 2)")
      ->check([](const std::string& v) {
        std::vector<int> cuts;
        return parse_cuts(v, cuts);
      });
  app.add_option_function<std::string>(
         "--schedule",
         [&c](const std::string& v) {
           c.schedule = v == "naive" ? pp::Schedule::Naive : v == "1f1b" ? pp::Schedule::OneFOneB : pp::Schedule::GPipe;
         },
         "naive: the whole batch at once (1 micro-batch); gpipe: all forwards, then all backwards; "
         "1f1b: one forward, one backward in turn")
      ->check(CLI::IsMember({"naive", "gpipe", "1f1b"}))
      ->default_str("gpipe");
  // Whether it was given is noted as it is read (each): the app, and its options, are gone by the
  // time check() runs.
  app.add_option("--micro-batches", c.micro_batches,
                 "micro-batches per step and replica, 1 to the batch size; they need not divide it "
                 "(the first ones take one example more)")
      ->transform(mgpu::integer(1))
      ->each([&c](const std::string&) { c.micro_given = true; })
      ->capture_default_str();
  app.add_option("--data-parallel", c.replicas, "R copies of the pipeline (the hybrid): --devices = stages x R")
      ->transform(mgpu::integer(1, 64))
      ->capture_default_str();
  app.add_option("--profile-steps", c.profile_steps,
                 "after training, time N steps device by device: the bubble and the timeline (0: none)")
      ->transform(mgpu::integer(0, 10000))
      ->capture_default_str();
}

// The checks between flags, once all are read: "" when they fit together.
std::string check(ChapterOptions& c, const mgpu::Options& o) {
  if (o.devices % c.replicas != 0)
    return "--devices " + std::to_string(o.devices) + " is not a multiple of --data-parallel " +
           std::to_string(c.replicas) + ": every replica needs the same number of stages";
  const int stages = o.devices / c.replicas;
  if (stages > pp::kLayers)
    return "--devices " + std::to_string(o.devices) + " with --data-parallel " + std::to_string(c.replicas) + " makes " +
           std::to_string(stages) + " stages; LeNet has " + std::to_string(pp::kLayers) + " layers, at most 4 stages";
  if (!c.split_given) c.cuts = pp::default_cuts(stages);
  if (static_cast<int>(c.cuts.size()) != stages - 1)
    return "--split names " + std::to_string(c.cuts.size()) + " cut(s), but " + std::to_string(stages) + " stage(s) need " +
           std::to_string(stages - 1);
  if (c.schedule == pp::Schedule::Naive) {
    if (c.micro_given && c.micro_batches != 1)
      return "--schedule naive runs the whole batch at once: --micro-batches must be 1, got " +
             std::to_string(c.micro_batches) + " (use gpipe or 1f1b)";
    c.micro_batches = 1;
  }
  const int per_replica = o.batch_size / c.replicas;
  if (c.micro_batches > per_replica)
    return "--micro-batches " + std::to_string(c.micro_batches) + " is more than the " + std::to_string(per_replica) +
           " examples a replica gets of a batch of " + std::to_string(o.batch_size) +
           ": every micro-batch needs at least one example";
  return "";
}

// The timeline of one step as CSV (times in ms from the step's start) and as a PNG: one row per
// device, a bar per forward, backward, copy and wait.
void write_timeline(const std::vector<pp::Span>& spans, int step, const std::string& csv, const std::string& png,
                    const std::string& title, int stages) {
  double t0 = 1e300;
  int devices = 0;
  for (const pp::Span& s : spans)
    if (s.step == step) t0 = std::min(t0, s.begin), devices = std::max(devices, s.replica * stages + s.stage + 1);
  std::ostringstream f;
  f << "replica,stage,device,kind,micro,begin_ms,end_ms\n";
  for (const pp::Span& s : spans)
    if (s.step == step)
      f << s.replica << ',' << s.stage << ',' << s.replica * stages + s.stage << ',' << s.kind << ',' << s.micro << ','
        << (s.begin - t0) * 1e3 << ',' << (s.end - t0) * 1e3 << '\n';
  mgpu::write_whole_file(csv, f.str());
  // One bar (boxxyerror: x centre, y, half width, half height) per span of a kind, per device row.
  std::string plot = "set title " + mgpu::gnuplot_text(title) + "\nset xlabel 'ms from the start of the step'\nset ylabel 'device'\n"
                     "set yrange [" + std::to_string(devices) + " - 0.4:-0.6]\nset ytics 1\nset style fill solid 0.8 noborder\nset key outside\n"
                     "plot ";
  const char* kinds[] = {"F", "B", "C", "W", "U"};
  const char* labels[] = {"forward", "backward", "copy in", "wait", "update"};
  const char* colors[] = {"#4477aa", "#ee6677", "#228833", "#cccccc", "#aa3377"};
  for (int i = 0; i < 5; ++i)
    plot += std::string(i ? ", " : "") + mgpu::gnuplot_file(csv, png) +
            " skip 1 using (($6+$7)/2):3:(($7-$6)/2):(strcol(4) eq '" + kinds[i] +
            "' ? 0.35 : 1/0) with boxxyerror lc rgb '" + colors[i] + "' title '" + labels[i] + "'";
  if (mgpu::run_gnuplot(png, plot + "\n")) std::printf("wrote %s\n", png.c_str());
}

const mgpu::ChapterInfo kChapter{"07_model_parallel",
                                 "LeNet split across devices: model parallelism, GPipe and 1F1B pipelines",
                                 /*default_devices=*/2, /*max_devices=*/64, /*default_lr=*/0.2f,
                                 /*eval_flag=*/false};

pp::PipelineConfig pipeline_config(const ChapterOptions& c) {
  pp::PipelineConfig config;
  config.cuts = c.cuts;
  config.micro_batches = c.micro_batches;
  config.schedule = c.schedule;
  config.replicas = c.replicas;
  return config;
}

// The stages, the schedule, the micro-batches and what each stage keeps.
void say_pipeline(const pp::Pipeline& pipeline, const ChapterOptions& c, const mgpu::Options& o) {
  const int R = c.replicas, k = o.devices / R;
  std::printf("backend %s, %d stage(s) x %d replica(s), schedule %s, %d micro-batch(es) of up to %d images\n%s",
              mgpu::kBackendName, k, R, pp::name_of(c.schedule), c.micro_batches,
              (o.batch_size / R + c.micro_batches - 1) / c.micro_batches, pipeline.mapping().c_str());
  for (int s = 0; s < k; ++s)
    std::printf("stage %d keeps %d micro-batch(es) of activations: %.2f MB\n", s, pipeline.slots(s),
                pipeline.activation_bytes(s) / 1e6);
}

// The run's files are named after the settings that differ from the defaults: 07_model_parallel
// for GPipe's 2 stages of 4 micro-batches, 07_model_parallel_devices-4_data-parallel-2 for
// the hybrid. The defaults of --split and --micro-batches are those of the run's shape: the
// stages' default cuts, and 1 micro-batch for the naive schedule.
mgpu::RunSettings run_settings(const ChapterOptions& c, const mgpu::Options& o) {
  auto joined = [](const std::vector<int>& cuts) {
    std::string text;
    for (const int cut : cuts) text += (text.empty() ? "" : ",") + std::to_string(cut);
    return text;
  };
  const ChapterOptions d;
  mgpu::RunSettings settings = mgpu::shared_settings(o, kChapter);
  settings.insert(settings.end(),
                  {{"split", joined(c.cuts), joined(pp::default_cuts(o.devices / c.replicas))},
                   {"schedule", pp::name_of(c.schedule), pp::name_of(d.schedule)},
                   {"micro-batches", std::to_string(c.micro_batches),
                    c.schedule == pp::Schedule::Naive ? "1" : std::to_string(d.micro_batches)},
                   {"data-parallel", std::to_string(c.replicas), std::to_string(d.replicas)},
                   {"profile-steps", std::to_string(c.profile_steps), std::to_string(d.profile_steps)}});
  return settings;
}

// The bubble: a few more steps of the last epoch's order, each device's spans timed.
void measure_the_bubble(pp::Pipeline& pipeline, const ChapterOptions& c, const mgpu::Options& o, int train_count,
                        const std::string& run) {
  const int R = c.replicas, k = o.devices / R;
  std::vector<pp::Span> spans;
  const int n = mgpu::largest_batch(o.batch_size, train_count);
  pipeline.step(0, n, o.lr);  // warm-up, untimed
  for (int i = 0; i < c.profile_steps; ++i) pipeline.step(0, n, o.lr, &spans);
  const int m = std::min(c.micro_batches, n / R);
  const pp::Bubble b = pp::measure_bubble(spans, k, m);
  const std::vector<double> predicted = pp::predicted_idle(b.stage_time, m);
  std::printf("\nthe bubble over %d steps of %d images (replica 0; a step lasts %.2f ms):\n", c.profile_steps, n,
              b.step_seconds * 1e3);
  for (int s = 0; s < k; ++s)
    std::printf("bubble: schedule=%s stages=%d micro_batches=%d replicas=%d stage=%d busy=%.3f idle=%.3f "
                "formula=%.3f predicted=%.3f stage_ms=%.3f step_ms=%.3f activation_mb=%.3f\n",
                pp::name_of(c.schedule), k, m, R, s, b.busy[s], b.idle[s], pp::bubble_formula(k, m), predicted[s],
                b.stage_time[s] * 1e3, b.step_seconds * 1e3, pipeline.activation_bytes(s) / 1e6);
  std::printf("(formula: (k-1)/(m+k-1), equal stages; predicted: the same with each stage's measured time)\n");
  const std::filesystem::path out(o.out);
  write_timeline(spans, c.profile_steps - 1, (out / (run + "_timeline.csv")).string(),
                 (out / (run + "_timeline.png")).string(),
                 run + ": one step, device by device (" + mgpu::kBackendName + ")", k);
}

}  // namespace

int main(int argc, char** argv) {
  mgpu::start_program(argv);  // first: line-buffered output; it may start the program again (see its header)
  ChapterOptions c;
  const mgpu::Options o =
      mgpu::parse_command_line(argc, argv, kChapter, [&c](CLI::App& app) { add_flags(app, c); });
  if (const std::string why = check(c, o); !why.empty()) mgpu::refuse_command_line(kChapter.name, why);
  return mgpu::run_or_report(kChapter.name, [&] {
    const mgpu::FashionMnist data = mgpu::load_data(o);
    mgpu::check_batches_fit(data.train.count, o.batch_size, c.replicas);  // every replica gets part of every batch
    pp::Pipeline pipeline(pipeline_config(c), lenet::init_params(o.seed),
                          mgpu::largest_batch(o.batch_size, data.train.count));
    say_pipeline(pipeline, c, o);
    pipeline.set_training_data(data.train);
    const mgpu::RunSettings settings = run_settings(c, o);
    const std::string run = mgpu::run_name(kChapter.name, o.run_name, settings);
    mgpu::TrainingLog log(kChapter.name, run, o, settings, o.devices, data.train.count);
    pp::train(pipeline, data, o, log);
    if (c.profile_steps > 0) measure_the_bubble(pipeline, c, o, data.train.count, run);
    log.finish();
    return 0;
  });
}
