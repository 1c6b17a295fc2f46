#include "allreduce_bench.h"

#include <algorithm>
#include <cstdio>
#include <memory>
#include <sstream>

#include "backend.h"
#include "benchmark.h"  // measure: warm up, check, time
#include "check.h"
#include "report.h"

namespace bench {

float input(int device, std::size_t j) {
  // Integers below 1024: any sum of up to 16,384 of them is exact in float, in any order.
  return static_cast<float>((j * 7 + std::size_t(device) * 13) % 1024);
}

namespace {

using Buffers = std::vector<mgpu::Buffer<float>>;

std::vector<float*> pointers(Buffers& buffers) {
  std::vector<float*> p;
  for (auto& b : buffers) p.push_back(b.data());
  return p;
}

void fill_inputs(Buffers& buffers, std::size_t n) {
  std::vector<float> host(n);
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    for (std::size_t j = 0; j < n; ++j) host[j] = input(static_cast<int>(i), j);
    buffers[i].upload(host);
  }
}

// Elements, over all devices, that are not exactly the sum of the inputs.
std::size_t count_wrong(const Buffers& buffers, std::size_t n) {
  std::vector<float> expected(n, 0.0f);
  for (std::size_t i = 0; i < buffers.size(); ++i)
    for (std::size_t j = 0; j < n; ++j) expected[j] += input(static_cast<int>(i), j);
  std::size_t wrong = 0;
  std::vector<float> got(n);
  for (const auto& b : buffers) {
    mgpu::copy_bytes_to_host(b.device(), got.data(), b.data(), n * sizeof(float));
    for (std::size_t j = 0; j < n; ++j) wrong += got[j] != expected[j];
  }
  return wrong;
}

Measurement measure(const DeviceSet& devices, mgpu::Collective& collective, Buffers& buffers, std::size_t n,
                    const Settings& settings) {
  const std::vector<float*> data = pointers(buffers);
  const Elements count{n};
  mgpu::Repeats repeats;
  repeats.warmup = settings.warmup;
  repeats.iters = settings.iters;  // 0: enough for ~0.2 s, 10 to 10,000
  fill_inputs(buffers, n);  // the warm-up's inputs (the values grow by a factor k per run: no timing changes)
  const mgpu::Measured timed = mgpu::measure(
      devices, repeats, [&] { collective.run(data, count); },
      [&] {  // from fresh inputs, one allreduce, every element of every device
        fill_inputs(buffers, n);
        collective.run(data, count);
        devices.synchronize();
        return static_cast<std::int64_t>(count_wrong(buffers, n));
      });

  const int k = devices.size();
  Measurement m;
  m.algorithm = collective.name();
  m.devices = k;
  m.count = n;
  m.bytes = n * sizeof(float);
  m.wrong = static_cast<std::size_t>(timed.wrong);
  m.time_us = timed.seconds_per_call * 1e6;
  m.algbw = m.bytes / timed.seconds_per_call / 1e9;
  m.busbw = m.algbw * 2.0 * (k - 1) / k;
  return m;
}

}  // namespace

std::vector<Measurement> run_benchmark(const DeviceSet& devices, const Settings& settings,
                                       const Contenders& contenders) {
  const std::size_t max_n = std::max<std::size_t>(1, settings.max_bytes / sizeof(float));
  Buffers buffers;
  for (int i = 0; i < devices.size(); ++i) buffers.emplace_back(devices[i], max_n);
  mgpu::CollectiveMenu menu;
  contenders.add_collectives(menu, devices);
  std::vector<std::unique_ptr<mgpu::Collective>> collectives;
  for (const std::string& name : contenders.names)
    if (menu.has(name)) collectives.push_back(menu.make(name, max_n));

  std::printf("\n# allreduce, float32, sum, in place, on %d devices (%s)\n#%27s", devices.size(),
              mgpu::kBackendName, "");
  for (const auto& c : collectives) std::printf("  %-41s", c->name().c_str());
  std::printf("\n#%11s %14s", "size(B)", "count");
  for (std::size_t i = 0; i < collectives.size(); ++i)
    std::printf("  %10s %9s %9s %9s", "time(us)", "algbw", "busbw", "#wrong");
  std::printf("\n");

  std::vector<Measurement> results;
  for (std::size_t bytes : message_sizes(settings)) {
    const std::size_t n = bytes / sizeof(float);
    std::printf(" %11zu %14zu", n * sizeof(float), n);
    for (const auto& c : collectives) {
      const Measurement m = measure(devices, *c, buffers, n, settings);
      std::printf("  %10.1f %9.3f %9.3f %9zu", m.time_us, m.algbw, m.busbw, m.wrong);
      std::fflush(stdout);
      results.push_back(m);
    }
    std::printf("\n");
  }
  return results;
}

std::vector<std::pair<std::string, int>> runs_of(const std::vector<Measurement>& results) {
  std::vector<std::pair<std::string, int>> runs;
  for (const Measurement& m : results)
    if (std::find(runs.begin(), runs.end(), std::make_pair(m.algorithm, m.devices)) == runs.end())
      runs.emplace_back(m.algorithm, m.devices);
  return runs;
}

void write_csv(const std::string& path, const std::vector<Measurement>& results) {
  std::ostringstream csv;
  csv << "algorithm,devices,bytes,count,time_us,algbw_GBps,busbw_GBps,wrong\n";
  // Line by line (each line's rows together, sizes ascending), so the plot's lines are unbroken.
  for (const auto& [algorithm, devices] : runs_of(results))
    for (const Measurement& m : results)
      if (m.algorithm == algorithm && m.devices == devices)
        csv << m.algorithm << ',' << m.devices << ',' << m.bytes << ',' << m.count << ',' << m.time_us << ','
            << m.algbw << ',' << m.busbw << ',' << m.wrong << '\n';
  mgpu::write_whole_file(path, csv.str());
}

bool plot(const std::string& png_path, const std::string& csv_path, const std::string& title,
          const std::vector<Measurement>& results) {
  const std::vector<std::pair<std::string, int>> lines = runs_of(results);  // one line each

  std::ostringstream gp;
  gp << "set multiplot layout 1,2 title " << mgpu::gnuplot_text(title) << "\n"
     << "set grid\nset key top left\nset logscale x 2\nset format x '%.0b%B'\nset xlabel 'message size (bytes)'\n";
  auto plot_column = [&](const char* ylabel, int column) {
    gp << "set ylabel '" << ylabel << "'\nplot ";
    for (std::size_t i = 0; i < lines.size(); ++i)
      // Only the rows of this line: other rows give gnuplot's "missing" value (1/0).
      gp << (i ? ", " : "") << mgpu::gnuplot_file(csv_path, png_path) << " skip 1 using 3:(strcol(1) eq '"
         << lines[i].first
         << "' && $2 == " << lines[i].second << " ? $" << column << " : 1/0) with linespoints title '"
         << lines[i].first << ", " << lines[i].second << " devices'";
    gp << "\n";
  };
  plot_column("busbw (GB/s)", 7);
  gp << "set logscale y 10\n";
  plot_column("time per allreduce (us)", 5);
  gp << "unset multiplot\n";
  return mgpu::run_gnuplot(png_path, gp.str());
}

}  // namespace bench
