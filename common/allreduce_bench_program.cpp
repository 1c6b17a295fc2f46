// The allreduce benchmark as a program: its command line, the measured tables, and the cost
// model beside them. Chapter 03's 03_allreduce_bench compares naive and ring; chapter 04's
// adds NCCL by passing one more collective.

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <set>
#include <sstream>

#include "allreduce_bench.h"
#include "backend.h"
#include "check.h"
#include "cli.h"
#include "cost_model.h"
#include "memory.h"  // host_memory_available, gpu_memory_available, gib
#include "program.h"
#include "report.h"

namespace bench {
namespace {

using mgpu::gib;

// A byte count as nccl-tests reads one: a number, then K, M or G (powers of 1024, either case):
// "4096", "512K", "1.5M", "1g". Here it must also come to a whole number of floats, at most 1 TiB.
std::optional<std::size_t> to_bytes(const std::string& s) {
  if (s.empty()) return std::nullopt;
  double unit = 1;
  switch (s.back()) {
    case 'K': case 'k': unit = 1 << 10; break;
    case 'M': case 'm': unit = 1 << 20; break;
    case 'G': case 'g': unit = 1 << 30; break;
    default: break;
  }
  const auto n = mgpu::to_real(unit == 1 ? s : s.substr(0, s.size() - 1));
  if (!n || *n < 0 || *n * unit > double(1ULL << 40) || *n * unit != std::floor(*n * unit)) return std::nullopt;
  return static_cast<std::size_t>(*n * unit);
}

// The check of a message size as typed: the messages are floats, so a size is a whole number
// of them (1023 bytes would silently be measured as 1020).
std::string check_byte_count(const std::string& v) {
  const auto bytes = to_bytes(v);
  if (!bytes) return "needs a byte count up to 1024G (such as 4096, 512K, 256M, 1G), got '" + v + "'";
  if (*bytes < 4) return "must be at least 4 (one float), got " + v;
  if (*bytes % 4 != 0) return v + " is not a multiple of 4: the messages are floats, 4 bytes each";
  return "";
}

// "2,4,8": each from 1 to 64.
std::optional<std::vector<int>> to_device_counts(const std::string& v) {
  std::vector<int> counts;
  std::stringstream in(v + ",");  // a trailing comma: "2," has an empty last count
  for (std::string word; std::getline(in, word, ',');) {
    const auto k = mgpu::to_integer(word);
    if (!k || *k < 1 || *k > 64) return std::nullopt;
    counts.push_back(static_cast<int>(*k));
  }
  return counts;
}

// nccl-tests' flags, with the names this benchmark had before as aliases (--min-bytes, ...).
struct Flags {
  CLI::Option *stepfactor, *stepbytes;
};
Flags add_bench_flags(CLI::App& app, Settings& s) {
  const auto bytes = [&app](const std::string& names, std::size_t& dst, const std::string& help) {
    return app
        .add_option_function<std::string>(names, [&dst](const std::string& v) { dst = *to_bytes(v); }, help)
        ->type_name("BYTES")
        ->check(check_byte_count)
        ->default_str(std::to_string(dst));
  };
  std::string counts;  // as the usage shows the default: 2,4,8
  for (int k : s.device_counts) counts += (counts.empty() ? "" : ",") + std::to_string(k);
  app.add_option_function<std::string>(
         "-g,--ngpus,--devices", [&s](const std::string& v) { s.device_counts = *to_device_counts(v); },
         "device counts to measure, each 1 to 64, comma-separated; each count is one run of nccl-tests' "
         "-t 1 -g K (see below)")
      ->type_name("LIST")
      ->check([](const std::string& v) {
        return to_device_counts(v) ? "" : "needs a comma-separated list of device counts from 1 to 64, got '" + v + "'";
      })
      ->default_str(counts);
  bytes("-b,--minbytes,--min-bytes", s.min_bytes, "smallest message, a multiple of 4 bytes (floats); K, M, G suffixes");
  bytes("-e,--maxbytes,--max-bytes", s.max_bytes, "largest message, at most 1024G");
  Flags f;
  f.stepfactor = app.add_option("-f,--stepfactor", s.step_factor, "each size is the one before times F")
                     ->transform(mgpu::integer(2, 1024))
                     ->capture_default_str();
  f.stepbytes = bytes("-i,--stepbytes", s.step_bytes, "each size is the one before plus N bytes (instead of -f)");
  app.add_option("-w,--warmup_iters,--warmup", s.warmup, "untimed runs before the check, 0 to 1000000")
      ->transform(mgpu::integer(0, 1'000'000))
      ->capture_default_str();
  app.add_option("-n,--iters", s.iters,
                 "timed runs per size, 0 to 1000000; 0: enough for ~0.2 s by the warmup's time, at least 10")
      ->transform(mgpu::integer(0, 1'000'000))
      ->capture_default_str();
  app.add_option("--alpha-us", s.alpha_us, "the cost model's per-operation latency on the published links, 0 to 1e6")
      ->check(mgpu::real(0, 1e6))  // up to 1 s: beyond, the tables say nothing
      ->capture_default_str();
  app.add_option("--out", s.out, "where the CSV files and the plot go")->check(mgpu::text("a directory"))->capture_default_str();
  app.footer(
      "How the flags map to nccl-tests': -b -e -f -i -n -w mean what they mean there (the defaults differ).\n"
      "nccl-tests runs threads (-t) x GPUs per thread (-g) ranks in each process. Here one process and one\n"
      "thread drive every device, so -g K is nccl-tests' -t 1 -g K: K ranks; a list measures each count\n"
      "in turn. A device is logical: in the cuda build device i is on GPU i % (GPUs seen), so K may\n"
      "exceed the GPUs (they are shared; chapter 04's NCCL column needs one GPU each), and in the cpu\n"
      "build a device is a worker thread with its share of the cores.\n"
      "Memory: K devices at -e S hold (K + 2) S on the devices (a buffer each, the ring's and the naive\n"
      "allreduce's staging) and 2 S on the host (the check); a run that does not fit (host memory in the\n"
      "cpu build, each GPU's in the cuda build) is refused before it starts.");
  return f;
}

// The checks between flags, once all are read.
std::string check_settings(const Settings& s, const Flags& f) {
  if (s.min_bytes > s.max_bytes)
    return "--minbytes " + std::to_string(s.min_bytes) + " is larger than --maxbytes " + std::to_string(s.max_bytes);
  if (f.stepfactor->count() > 0 && f.stepbytes->count() > 0)
    return "--stepfactor and --stepbytes are two ways to step through the sizes: give one";
  if (s.step_bytes > 0 && (s.max_bytes - s.min_bytes) / s.step_bytes >= 1000)
    return "--stepbytes " + std::to_string(s.step_bytes) + " makes more than 1000 sizes from " +
           std::to_string(s.min_bytes) + " to " + std::to_string(s.max_bytes) + " bytes: a larger step, or -f";
  if (s.iters == 0 && s.warmup == 0)
    return "--iters 0 (the default) chooses the number of timed runs from the time of the warmup runs: "
           "give --warmup_iters 1 or more, or --iters N";
  return "";
}

// Why the run cannot fit in this machine's memory ("" if it can), asked before anything is
// allocated: a benchmark that asks for more than there is should say so, not make the machine
// swap or have the kernel kill it.
std::string memory_refusal(const Settings& s) {
  const int gpus = mgpu::gpu_count();
  if (mgpu::kCudaBackend && gpus == 0) return "";  // nothing to measure: DeviceSet says no GPU answers
  const mgpu::MemoryAvailable host = mgpu::host_memory_available();
  for (int k : s.device_counts) {
    const MemoryNeed need = memory_needed(s, k, gpus);
    const std::string run = "a run on " + std::to_string(k) + " devices at --maxbytes " + gib(s.max_bytes) + " needs ";
    const std::string advice = ": lower --maxbytes (-e) or the device counts (-g)";
    if (need.host_bytes > host.bytes)
      return run + gib(need.host_bytes) + " of host memory, and " + gib(host.bytes) + " is available (" +
             host.source + ")" + advice;
#if MGPU_CUDA
    for (std::size_t g = 0; g < need.gpu_bytes.size(); ++g) {
      const mgpu::MemoryAvailable free = mgpu::gpu_memory_available(static_cast<int>(g));
      if (need.gpu_bytes[g] > free.bytes)
        return run + gib(need.gpu_bytes[g]) + " of memory on GPU " + std::to_string(g) + ", and " + gib(free.bytes) +
               " is available there (" + free.source + ")" + advice;
    }
#endif
  }
  return "";
}

std::string human_bytes(double bytes) {
  char buf[32];
  if (bytes >= (1 << 20))
    std::snprintf(buf, sizeof buf, "%.0f MiB", bytes / (1 << 20));
  else if (bytes >= (1 << 10))
    std::snprintf(buf, sizeof buf, "%.0f KiB", bytes / (1 << 10));
  else
    std::snprintf(buf, sizeof buf, "%.0f B", bytes);
  return buf;
}

// The measured setup: each (device count, algorithm) at a few sizes, measured vs predicted.
void print_model_check(const cost::SharedMemory& m, const std::vector<Measurement>& results,
                       const Settings& settings) {
  const std::set<std::size_t> sizes = {settings.min_bytes, 4096, 512 << 10, 64 << 20, settings.max_bytes};
  std::printf("\n# cost model, shared memory (this machine's devices share one memory; alpha and beta measured\n"
              "# above): every copy and add runs one after another. Measured vs predicted:\n"
              "# %8s %10s %9s %14s %14s %9s\n",
              "devices", "size", "algorithm", "measured(us)", "predicted(us)", "ratio");
  for (const Measurement& r : results) {
    if (!sizes.count(r.bytes) || (r.algorithm != "naive" && r.algorithm != "ring")) continue;
    const double predicted = 1e6 * (r.algorithm == "naive" ? cost::naive_seconds(m, r.devices, r.bytes)
                                                           : cost::ring_seconds(m, r.devices, r.bytes));
    std::printf("  %8d %10s %9s %14.1f %14.1f %9.2f\n", r.devices, human_bytes(r.bytes).c_str(),
                r.algorithm.c_str(), r.time_us, predicted, predicted > 0 ? r.time_us / predicted : 0.0);
  }
}

// What the model predicts on links this machine does not have (printed for the program's
// bucket, LeNet's gradients, and 256 MiB, k = 2..8).
void print_interconnect_predictions(const Settings& settings, const Contenders& contenders) {
  const double bucket_bytes = contenders.bucket_bytes;
  const double large_bytes = double(std::size_t(256) << 20);
  for (const cost::Interconnect& c : cost::published_interconnects(settings.alpha_us * 1e-6)) {
    std::printf("\n# cost model, %s: B = %.0f GB/s each way per device, adds at %.0f GB/s, alpha = %.1f us\n"
                "#   (%s)\n"
                "# %7s  %30s  %30s\n# %7s  %9s %9s %10s  %9s %9s %10s\n",
                c.name.c_str(), c.link_bytes_s / 1e9, c.add_bytes_s / 1e9, c.alpha_s * 1e6, c.source.c_str(),
                "", (contenders.bucket_label + ", " + human_bytes(bucket_bytes)).c_str(), human_bytes(large_bytes).c_str(),
                "devices", "naive us", "ring us", "naive/ring", "naive us", "ring us", "naive/ring");
    for (int k = 2; k <= 8; ++k) {
      std::printf("  %7d", k);
      for (double bytes : {bucket_bytes, large_bytes}) {
        const double naive = cost::naive_seconds(c, k, bytes) * 1e6, ring = cost::ring_seconds(c, k, bytes) * 1e6;
        std::printf("  %9.1f %9.1f %10.2f", naive, ring, naive / ring);
      }
      std::printf("\n");
    }
  }
}

// Every model's prediction at every measured device count and size, as CSV: this machine's
// (shared memory, alpha and beta as calibrated) and the published interconnects'. The figure of
// measured times beside the predictions is drawn from it (make_figures.sh).
void write_model_csv(const std::string& path, const cost::SharedMemory& shared, const Settings& settings) {
  std::ostringstream csv;
  csv << "model,devices,bytes,naive_us,ring_us\n";
  const auto row = [&](const std::string& name, const auto& model, int k, double bytes) {
    csv << '"' << name << "\"," << k << ',' << bytes << ',' << cost::naive_seconds(model, k, bytes) * 1e6 << ','
        << cost::ring_seconds(model, k, bytes) * 1e6 << '\n';
  };
  // One model and device count after another: a plotting tool then draws each as one line.
  const auto rows = [&](const std::string& name, const auto& model) {
    for (int k : settings.device_counts)
      for (std::size_t bytes : message_sizes(settings)) row(name, model, k, double(bytes));
  };
  rows("this machine (shared memory)", shared);
  for (const cost::Interconnect& c : cost::published_interconnects(settings.alpha_us * 1e-6)) rows(c.name, c);
  mgpu::write_whole_file(path, csv.str());
}

}  // namespace

std::vector<std::size_t> message_sizes(const Settings& s) {
  std::vector<std::size_t> sizes;
  for (std::size_t bytes = s.min_bytes; bytes <= s.max_bytes; bytes = s.step_bytes ? bytes + s.step_bytes : bytes * s.step_factor)
    sizes.push_back(bytes);
  return sizes;
}

namespace {

// The benchmark's app, bound to `settings`; the flags it returns say which were given.
Flags declare(CLI::App& app, Settings& settings) {
  mgpu::prepare_app(app);
  return add_bench_flags(app, settings);
}

const char* const kSummary = "allreduce bandwidth, nccl-tests style: time, algbw, busbw and wrong elements per size";

}  // namespace

std::string usage(const std::string& program, const Settings& defaults) {
  Settings s = defaults;
  CLI::App app{kSummary, program};
  declare(app, s);
  return app.help();
}

ParsedSettings parse_settings(const std::vector<std::string>& args, const Settings& defaults) {
  ParsedSettings r;
  r.settings = defaults;
  CLI::App app{kSummary, "allreduce_bench"};
  const Flags flags = declare(app, r.settings);
  const mgpu::Parsed p = mgpu::parse(app, args);
  r.help = p.help;
  r.error = p.error;
  if (!r.help && r.error.empty()) r.error = check_settings(r.settings, flags);
  return r;
}

Settings parse_command_line(int argc, char** argv, const std::string& program, const Settings& defaults) {
  const ParsedSettings parsed = parse_settings(std::vector<std::string>(argv + 1, argv + argc), defaults);
  if (parsed.help) {
    std::printf("%s", usage(program, defaults).c_str());
    std::exit(0);
  }
  if (!parsed.error.empty()) mgpu::refuse_command_line(program, parsed.error);
  return parsed.settings;
}

MemoryNeed memory_needed(const Settings& settings, int devices, int gpus) {
  // As run_benchmark (allreduce_bench.cpp), chapter 02's allreduce and the ring allocate them,
  // for the largest size.
  const std::size_t n = std::max<std::size_t>(1, settings.max_bytes / sizeof(float));
  const std::size_t buffer = n * sizeof(float);
  const std::size_t chunk = (n + devices - 1) / devices * sizeof(float);  // the ring's largest chunk
  std::vector<std::size_t> on_device(devices, buffer + chunk);  // the data; the ring's staging for a chunk
  on_device[0] += buffer;                                       // the naive allreduce's staging
  MemoryNeed need;
  need.host_bytes = 2 * buffer;  // the check: the exact sums, and one device's result copied back
  if (gpus == 0) {               // the cpu build: the devices are host memory too
    for (std::size_t b : on_device) need.host_bytes += b;
  } else {  // logical device i is on GPU i % gpus (DeviceSet)
    need.gpu_bytes.assign(std::min(devices, gpus), 0);
    for (int i = 0; i < devices; ++i) need.gpu_bytes[i % gpus] += on_device[i];
  }
  return need;
}

namespace {

// nccl-tests' last lines, so that scripts written for its output read ours: the wrong elements
// ("Out of bounds values", OK or FAILED) and the mean busbw over every size of the program's own
// collective (the last the program names: the ring in chapter 03, NCCL in chapter 04) at the
// largest device count, as nccl-tests averages the one collective and device count it ran.
// Before them, the same mean for every collective and device count, one comment line each.
void print_nccl_tests_footer(const std::vector<Measurement>& results, std::size_t wrong) {
  const std::vector<std::pair<std::string, int>> runs = runs_of(results);  // (algorithm, devices)
  auto mean_busbw = [&](const std::pair<std::string, int>& run) {
    double sum = 0;
    int n = 0;
    for (const Measurement& m : results)
      if (m.algorithm == run.first && m.devices == run.second) sum += m.busbw, ++n;
    return n ? sum / n : 0.0;
  };
  std::printf("\n");
  for (const auto& run : runs)
    std::printf("# Avg bus bandwidth of %s on %d device%s : %g\n", run.first.c_str(), run.second,
                run.second == 1 ? "" : "s", mean_busbw(run));
  std::pair<std::string, int> own{"", 0};  // the last algorithm listed, at its largest device count
  for (const auto& run : runs)
    if (run.first == runs.back().first && run.second >= own.second) own = run;
  std::printf("# Out of bounds values : %zu %s\n", wrong, wrong ? "FAILED" : "OK");
  std::printf("# Avg bus bandwidth    : %g \n#\n", runs.empty() ? 0.0 : mean_busbw(own));
}

}  // namespace

int main_program(int argc, char** argv, const std::string& program, const Contenders& contenders,
                 const Settings& defaults) {
  mgpu::start_program(argv);  // first: line-buffered output; it may start the program again (see its header)
  const Settings settings = parse_command_line(argc, argv, program, defaults);
  return mgpu::run_or_report(program, [&] {
    // Too large for this machine: a bad command line here.
    if (const std::string why = memory_refusal(settings); !why.empty()) mgpu::refuse_command_line(program, why);
    namespace fs = std::filesystem;
    mgpu::prepare_output_folder(settings.out);  // before minutes of measuring

    std::printf("backend %s\n", mgpu::kBackendName);
    const cost::SharedMemory shared = [] {
      const mgpu::DeviceSet pair(2);
      return cost::calibrate(pair);
    }();
    std::printf("measured between two devices here: a copy costs %.3f us + %.3f ms per MB, an add %.3f us + "
                "%.3f ms per MB\n",
                shared.copy_alpha_s * 1e6, shared.copy_s_per_byte * 1e3 * (1 << 20), shared.add_alpha_s * 1e6,
                shared.add_s_per_byte * 1e3 * (1 << 20));

    std::vector<Measurement> results;
    for (int k : settings.device_counts) {
      const mgpu::DeviceSet devices(k);
      std::printf("\n%s%s", devices.mapping().c_str(), mgpu::enable_peer_access(devices).c_str());
      const std::vector<Measurement> r = run_benchmark(devices, settings, contenders);
      results.insert(results.end(), r.begin(), r.end());
    }

    print_model_check(shared, results, settings);
    const std::string model_csv = (fs::path(settings.out) / (program + "_model.csv")).string();
    print_interconnect_predictions(settings, contenders);
    write_model_csv(model_csv, shared, settings);

    const std::string csv = (fs::path(settings.out) / (program + ".csv")).string();
    const std::string png = (fs::path(settings.out) / (program + ".png")).string();
    write_csv(csv, results);
    std::printf("\nwrote %s\nwrote %s\n", csv.c_str(), model_csv.c_str());
    if (plot(png, csv, program + ": allreduce bandwidth (" + mgpu::kBackendName + ")", results))
      std::printf("wrote %s\n", png.c_str());

    std::size_t wrong = 0;
    for (const Measurement& m : results) wrong += m.wrong;
    if (wrong) {
      std::fprintf(stderr, "%s: %zu wrong elements in all (see #wrong)\n", program.c_str(), wrong);
      print_nccl_tests_footer(results, wrong);
      return 1;
    }
    std::printf("every element of every allreduce checked: all correct\n");
    print_nccl_tests_footer(results, wrong);
    return 0;
  });
}

}  // namespace bench
