// Chapter 08: a parameter server. k workers (--devices) pull LeNet's parameters from s server
// shards (--servers), compute a gradient on their piece of a batch, and push it back; the server
// applies it in one of three modes (--mode bsp|asp|ssp, --staleness for ssp). --straggler I:F
// makes worker I take F times as long per piece of work.
//   build/bin/08_parameter_server [--mode asp] [--devices 4] [--servers 1] [--straggler 0:3] ...
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>  // CLI::App: where the chapter declares its own flags

#include "common/cli.h"  // parse_command_line: the flags every chapter shares
#include "common/device.h"  // DeviceSet, Buffer, Event: what a device is in either build
#include "common/program.h"  // start_program, load_data, run_or_report: what every program does
#include "common/report.h"  // TrainingLog, plot_runs: the epoch lines, the CSV, the plot
#include "parameter_server.h"  // ParameterServer: shards, pull and push, bsp/asp/ssp
#include "train.h"  // train: workers on threads, the epoch loop

namespace {

struct Flags {
  ps::Settings settings;
  int servers = 1;
  bool staleness_given = false;  // --staleness given, not the default
  std::string straggler_text;  // as typed, for the run's name
};

// "I:F": a worker index and a slowdown factor, read into `f` ("" when good, else why not).
std::string read_straggler(const std::string& v, Flags& f) {
  const std::size_t colon = v.find(':');
  const auto index = mgpu::to_integer(v.substr(0, colon));
  const auto factor = colon == std::string::npos ? std::nullopt : mgpu::to_real(v.substr(colon + 1));
  if (!index || !factor) return "needs WORKER:FACTOR, e.g. 0:3, got '" + v + "'";
  if (*index < 0) return "the worker must be at least 0, got " + std::to_string(*index);
  if (!(*factor >= 1 && *factor <= 100)) return "the factor must be from 1 to 100, got '" + v.substr(colon + 1) + "'";
  f.settings.straggler = static_cast<int>(*index);
  f.settings.slowdown = *factor;
  f.straggler_text = std::to_string(*index) + "x" + v.substr(colon + 1);
  return "";
}

void add_flags(CLI::App& app, Flags& f) {
  app.add_option_function<std::string>(
         "--mode",
         [&f](const std::string& v) {
           f.settings.mode = v == "asp" ? ps::Mode::Asp : v == "ssp" ? ps::Mode::Ssp : ps::Mode::Bsp;
         },
         "bsp: wait for all k pushes, step once; asp: apply each push as it arrives; ssp: as asp, but no "
         "worker runs more than --staleness steps ahead of the slowest")
      ->check(CLI::IsMember({"bsp", "asp", "ssp"}))
      ->default_str("bsp");
  // Whether it was given is noted as it is read (each): the app, and its options, are gone by the
  // time check_flags() runs.
  app.add_option("--staleness", f.settings.staleness, "ssp's bound (only with --mode ssp)")
      ->transform(mgpu::integer(0, 1000))
      ->each([&f](const std::string&) { f.staleness_given = true; })
      ->capture_default_str();
  app.add_option("--servers", f.servers, "server shards, each on its own device")
      ->transform(mgpu::integer(1, 64))
      ->capture_default_str();
  app.add_option_function<std::string>(
         "--straggler", [&f](const std::string& v) { read_straggler(v, f); },
         "worker I (0-based) takes F times as long per piece of work (F from 1 to 100); --devices K is "
         "the number of workers, and the run uses K + S devices")
      ->type_name("I:F")
      ->check([](const std::string& v) {
        Flags scratch;  // the check reads the value, the callback above stores it
        return read_straggler(v, scratch);
      });
}

// The checks between flags, once all are read: the reason, or "".
std::string check_flags(const Flags& f, const mgpu::Options& o) {
  if (f.staleness_given && f.settings.mode != ps::Mode::Ssp)
    return "--staleness is the bound of --mode ssp; it means nothing with --mode " + ps::mode_name(f.settings.mode);
  if (f.settings.straggler >= o.devices)
    return "--straggler " + std::to_string(f.settings.straggler) + ": there are only " + std::to_string(o.devices) +
           " workers (0.." + std::to_string(o.devices - 1) + ")";
  return "";
}

// The run's settings, for its name and its JSON: the shared flags and this chapter's own.
// 08_parameter_server for BSP on 2 workers, 08_parameter_server_devices-4_mode-ssp_straggler-0x3
// for --devices 4 --mode ssp --straggler 0:3.
mgpu::RunSettings run_settings(const Flags& f, const mgpu::Options& o, const mgpu::ChapterInfo& chapter) {
  const Flags d;
  mgpu::RunSettings s = mgpu::shared_settings(o, chapter);
  s.insert(s.end(), {{"mode", ps::mode_name(f.settings.mode), ps::mode_name(d.settings.mode)},
                     {"staleness", std::to_string(f.settings.staleness), std::to_string(d.settings.staleness)},
                     {"servers", std::to_string(f.servers), std::to_string(d.servers)},
                     {"straggler", f.straggler_text.empty() ? "none" : f.straggler_text, "none"}});
  return s;
}

std::filesystem::path out_file(const mgpu::Options& o, const std::string& name) {
  return std::filesystem::path(o.out) / name;
}

// <run>_pushes.csv: every push as shard 0 applied it. <run>_workers.csv: per epoch and worker,
// the pieces of work done and the seconds spent waiting. <run>_staleness.csv: the histogram per
// epoch, and its plot.
void write_push_files(const std::string& run, const mgpu::Options& o, const ps::RunResult& r) {
  std::ostringstream pushes;
  pushes << "worker,shard,epoch,pulled,applied,staleness,seconds\n";
  for (const ps::PushRecord& p : r.records)
    if (p.shard == 0)
      pushes << p.worker << ',' << p.shard << ',' << p.epoch << ',' << p.pulled << ',' << p.applied << ','
             << p.staleness() << ',' << p.seconds << '\n';
  std::ostringstream workers;
  workers << "epoch,worker,items,clock_wait_s,straggler_sleep_s\n";
  for (std::size_t e = 0; e < r.workers.size(); ++e)
    for (std::size_t i = 0; i < r.workers[e].size(); ++i)
      workers << e + 1 << ',' << i << ',' << r.workers[e][i].items << ',' << r.workers[e][i].clock_wait_s << ','
              << r.workers[e][i].straggler_sleep_s << '\n';
  const std::string csv = out_file(o, run + "_staleness.csv").string();
  std::ostringstream hist;
  hist << "epoch,staleness,pushes\n";
  std::size_t stalest = 0;  // the whole run's histogram's length: stalenesses 0 .. stalest - 1
  for (int e = 0; e <= o.epochs; ++e) {  // epoch 0: the whole run
    const std::vector<std::int64_t> h = ps::staleness_histogram(r.records, e);
    if (e == 0) stalest = h.size();
    for (std::size_t s = 0; s < h.size(); ++s) hist << e << ',' << s << ',' << h[s] << '\n';
  }
  mgpu::write_whole_file(out_file(o, run + "_pushes.csv").string(), pushes.str());
  mgpu::write_whole_file(out_file(o, run + "_workers.csv").string(), workers.str());
  mgpu::write_whole_file(csv, hist.str());
  // The axes from 0, every staleness that occurred on the x-axis: a run whose pushes all had one
  // staleness (BSP's 0) is one bar on a readable axis, not an axis of one value gnuplot warns about.
  const std::string png = out_file(o, run + "_staleness.png").string();
  if (mgpu::run_gnuplot(png, "set title " + mgpu::gnuplot_text(run + ": staleness of the pushes (all epochs)") + "\n"
                             "set xlabel 'staleness (updates between pull and push)'\nset ylabel 'pushes'\n"
                             "set xrange [-0.5:" + std::to_string(std::max<std::size_t>(stalest, 1)) + "-0.5]\n"
                             "set xtics 1\nset yrange [0:*]\nset style fill solid 0.6\nset boxwidth 0.8\nset key off\n"
                             "plot " + mgpu::gnuplot_file(csv, png) +
                             " using 2:($1 == 0 ? $3 : 1/0) with boxes\n"))
    std::printf("wrote %s\n", png.c_str());
  if (stalest == 1)
    std::printf("(every push had staleness 0: each was applied to the very version its gradient was computed on,\n"
                "as under BSP or with one worker; the staleness plot is one bar)\n");
}

// Bytes through the server per step, measured and from the formula, beside the ring's, and
// chapter 03's cost model for two interconnects.
void print_bandwidth(const Flags& f, const mgpu::Options& o, const ps::RunResult& r) {
  const int k = o.devices, s = f.servers;
  const double model = static_cast<double>(lenet::flat_count()) * sizeof(float);
  const double steps = static_cast<double>(r.steps_per_epoch) * o.epochs;
  const double measured = (r.traffic.pulled + r.traffic.pushed) / steps / s;
  std::printf("\nbytes per step (one batch, k = %d workers, model %.0f bytes):\n", k, model);
  std::printf("  through one server shard's link: measured %.0f, formula 2k/s x model = %.0f (s = %d)\n", measured,
              ps::server_bytes_per_step(k, s, model), s);
  std::printf("  through each device's link in chapter 03's ring: 2(k-1)/k x model = %.0f\n",
              ps::ring_bytes_per_device(k, model));
  std::printf("  cost model (chapter 03, alpha 10 us), one step's exchange:\n");
  std::printf("    %-34s %3s %3s %12s %12s\n", "interconnect", "k", "s", "server (us)", "ring (us)");
  for (const cost::Interconnect& c : cost::published_interconnects(10e-6))
    for (int kk : {2, 4, 8})
      for (int ss : {1, kk})
        std::printf("    %-34s %3d %3d %12.1f %12.1f\n", c.name.c_str(), kk, ss,
                    1e6 * ps::server_seconds(c, kk, ss, model), 1e6 * cost::ring_seconds(c, kk, model));
}

void print_summary(const Flags& f, const mgpu::Options& o, const ps::RunResult& r) {
  const std::vector<std::int64_t> h = ps::staleness_histogram(r.records);
  std::int64_t pushes = 0, total = 0;
  for (std::size_t s = 0; s < h.size(); ++s) {
    pushes += h[s];
    total += h[s] * static_cast<std::int64_t>(s);
  }
  std::printf("staleness of %lld pushes:", static_cast<long long>(pushes));
  for (std::size_t s = 0; s < h.size(); ++s) std::printf(" %zu:%lld", s, static_cast<long long>(h[s]));
  std::printf("\n");
  for (std::size_t i = 0; i < r.workers.back().size(); ++i) {
    const ps::WorkerStats& w = r.workers.back()[i];
    std::printf("worker %zu, last epoch: %d pieces of work, waited %.2f s for slower workers%s\n", i, w.items,
                w.clock_wait_s, i == std::size_t(f.settings.straggler) ? " (the straggler)" : "");
  }
  const double model = static_cast<double>(lenet::flat_count()) * sizeof(float);
  std::printf("parameter_server: mode=%s staleness_bound=%s workers=%d servers=%d straggler=%s pushes=%lld "
              "staleness_mean=%.3f staleness_max=%zu server_bytes_per_step=%.0f ring_bytes_per_step=%.0f\n",
              ps::mode_name(f.settings.mode).c_str(),
              f.settings.mode == ps::Mode::Ssp ? std::to_string(f.settings.staleness).c_str()
                                               : (f.settings.mode == ps::Mode::Bsp ? "0" : "none"),
              o.devices, f.servers, f.straggler_text.empty() ? "none" : f.straggler_text.c_str(),
              static_cast<long long>(pushes), pushes ? double(total) / pushes : 0.0, h.empty() ? 0 : h.size() - 1,
              ps::server_bytes_per_step(o.devices, f.servers, model), ps::ring_bytes_per_device(o.devices, model));
}

}  // namespace

