// Chapter 10's benchmark, 10_fast_kernels: chapter 09's im2col, col2im, BatchNorm sums (the
// forward's sum of z and the backward's two) and BatchNorm apply (the references) against this
// chapter's raw CUDA kernels (kernels.h), at
// ResNet-18's shapes, with each kernel's bytes per second set against the device's copy rate.
//   build-cuda/bin/10_fast_kernels              every kernel and shape at batch 256, on GPU 0
//   build/bin/10_fast_kernels -b 32 -n 5        the cpu build: the references only
// For each kernel and shape: warm up, check every element of the raw result against the
// reference's (outside the timed loop), then time each variant over many calls with the device
// drained before and after (common/benchmark.h's measure, as chapters 03 and 04 measure
// allreduces). Writes <out>/10_fast_kernels.csv and .md; ends with a result: line.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "common/backend.h"  // kBackendName, kCudaBackend
#include "common/benchmark.h"  // measure: warm up, check, time (the harness chapters 03 and 04 run too)
#include "common/cli.h"      // prepare_app, parse, integer, text, refuse_command_line
#include "common/device.h"   // DeviceSet, Buffer, copy_peer
#include "common/memory.h"   // memory_refusal: refuse a batch that cannot fit, before allocating
#include "common/program.h"  // start_program, run_or_report: line-buffered output, errors as one line
#include "common/random.h"   // Rng: the same inputs on every run
#include "common/report.h"   // prepare_output_folder, write_whole_file, build_commit
#include "common/vector_ops.h"  // fill: the raw kernels' outputs poisoned before their check
#include "kernels.h"         // the raw kernels; chapter 09's layers.h, the references

