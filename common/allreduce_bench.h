// An allreduce benchmark in the style of NVIDIA's nccl-tests, taught in chapter 03 and run by
// chapters 03 (03_allreduce_bench: chapter 02's allreduce against the ring) and 04
// (04_allreduce_bench: NCCL beside them): for each message size, each collective is warmed up,
// checked element by element, then timed (common/benchmark.h's measure); the table gives
//
//   time    per allreduce, devices synchronized before and after the timed loop
//   algbw   bytes / time: how fast the user's buffer was reduced
//   busbw   algbw * 2(k-1)/k: the bandwidth each device's link had to sustain for an optimal
//           (ring-like) algorithm. It does not depend on k, so it can be compared across k
//           and against a link's specified bandwidth.
//   #wrong  elements, over all k devices, that differ from the exact sum
//
// The check is outside the timed loop: each device i starts from input(i, j), small integers
// whose sums are exact in float in any order, so a right answer is exactly right.
// After the table, the alpha-beta cost model (cost_model.h) is checked against it and priced on
// published interconnects.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "collective.h"
#include "device.h"

namespace bench {

using mgpu::DeviceSet;
using mgpu::Elements;

// What a benchmark program compares. The algorithms under test are collectives
// (common/collective.h): the harness owns parsing, timing and checking, each collective only
// run()s, as in nccl-tests. For each device count the program's add_collectives puts them on a
// menu for those devices; the harness makes and measures those of `names` on it, in that order
// (one the menu lacks at some count, NCCL on devices sharing a GPU, is left out there). Each
// one's name() heads its column set and fills the CSV's `algorithm`; the cost model knows
// "naive" and "ring". bucket_bytes (bucket_label: "LeNet's gradients") is a size the cost model
// prices beside 256 MiB.
struct Contenders {
  std::function<void(mgpu::CollectiveMenu& menu, const DeviceSet& devices)> add_collectives;
  std::vector<std::string> names;
  std::string bucket_label;
  double bucket_bytes = 0;
};

// The command line, as nccl-tests' (-g -b -e -f -i -w -n; allreduce_bench_program.cpp says how -g maps).
struct Settings {
  std::vector<int> device_counts = {2, 4, 8};                      // -g: one run per count
  std::size_t min_bytes = 4, max_bytes = std::size_t(256) << 20;  // -b, -e
  std::size_t step_factor = 2;  // -f: each size is the one before times this...
  std::size_t step_bytes = 0;   // -i: ...or, when > 0, plus this many bytes
  int warmup = 5;         // -w: untimed runs before the check
  int iters = 0;          // -n: timed runs; 0: as many as fill ~0.2 s (at least 10)
  double alpha_us = 5;    // the cost model's alpha for the published interconnects
  std::string out = "results";
};

struct ParsedSettings {
  Settings settings;
  bool help = false;
  std::string error;  // non-empty: why the command line was refused
};
// The sizes measured: from min_bytes to max_bytes, by step_factor or step_bytes.
std::vector<std::size_t> message_sizes(const Settings& settings);

// The command line's settings, starting from `defaults`, read with CLI11 as every program's
// (common/cli.h), with the benchmark's own flags. Pure, so the tests can call it.
ParsedSettings parse_settings(const std::vector<std::string>& args, const Settings& defaults = Settings{});
std::string usage(const std::string& program, const Settings& defaults = Settings{});
// For main(): parse, or mgpu::refuse_command_line (exit 2); --help, -h print the usage, exit 0.
Settings parse_command_line(int argc, char** argv, const std::string& program, const Settings& defaults = Settings{});

// The memory a run on `devices` devices allocates at settings.max_bytes, counted before anything
// is allocated: gpu_bytes[g] on GPU g (logical device i is on GPU i % gpus), and host_bytes. With
// gpus = 0 (the cpu build) the devices are host memory, and gpu_bytes is empty. NCCL (chapter 04)
// reduces in place; its own buffers, some MiB per GPU, are not counted.
struct MemoryNeed {
  std::vector<std::size_t> gpu_bytes;
  std::size_t host_bytes = 0;
};
MemoryNeed memory_needed(const Settings& settings, int devices, int gpus);

// The whole benchmark program: parse the command line (exit 2 on a bad one, or on one that
// needs more memory than this machine has), measure every device count, check the cost model,
// write <out>/<program>.csv, _model.csv and .png.
int main_program(int argc, char** argv, const std::string& program, const Contenders& contenders,
                 const Settings& defaults = Settings{});

struct Measurement {
  std::string algorithm;
  int devices = 0;
  std::size_t bytes = 0, count = 0;
  double time_us = 0, algbw = 0, busbw = 0;  // GB/s = 1e9 bytes/s
  std::size_t wrong = 0;
};

// input(i, j): device i's j-th element before the allreduce.
float input(int device, std::size_t j);

// Measures every collective at every size on `devices`, printing the table as it goes.
std::vector<Measurement> run_benchmark(const DeviceSet& devices, const Settings& settings,
                                       const Contenders& contenders);

// Each (algorithm, device count) measured, in the order first measured: the plot's lines, the
// CSV's groups of rows, the nccl-tests footer's runs.
std::vector<std::pair<std::string, int>> runs_of(const std::vector<Measurement>& results);

// The results as CSV (one row per algorithm, device count and size) and a plot of busbw and
// time against size, one line per algorithm and device count.
void write_csv(const std::string& path, const std::vector<Measurement>& results);
bool plot(const std::string& png_path, const std::string& csv_path, const std::string& title,
          const std::vector<Measurement>& results);

}  // namespace bench
