// The allreduce benchmark as a program: its command line, the measured tables, and the cost
// model beside them. Chapter 03's 03_allreduce_bench compares naive and ring; chapter 04's
// adds NCCL by passing one more algorithm.
#include <cstdio>
#include <filesystem>
#include <algorithm>
#include <fstream>
#include <optional>
#include <set>

#include "benchmark.h"
#include "common/backend.h"
#include "common/check.h"
#include "common/cli.h"
#include "cost_model.h"
#include "../01_lenet/lenet.h"

namespace bench {
namespace {

// "4096", "4K", "512K", "256M", "1G" (K, M, G: powers of 1024).
std::optional<long long> to_bytes(const std::string& s) {
  if (s.empty()) return std::nullopt;
  long long unit = 1;
  std::string digits = s;
  switch (s.back()) {
    case 'K': unit = 1LL << 10; break;
    case 'M': unit = 1LL << 20; break;
    case 'G': unit = 1LL << 30; break;
    default: break;
  }
  if (unit != 1) digits.pop_back();
  const auto n = mgpu::to_integer(digits);
  if (!n || *n < 0 || *n > (1LL << 40) / unit) return std::nullopt;
  return *n * unit;
}

std::optional<std::vector<int>> to_device_counts(const std::string& s) {
  std::vector<int> counts;
  std::size_t start = 0;
  while (start <= s.size()) {
    const std::size_t comma = std::min(s.find(',', start), s.size());
    const auto k = mgpu::to_integer(s.substr(start, comma - start));
    if (!k || *k < 1 || *k > 64) return std::nullopt;
    counts.push_back(static_cast<int>(*k));
    start = comma + 1;
  }
  return counts;
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
  const std::set<std::size_t> sizes = {settings.min_bytes / 4 * 4, 4096, 512 << 10, 64 << 20,
                                       settings.max_bytes / 4 * 4};
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

// What the model predicts on links this machine does not have; also written as CSV.
void print_interconnect_predictions(const Settings& settings, const std::string& csv_path) {
  std::ofstream csv(csv_path);
  if (!csv) throw mgpu::Error(csv_path + ": cannot be written");
  csv << "interconnect,devices,bytes,naive_us,ring_us\n";
  const double lenet_bytes = double(lenet::parameter_count()) * sizeof(float);
  const double large_bytes = double(std::size_t(256) << 20);
  for (const cost::Interconnect& c : cost::published_interconnects(settings.alpha_us * 1e-6)) {
    std::printf("\n# cost model, %s: B = %.0f GB/s each way per device, adds at %.0f GB/s, alpha = %.1f us\n"
                "#   (%s)\n"
                "# %7s  %30s  %30s\n# %7s  %9s %9s %10s  %9s %9s %10s\n",
                c.name.c_str(), c.link_bytes_s / 1e9, c.add_bytes_s / 1e9, c.alpha_s * 1e6, c.source.c_str(),
                "", ("LeNet's gradients, " + human_bytes(lenet_bytes)).c_str(), human_bytes(large_bytes).c_str(),
                "devices", "naive us", "ring us", "naive/ring", "naive us", "ring us", "naive/ring");
    for (int k = 2; k <= 8; ++k) {
      std::printf("  %7d", k);
      for (double bytes : {lenet_bytes, large_bytes}) {
        const double naive = cost::naive_seconds(c, k, bytes) * 1e6, ring = cost::ring_seconds(c, k, bytes) * 1e6;
        std::printf("  %9.1f %9.1f %10.2f", naive, ring, naive / ring);
        csv << '"' << c.name << "\"," << k << ',' << bytes << ',' << naive << ',' << ring << '\n';
      }
      std::printf("\n");
    }
  }
}

}  // namespace

std::string usage(const std::string& program, const Settings& defaults) {
  std::string counts;
  for (int k : defaults.device_counts) counts += (counts.empty() ? "" : ",") + std::to_string(k);
  return "usage: " + program +
         " [options]\n"
         "  allreduce bandwidth, nccl-tests style: time, algbw, busbw and wrong elements per size\n\n"
         "options:\n"
         "  --devices LIST    device counts to measure, comma-separated (default " + counts + ")\n"
         "  --min-bytes N     smallest message; K, M, G suffixes allowed (default 4)\n"
         "  --max-bytes N     largest message, reached by doubling (default 256M)\n"
         "  --warmup N        untimed runs before the check (default 5)\n"
         "  --iters N         timed runs per size; 0: enough for ~0.2 s, at least 10 (default 0)\n"
         "  --alpha-us X      the cost model's per-operation latency on the published links (default 5)\n"
         "  --out DIR         where the CSV files and the plot go (default results/)\n"
         "  --help            this text\n";
}

ParsedSettings parse_settings(const std::vector<std::string>& args, const Settings& defaults) {
  ParsedSettings r;
  r.settings = defaults;
  Settings& s = r.settings;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& flag = args[i];
    if (flag == "--help") {
      r.help = true;
      return r;
    }
    if (i + 1 == args.size()) {
      r.error = flag.rfind("--", 0) == 0 ? flag + " needs a value" : "unexpected argument '" + flag + "'";
      return r;
    }
    const std::string& v = args[++i];
    auto refuse = [&](const std::string& what) {
      r.error = flag + " needs " + what + ", got '" + v + "'";
      return r;
    };
    if (flag == "--devices") {
      const auto counts = to_device_counts(v);
      if (!counts) return refuse("a comma-separated list of device counts from 1 to 64");
      s.device_counts = *counts;
    } else if (flag == "--min-bytes" || flag == "--max-bytes") {
      const auto bytes = to_bytes(v);
      if (!bytes || *bytes < 4) return refuse("a byte count of at least 4 (suffixes K, M, G)");
      (flag == "--min-bytes" ? s.min_bytes : s.max_bytes) = static_cast<std::size_t>(*bytes);
    } else if (flag == "--warmup" || flag == "--iters") {
      const auto n = mgpu::to_integer(v);
      if (!n || *n < 0 || *n > 1000000) return refuse("an integer from 0 to 1000000");
      (flag == "--warmup" ? s.warmup : s.iters) = static_cast<int>(*n);
    } else if (flag == "--alpha-us") {
      const auto x = mgpu::to_real(v);
      if (!x || *x < 0) return refuse("a non-negative number of microseconds");
      s.alpha_us = *x;
    } else if (flag == "--out") {
      s.out = v;
    } else {
      r.error = "unknown option '" + flag + "'";
      return r;
    }
  }
  if (s.min_bytes > s.max_bytes)
    r.error = "--min-bytes " + std::to_string(s.min_bytes) + " is larger than --max-bytes " +
              std::to_string(s.max_bytes);
  return r;
}

int main_program(int argc, char** argv, const std::string& program, const AlgorithmFactory& make_algorithms,
                 const Settings& defaults) {
  const ParsedSettings parsed = parse_settings(std::vector<std::string>(argv + 1, argv + argc), defaults);
  if (!parsed.error.empty()) {
    std::fprintf(stderr, "%s: %s\n\n%s", program.c_str(), parsed.error.c_str(), usage(program, defaults).c_str());
    return 2;
  }
  if (parsed.help) {
    std::printf("%s", usage(program, defaults).c_str());
    return 0;
  }
  const Settings& settings = parsed.settings;
  try {
    namespace fs = std::filesystem;
    std::error_code ec;
    fs::create_directories(settings.out, ec);
    if (ec) throw mgpu::Error("--out " + settings.out + ": cannot create the directory: " + ec.message());

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
      const std::vector<Measurement> r = run_benchmark(devices, settings, make_algorithms);
      results.insert(results.end(), r.begin(), r.end());
    }

    print_model_check(shared, results, settings);
    const std::string model_csv = (fs::path(settings.out) / (program + "_model.csv")).string();
    print_interconnect_predictions(settings, model_csv);

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
      return 1;
    }
    std::printf("every element of every allreduce checked: all correct\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", program.c_str(), e.what());
    return 1;
  }
  return 0;
}

}  // namespace bench