namespace {

using mgpu::Buffer;
using mgpu::Device;
using mgpu::DeviceSet;
using i64 = std::int64_t;

const char* const kProgram = "10_fast_kernels";
const std::vector<std::string> kKernels = {"im2col", "col2im", "sums", "backward", "apply"};

// ---- The command line
struct Settings {
  int batch = 256;  // ResNet-18's batch (d2l 13.6)
  int warmup = 3;   // untimed calls of each variant first
  int iters = 0;    // timed calls; 0: enough for about 0.25 s by the warm-up's time, at least 3
  std::vector<std::string> kernels = kKernels;
  std::string out = "results";
};

std::string check_kernel_list(const std::string& v, std::vector<std::string>* into) {
  std::vector<std::string> chosen;
  std::stringstream in(v + ",");
  for (std::string word; std::getline(in, word, ',');) {
    if (std::find(kKernels.begin(), kKernels.end(), word) == kKernels.end())
      return "needs a comma-separated list of im2col, col2im, sums, backward, apply; got '" + v + "'";
    if (std::find(chosen.begin(), chosen.end(), word) == chosen.end()) chosen.push_back(word);
  }
  if (into) *into = chosen;
  return "";
}

Settings parse_command_line(int argc, char** argv) {
  Settings s;
  CLI::App app{"chapter 09's layout and BatchNorm kernels against raw CUDA kernels: ms, GB/s, % of the copy rate",
               kProgram};
  mgpu::prepare_app(app);
  // At most 1024: a batch of B images makes stage 1's col 64*9*B*784 floats, which the raw
  // kernels' 32-bit indices allow up to B = 4,755; 1024 is 1.8 GB of col, enough for any GPU here.
  app.add_option("-b,--batch-size", s.batch, "images per batch, 1 to 1024 (ResNet-18's shapes at that batch)")
      ->transform(mgpu::integer(1, 1024))
      ->capture_default_str();
  app.add_option("-w,--warmup", s.warmup, "untimed calls of each variant before timing, 0 to 1000")
      ->transform(mgpu::integer(0, 1000))
      ->capture_default_str();
  app.add_option("-n,--iters", s.iters,
                 "timed calls of each variant, 0 to 100000; 0: enough for ~0.25 s by the warm-up's time, at least 3")
      ->transform(mgpu::integer(0, 100000))
      ->capture_default_str();
  app.add_option_function<std::string>(
         "--kernels", [&s](const std::string& v) { check_kernel_list(v, &s.kernels); },
         "which kernels, comma-separated: im2col, col2im, sums, backward, apply")
      ->type_name("LIST")
      ->check([](const std::string& v) { return check_kernel_list(v, nullptr); })
      ->default_str("im2col,col2im,sums,backward,apply");
  app.add_option("--out", s.out, "where the CSV and the markdown table go")
      ->check(mgpu::text("a directory"))
      ->capture_default_str();
  app.footer(
      "Bytes moved, the model every GB/s here uses: each input read once and each output written once\n"
      "(im2col: x and col; col2im: col and dx; sums: z and the C sums; backward: dy, z and the 2C sums;\n"
      "apply: z, the residual and y).\n"
      "The copy rate: a device-to-device copy of 256 MiB (cuda) or a memcpy (cpu), 2 x 256 MiB moved.\n"
      "The cpu build times chapter 09's kernels only: the raw CUDA kernels need the cuda build on a GPU.");
  const mgpu::Parsed p = mgpu::parse(app, std::vector<std::string>(argv + 1, argv + argc));
  if (p.help) {
    std::printf("%s", app.help().c_str());
    std::exit(0);
  }
  if (!p.error.empty()) mgpu::refuse_command_line(kProgram, p.error);
  if (s.iters == 0 && s.warmup == 0)
    mgpu::refuse_command_line(kProgram, "--iters 0 (the default) chooses the number of timed calls from the warm-up's "
                                        "time: give --warmup 1 or more, or --iters N");
  return s;
}

bool wanted(const Settings& s, const std::string& kernel) {
  return std::find(s.kernels.begin(), s.kernels.end(), kernel) != s.kernels.end();
}

// ---- ResNet-18's shapes (d2l 13.6's net on 28x28 inputs, width 64; chapter 09's resnet.cpp)
struct ConvCase {
  int channels, side;  // the input: channels x side x side, a batch of them
  nn::ConvShape conv;
};
// Every distinct (input, kernel, stride, padding) of the network's 20 convolutions: the stem, then
// per stage the 3x3 stride 1 convolutions, the first block's 3x3 stride 2 and its 1x1 stride 2
// projection (which read the previous stage's output).
std::vector<ConvCase> resnet18_convolutions() {
  return {
      {1, 28, {1, 64, 3, 1, 1}},      {64, 28, {64, 64, 3, 1, 1}},    {64, 28, {64, 128, 3, 2, 1}},
      {64, 28, {64, 128, 1, 2, 0}},   {128, 14, {128, 128, 3, 1, 1}}, {128, 14, {128, 256, 3, 2, 1}},
      {128, 14, {128, 256, 1, 2, 0}}, {256, 7, {256, 256, 3, 1, 1}},  {256, 7, {256, 512, 3, 2, 1}},
      {256, 7, {256, 512, 1, 2, 0}},  {512, 4, {512, 512, 3, 1, 1}},
  };
}
// BatchNorm's inputs, one per stage: C channels of batch * side * side values.
struct BatchNormCase {
  int channels, side;
};
const std::vector<BatchNormCase> kBatchNorms = {{64, 28}, {128, 14}, {256, 7}, {512, 4}};

std::string conv_label(const ConvCase& c) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%dch %dx%d k%d s%d p%d", c.channels, c.side, c.side, c.conv.kernel, c.conv.stride,
                c.conv.padding);
  return buf;
}
std::string bn_label(const BatchNormCase& b) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%dch %dx%d", b.channels, b.side, b.side);
  return buf;
}

// ---- Measuring

// One timed variant of one kernel at one shape.
struct Row {
  std::string kernel, shape, variant;
  double ms = 0, bytes = 0;
  std::string check;  // how the raw result was checked: "bitwise", "1e-6 of sum |z|"; "-" for the reference
  i64 wrong = 0;
};

struct Bench {
  const DeviceSet& devices;
  const Settings& settings;
  double copy_gbs = 0;
  std::vector<Row> rows;
};

// How often common/benchmark.h's measure calls a variant: settings.warmup calls first, then
// settings.iters (or as many as fill ~0.25 s by the warm-up's time, at least 3).
mgpu::Repeats repeats(const Settings& s) {
  mgpu::Repeats r;
  r.warmup = s.warmup;
  r.iters = s.iters;
  r.fill_seconds = 0.25;
  r.min_iters = 3;
  return r;
}

// Milliseconds per call of `call` (queued on the device), between two drains.
double time_ms(const Bench& b, const std::function<void()>& call) {
  return 1e3 * mgpu::measure(b.devices, repeats(b.settings), call).seconds_per_call;
}

std::vector<float> random_floats(std::size_t n, std::uint64_t seed) {
  mgpu::Rng rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(2 * rng.uniform() - 1);
  return v;
}
// The raw kernels' output buffers: in the cpu build nothing writes them, so one float stands in.
std::size_t raw_size(i64 n) { return mgpu::kCudaBackend ? std::size_t(n) : 1; }