int main(int argc, char** argv) {
  mgpu::start_program(argv);  // first: line-buffered output; it may start the program again (see its header)
  const mgpu::ChapterInfo chapter{"08_parameter_server",
                                  "a parameter server: synchronous, asynchronous and bounded-staleness SGD",
                                  /*default_devices=*/2, /*max_devices=*/64, /*default_lr=*/0.2f,
                                  /*eval_flag=*/false};
  Flags f;
  const mgpu::Options o = mgpu::parse_command_line(argc, argv, chapter, [&f](CLI::App& app) { add_flags(app, f); });
  if (const std::string why = check_flags(f, o); !why.empty()) mgpu::refuse_command_line(chapter.name, why);
  return mgpu::run_or_report(chapter.name, [&] {
    const ps::Placement placement{f.servers, o.devices};
    const mgpu::DeviceSet devices(placement.devices());
    std::printf("backend %s, %d server shard(s) on devices 0..%d, %d workers on devices %d..%d\n%s%s",
                mgpu::kBackendName, f.servers, f.servers - 1, o.devices, f.servers, placement.devices() - 1,
                devices.mapping().c_str(), mgpu::enable_peer_access(devices).c_str());
    const mgpu::FashionMnist data = mgpu::load_data(o);
    const mgpu::RunSettings settings = run_settings(f, o, chapter);
    const std::string run = mgpu::run_name(chapter.name, o.run_name, settings);
    std::printf("== mode %s%s, %d workers, %d server shard(s)%s\n", ps::mode_name(f.settings.mode).c_str(),
                f.settings.mode == ps::Mode::Ssp ? (" (bound " + std::to_string(f.settings.staleness) + ")").c_str()
                                                 : "",
                o.devices, f.servers,
                f.straggler_text.empty() ? "" : (", straggler " + f.straggler_text).c_str());
    mgpu::TrainingLog log(chapter.name, run, o, settings, o.devices, data.train.count);
    const ps::RunResult r = ps::train(devices, placement, data, o, f.settings, log);
    write_push_files(run, o, r);
    print_bandwidth(f, o, r);
    print_summary(f, o, r);
    log.finish();
    return 0;
  });
}
