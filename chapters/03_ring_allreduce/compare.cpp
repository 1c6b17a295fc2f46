#include "compare.h"

#include <cstdio>
#include <filesystem>

#include "common/backend.h"
#include "common/report.h"

namespace ring {

void train_each(const mgpu::DeviceSet& devices, const mgpu::FashionMnist& data, const mgpu::Options& o,
                const mgpu::ChapterInfo& chapter, const std::vector<const GradientSum*>& ways) {
  const int k = devices.size();
  // Every way's files claimed before the first trains: a name another run holds stops the
  // program now, not after an hour.
  const mgpu::RunSettings settings = mgpu::shared_settings(o, chapter);
  const std::string name = mgpu::run_name(chapter.name, o.run_name, settings);
  std::vector<mgpu::TrainingLog> logs;
  for (const GradientSum* way : ways)
    logs.emplace_back(chapter.name, name + "_" + way->run, o, settings, k, data.train.count);
  std::vector<std::pair<std::string, std::string>> runs;  // (label, csv) for the plot
  std::string title = name + ": " + std::to_string(k) + " device(s) (" + mgpu::kBackendName + "),";
  for (std::size_t i = 0; i < ways.size(); ++i) {
    const GradientSum& way = *ways[i];
    std::printf("\n== training on %d device(s) with %s\n", k, way.label.c_str());
    dp::train(devices, data, o, *way.collective, logs[i], way.layout);
    logs[i].finish();
    runs.emplace_back(way.label, logs[i].csv_path());
    title += (runs.size() > 1 ? " vs " : " ") + way.run;
  }
  const std::string png = (std::filesystem::path(o.out) / (name + ".png")).string();
  if (mgpu::plot_runs(png, title, runs)) std::printf("wrote %s\n", png.c_str());
}

void print_step_times(const mgpu::DeviceSet& devices, const mgpu::FashionMnist& data, const mgpu::Options& o,
                      const std::vector<GradientSum>& ways) {
  // Measured apart from training: the synchronization that measuring needs would slow it down.
  std::printf("\nper step on %d device(s) (mean of 20 steps, devices synchronized between phases):\n",
              devices.size());
  std::printf("  %-40s %12s %14s\n", "allreduce", "compute ms", "allreduce ms");
  for (const GradientSum& way : ways) {
    const dp::StepTimes t = dp::profile_steps(devices, data, o, *way.collective, 20, way.layout);
    std::printf("  %-40s %12.2f %14.3f\n", way.label.c_str(), 1e3 * t.compute / t.steps, 1e3 * t.allreduce / t.steps);
  }
}

}  // namespace ring