Buffer<float> upload(const Device& d, const std::vector<float>& host) {
  Buffer<float> b(d, host.size());
  b.upload(host);
  return b;
}

// Elements of got whose bits differ from want's (a NaN equals a NaN of the same bits).
i64 bitwise_differences(const std::vector<float>& got, const std::vector<float>& want) {
  i64 wrong = 0;
  for (std::size_t i = 0; i < got.size(); ++i) wrong += std::memcmp(&got[i], &want[i], sizeof(float)) != 0;
  return wrong;
}

// The device's copy rate: a copy of 256 MiB within its memory (cudaMemcpyPeerAsync to the same
// GPU, or memcpy on a cpu device), counted as 2 x 256 MiB moved.
double copy_rate_gbs(const Bench& b) {
  const Device& d = b.devices[0];
  const std::size_t n = std::size_t(64) << 20;  // floats: 256 MiB, far beyond any cache
  Buffer<float> src(d, n), dst(d, n);
  src.zero();
  const double ms = time_ms(b, [&] { mgpu::copy_peer(d, dst.data(), d, src.data(), mgpu::Elements{n}); });
  const double gbs = 2.0 * n * sizeof(float) / (ms * 1e-3) / 1e9;
  std::printf("copy rate: %s of 256 MiB: %.3f ms, 2 x 256 MiB moved: %.1f GB/s\n",
              mgpu::kCudaBackend ? "a device-to-device cudaMemcpy" : "a memcpy on the device's worker", ms, gbs);
  return gbs;
}

void print_row(const Bench& b, const Row& r) {
  const double gbs = r.bytes / (r.ms * 1e-3) / 1e9;
  std::printf("%-8s %-24s %-9s %10.3f %10.1f %9.1f %7.1f%%  %-16s %lld\n", r.kernel.c_str(), r.shape.c_str(),
              r.variant.c_str(), r.ms, r.bytes / 1e6, gbs, 100 * gbs / b.copy_gbs, r.check.c_str(),
              static_cast<long long>(r.wrong));
}
void add_row(Bench& b, Row r) {
  print_row(b, r);
  b.rows.push_back(std::move(r));
}

// The reference's row, then (cuda build) the raw kernel's. `reference` and `raw` queue one call
// each; the raw kernel's check (between its warm-up and its timed calls, common/benchmark.h):
// its output (`raw_out`, n floats) filled with 1e30, a value none of these kernels can produce
// from inputs in [-1, 1], the reference and the raw kernel run once, and `wrong` counts the
// elements of its result that fail `check` against the reference's: every element.
void measure(Bench& b, const std::string& kernel, const std::string& shape, double bytes,
             const std::function<void()>& reference, const std::function<void()>& raw, float* raw_out, i64 n,
             const std::function<i64()>& wrong, const std::string& check) {
  add_row(b, {kernel, shape, "reference", time_ms(b, reference), bytes, "-", 0});
  if (!mgpu::kCudaBackend) return;
  const mgpu::Measured m = mgpu::measure(b.devices, repeats(b.settings), raw, [&] {
    mgpu::fill(b.devices[0], raw_out, n, 1.0e30f);  // an element the raw kernel leaves alone shows
    reference();
    raw();
    b.devices.synchronize();
    return wrong();
  });
  add_row(b, {kernel, shape, "raw", 1e3 * m.seconds_per_call, bytes, check, m.wrong});
}

// ---- The kernels, at every shape. (The cpu build times the references only: its raw launchers
// run the per-thread code on the CPU, which checks it there but says nothing about its speed.)

void bench_im2col(Bench& b, const ConvCase& cc) {
  const Device& d = b.devices[0];
  const lenet::ImageShape xs{cc.channels, b.settings.batch, cc.side, cc.side};
  const i64 cols = nn::conv_col_size(xs, cc.conv);
  const Buffer<float> x = upload(d, random_floats(xs.size(), 1));  // [Cin][B][H][W]
  Buffer<float> col_ref(d, cols), col_raw(d, raw_size(cols));              // [Cin*k*k][B*Ho*Wo]
  measure(
      b, "im2col", conv_label(cc), 4.0 * (xs.size() + cols),
      [&] { nn::im2col(d, x.data(), xs, cc.conv, col_ref.data()); },
      [&] { fast::im2col_raw(d, x.data(), xs, cc.conv, col_raw.data()); }, col_raw.data(), cols,
      [&] { return bitwise_differences(col_raw.download(), col_ref.download()); }, "bitwise");
}

void bench_col2im(Bench& b, const ConvCase& cc) {
  const Device& d = b.devices[0];
  const lenet::ImageShape xs{cc.channels, b.settings.batch, cc.side, cc.side};
  const i64 cols = nn::conv_col_size(xs, cc.conv);
  const Buffer<float> col = upload(d, random_floats(cols, 2));  // [Cin*k*k][B*Ho*Wo]
  Buffer<float> dx_ref(d, xs.size()), dx_raw(d, raw_size(xs.size()));// [Cin][B][H][W]
  measure(
      b, "col2im", conv_label(cc), 4.0 * (cols + xs.size()),
      [&] { nn::col2im(d, col.data(), xs, cc.conv, dx_ref.data()); },
      [&] { fast::col2im_raw(d, col.data(), xs, cc.conv, dx_raw.data()); }, dx_raw.data(), xs.size(),
      [&] { return bitwise_differences(dx_raw.download(), dx_ref.download()); }, "bitwise");
}

void bench_sums(Bench& b, const BatchNormCase& bc) {
  const Device& d = b.devices[0];
  const int C = bc.channels;
  const i64 n = i64(b.settings.batch) * bc.side * bc.side;
  const std::vector<float> z_host = random_floats(std::size_t(C) * n, 3);
  const Buffer<float> z = upload(d, z_host);  // [C][n]
  Buffer<float> sums_ref(d, C), sums_raw(d, C);
  nn::ReductionScratch scratch(d, C);
  Buffer<double> partials(d, std::size_t(C) * fast::kMaxSumBlocks);  // [C][blocks]
  const auto wrong = [&] {  // |raw - reference| <= 1e-6 * sum |z| of the channel
    const std::vector<float> got = sums_raw.download(), want = sums_ref.download();
    i64 bad = 0;
    for (int c = 0; c < C; ++c) {
      double scale = 0;
      for (i64 j = 0; j < n; ++j) scale += std::abs(z_host[c * n + j]);
      bad += !(std::abs(double(got[c]) - want[c]) <= 1e-6 * scale);
    }
    return bad;
  };
  measure(
      b, "sums", bn_label(bc), 4.0 * (C * n + C),
      [&] { nn::batch_norm_sums(d, z.data(), C, n, scratch, sums_ref.data()); },
      [&] { fast::batch_norm_sums_raw(d, z.data(), C, n, partials.data(), sums_raw.data()); },
      sums_raw.data(), C, wrong,
      "1e-6 of sum |z|");
}

// BatchNorm's backward sums (sum dy, sum dy * xhat per channel, added into dbeta and dgamma): the
// two-sum kernel of kernels.h (c'), which the forward's square sums share.
void bench_backward_sums(Bench& b, const BatchNormCase& bc) {
  const Device& d = b.devices[0];
  const int C = bc.channels;
  const i64 n = i64(b.settings.batch) * bc.side * bc.side;
  const std::vector<float> dy_host = random_floats(std::size_t(C) * n, 9), z_host = random_floats(std::size_t(C) * n, 10);
  const Buffer<float> dy = upload(d, dy_host), z = upload(d, z_host);  // [C][n] each
  std::vector<float> stats_host = random_floats(2 * C, 11);            // [2][C]: mean, inv_std
  for (int c = 0; c < C; ++c) stats_host[C + c] = 0.5f + std::abs(stats_host[C + c]);
  const Buffer<float> stats = upload(d, stats_host);
  Buffer<float> sums_ref(d, 2 * C), sums_raw(d, 2 * C);  // [2][C]
  // dgamma and dbeta grow with every timed call; the check compares the sums alone.
  Buffer<float> dgamma(d, C), dbeta(d, C);
  nn::ReductionScratch scratch(d, C);
  Buffer<double> partials(d, std::size_t(2) * C * fast::kMaxSumBlocks);  // [2][C][blocks]
  const auto wrong = [&] {  // |raw - reference| <= 1e-6 * (sum |dy|, sum |dy xhat|) of the channel
    const std::vector<float> got = sums_raw.download(), want = sums_ref.download();
    i64 bad = 0;
    for (int c = 0; c < C; ++c) {
      double scale_dy = 0, scale_dy_xhat = 0;
      for (i64 j = 0; j < n; ++j) {
        const float xhat = (z_host[c * n + j] - stats_host[c]) * stats_host[C + c];
        scale_dy += std::abs(dy_host[c * n + j]);
        scale_dy_xhat += std::abs(double(dy_host[c * n + j]) * xhat);
      }
      bad += !(std::abs(double(got[c]) - want[c]) <= 1e-6 * scale_dy);
      bad += !(std::abs(double(got[C + c]) - want[C + c]) <= 1e-6 * scale_dy_xhat);
    }
    return bad;
  };
  measure(
      b, "backward", bn_label(bc), 4.0 * (2.0 * C * n + 6 * C),
      [&] {
        nn::batch_norm_backward_sums(d, dy.data(), z.data(), C, n, stats.data(), scratch, sums_ref.data(),
                                     dgamma.data(), dbeta.data());
      },
      [&] {
        fast::batch_norm_backward_sums_raw(d, dy.data(), z.data(), C, n, stats.data(), partials.data(),
                                               sums_raw.data(), dgamma.data(), dbeta.data());
      },
      sums_raw.data(), 2 * C, wrong, "1e-6 of sum |term|");
}

void bench_apply(Bench& b, const BatchNormCase& bc) {
  const Device& d = b.devices[0];
  const int C = bc.channels;
  const i64 n = i64(b.settings.batch) * bc.side * bc.side;
  const Buffer<float> z = upload(d, random_floats(std::size_t(C) * n, 4));         // [C][n]
  const Buffer<float> residual = upload(d, random_floats(std::size_t(C) * n, 5));  // [C][n]
  std::vector<float> stats_host = random_floats(2 * C, 6);                        // [2][C]: mean, inv_std
  for (int c = 0; c < C; ++c) stats_host[C + c] = 0.5f + std::abs(stats_host[C + c]);
  const Buffer<float> stats = upload(d, stats_host);
  const Buffer<float> gamma = upload(d, random_floats(C, 7)), beta = upload(d, random_floats(C, 8));
  Buffer<float> y_ref(d, std::size_t(C) * n), y_raw(d, raw_size(C * n));  // [C][n]
  // The residual block's second BatchNorm: + the shortcut, then ReLU: all three fused.
  measure(
      b, "apply", bn_label(bc) + " +res ReLU", 4.0 * (3.0 * C * n + 4 * C),
      [&] {
        nn::batch_norm_apply(d, z.data(), C, n, stats.data(), gamma.data(), beta.data(), residual.data(),
                             lenet::Activation::Relu, y_ref.data());
      },
      [&] {
        fast::batch_norm_apply_raw(d, z.data(), C, n, stats.data(), gamma.data(), beta.data(), residual.data(),
                                       lenet::Activation::Relu, y_raw.data());
      },
      y_raw.data(), C * n, [&] { return bitwise_differences(y_raw.download(), y_ref.download()); }, "bitwise");
}

// ---- What the run leaves: a CSV and a markdown table under --out
void write_tables(const Bench& b, const std::string& csv_path, const std::string& md_path) {
  std::ostringstream csv, md;
  csv << "kernel,shape,variant,batch,ms,bytes,gb_per_s,percent_of_copy,check,wrong\n";
  md << "# " << kProgram << ": " << mgpu::kBackendName << " build, commit " << mgpu::build_commit() << ", batch "
     << b.settings.batch << "\n\nCopy rate: " << b.copy_gbs
     << " GB/s. Bytes moved: each input read once, each output written once.\n\n"
     << "| kernel | shape | variant | ms | MB moved | GB/s | % of copy | check | wrong |\n"
     << "|---|---|---|---|---|---|---|---|---|\n";
  char line[512];
  for (const Row& r : b.rows) {
    const double gbs = r.bytes / (r.ms * 1e-3) / 1e9;
    std::snprintf(line, sizeof line, "%s,\"%s\",%s,%d,%.4f,%.0f,%.2f,%.2f,%s,%lld\n", r.kernel.c_str(),
                  r.shape.c_str(), r.variant.c_str(), b.settings.batch, r.ms, r.bytes, gbs, 100 * gbs / b.copy_gbs,
                  r.check.c_str(), static_cast<long long>(r.wrong));
    csv << line;
    std::snprintf(line, sizeof line, "| %s | %s | %s | %.3f | %.1f | %.1f | %.1f%% | %s | %lld |\n", r.kernel.c_str(),
                  r.shape.c_str(), r.variant.c_str(), r.ms, r.bytes / 1e6, gbs, 100 * gbs / b.copy_gbs,
                  r.check.c_str(), static_cast<long long>(r.wrong));
    md << line;
  }
  mgpu::write_whole_file(csv_path, csv.str());
  mgpu::write_whole_file(md_path, md.str());
}

// The most memory one shape holds at once (stage 1's im2col: x and two cols, the reference's and
// the raw kernel's), so that a batch that cannot fit is refused before anything is allocated.
std::size_t bytes_needed(const Settings& s) {
  std::size_t most = std::size_t(2) * (std::size_t(64) << 20) * sizeof(float);  // the copy's two buffers
  for (const ConvCase& cc : resnet18_convolutions()) {
    const lenet::ImageShape xs{cc.channels, s.batch, cc.side, cc.side};
    most = std::max(most, sizeof(float) * std::size_t(2 * nn::conv_col_size(xs, cc.conv) + 2 * xs.size()));
  }
  return most;
}

// Every kernel the command line asks for, at each of its shapes.
void bench_every_kernel(Bench& b) {
  const Settings& settings = b.settings;
  for (const ConvCase& cc : resnet18_convolutions())
    if (wanted(settings, "im2col")) bench_im2col(b, cc);
  for (const ConvCase& cc : resnet18_convolutions())
    if (wanted(settings, "col2im") && cc.channels > 1) bench_col2im(b, cc);  // the stem has no dx (its input is the image)
  for (const BatchNormCase& bc : kBatchNorms)
    if (wanted(settings, "sums")) bench_sums(b, bc);
  for (const BatchNormCase& bc : kBatchNorms)
    if (wanted(settings, "backward")) bench_backward_sums(b, bc);
  for (const BatchNormCase& bc : kBatchNorms)
    if (wanted(settings, "apply")) bench_apply(b, bc);
}

// The result line, and the exit status: 1 when an element anywhere was wrong.
int print_result(const Bench& b) {
  double reference_ms = 0, raw_ms = 0;
  i64 wrong = 0;
  for (const Row& r : b.rows) {
    (r.variant == "raw" ? raw_ms : reference_ms) += r.ms;
    wrong += r.wrong;
  }
  char raw_part[96] = "raw_ms=none";  // the cpu build times no raw kernels
  if (mgpu::kCudaBackend) std::snprintf(raw_part, sizeof raw_part, "raw_ms=%.3f speedup=%.2f", raw_ms, reference_ms / raw_ms);
  std::printf("result: chapter=%s backend=%s batch=%d copy_gb_s=%.1f rows=%zu reference_ms=%.3f %s wrong=%lld\n",
              kProgram, mgpu::kBackendName, b.settings.batch, b.copy_gbs, b.rows.size(), reference_ms, raw_part,
              static_cast<long long>(wrong));
  if (!wrong) return 0;
  std::fprintf(stderr, "%s: %lld wrong elements in all (see the wrong column)\n", kProgram,
               static_cast<long long>(wrong));
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  mgpu::start_program(argv);  // first: line-buffered output; it may start the program again (see its header)
  const Settings settings = parse_command_line(argc, argv);
  return mgpu::run_or_report(kProgram, [&] {
    namespace fs = std::filesystem;
    mgpu::prepare_output_folder(settings.out);
    const DeviceSet devices(1);
    std::printf("backend %s\n%s", mgpu::kBackendName, devices.mapping().c_str());
    if (const std::string why = mgpu::memory_refusal(devices, bytes_needed(settings),
                                                     "the benchmark at --batch-size " + std::to_string(settings.batch),
                                                     "a smaller --batch-size");
        !why.empty())
      mgpu::refuse_command_line(kProgram, why);
    Bench b{devices, settings, 0.0, {}};
    b.copy_gbs = copy_rate_gbs(b);
    if (!mgpu::kCudaBackend)
      std::printf("the raw CUDA kernels need the cuda build on a GPU: this cpu build times chapter 09's kernels only\n");
    std::printf("\nbatch %d; bytes moved: each input read once, each output written once; %% of copy: GB/s against "
                "the copy rate above\n%-8s %-24s %-9s %10s %10s %9s %8s  %-16s %s\n",
                settings.batch, "kernel", "shape", "variant", "ms", "MB moved", "GB/s", "% copy", "check", "wrong");
    bench_every_kernel(b);
    const std::string csv = (fs::path(settings.out) / (std::string(kProgram) + ".csv")).string();
    const std::string md = (fs::path(settings.out) / (std::string(kProgram) + ".md")).string();
    write_tables(b, csv, md);
    std::printf("\nwrote %s\nwrote %s\n", csv.c_str(), md.c_str());
    return print_result(b);
  });
}
