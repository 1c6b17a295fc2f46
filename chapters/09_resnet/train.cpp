#include "train.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <sstream>

#include "../02_data_parallel/data_parallel.h"  // dp::split_batch; dp::add_collectives: --allreduce naive
#include "../03_ring_allreduce/ring.h"            // ring::add_collectives: --allreduce ring
#include "common/batches.h"
#include "common/memory.h"  // memory_refusal
#include "common/report.h"  // write_whole_file
#include "common/timer.h"  // steady_seconds: profile_step
#include "common/train_loop.h"
#include "common/vector_ops.h"
#if MGPU_HAVE_NCCL
#include "../04_nccl/nccl_allreduce.h"  // nccl::add_collectives: --allreduce nccl
#endif

namespace resnet {
namespace {

using i64 = std::int64_t;

// The largest buffer a step hands the collective: the gradient bucket, or a BatchNorm's 2C sums.
std::size_t largest_sum(const Network& net) {
  return std::max<std::size_t>(net.param_floats, std::size_t(2) * net.max_channels);
}

// The collective, made once for the run from chapters 02-04's, by the name --allreduce gives.
std::unique_ptr<mgpu::Collective> make_collective(const mgpu::DeviceSet& devices, const ResnetOptions& ro,
                                                  const Network& net) {
  mgpu::CollectiveMenu menu;
  dp::add_collectives(menu, devices);
  ring::add_collectives(menu, devices);
#if MGPU_HAVE_NCCL
  nccl::add_collectives(menu, devices);
#endif
  return menu.make(name_of(ro.collective), largest_sum(net));
}

// The chosen table of layer kernels made the library's, once it is known to run on every device
// (chapter 10's tensor table needs bf16 tensor cores: mgpu::Error naming the GPU otherwise).
void use_kernels(const mgpu::DeviceSet& devices, const ResnetOptions& ro) {
  for (int i = 0; i < devices.size(); ++i)
    if (const std::string why = ro.kernels->unavailable_on(devices[i]); !why.empty())
      throw mgpu::Error(std::string("--kernels ") + ro.kernels->name() + ": " + why);
  nn::use_layer_kernels(*ro.kernels);
}

// Refuses, with the figures, a run the devices' memory cannot hold, before anything is allocated
// (at --width 512 the allocations alone took most of a minute before they failed, at 1024 the
// host's copy of the parameters, 11 GB, ended in a bare std::bad_alloc). Per device: a replica
// for `capacity` images, the collective's staging (at most the parameters), the training and
// test sets, and the epoch's order.
void check_memory(const mgpu::DeviceSet& devices, const Network& net, int capacity, const mgpu::FashionMnist& data) {
  const std::size_t images = std::size_t(data.train.count) + std::size_t(data.test.count);
  const std::size_t per_device = std::size_t(Replica::bytes_needed(devices[0], net, capacity)) +
                                 std::size_t(net.param_floats) * sizeof(float) +
                                 images * (28 * 28 * sizeof(float) + sizeof(std::int32_t)) +
                                 std::size_t(data.train.count) * sizeof(std::int32_t);
  const std::string why = mgpu::memory_refusal(
      devices, per_device,
      "ResNet-18 at --width " + std::to_string(net.width) + " with up to " + std::to_string(capacity) + " images a device",
      "lower --width or --batch-size");
  if (!why.empty()) throw mgpu::Error(why);
}

// Every replica starts from the same parameters and running statistics.
std::vector<Replica> make_replicas(const mgpu::DeviceSet& devices, const Network& net, int capacity,
                                   const std::vector<float>& params, const std::vector<float>& state) {
  std::vector<Replica> replicas;
  replicas.reserve(devices.size());
  for (int i = 0; i < devices.size(); ++i) {
    replicas.emplace_back(devices[i], net, capacity);
    replicas.back().params.upload(params);
    replicas.back().state.upload(state);
  }
  return replicas;
}

// d2l's split_batch, chapter 02's: the n examples order[first .. first + n) of the epoch, shard i
// gathered by device i from its own copy of the data; then each replica's next pass reads it.
void split_batch(std::vector<mgpu::DeviceData>& data, int first, int n, std::vector<Replica>& replicas) {
  std::vector<const Device*> devices;
  std::vector<mgpu::Batch*> shards;
  for (Replica& r : replicas) devices.push_back(r.device), shards.push_back(&r.shard);
  const std::vector<int> sizes = dp::split_batch(data, first, n, devices, shards);
  for (std::size_t i = 0; i < replicas.size(); ++i)
    replicas[i].x = replicas[i].shard.x.data(), replicas[i].labels = replicas[i].shard.y.data(),
    replicas[i].n = sizes[i];
}

// A step once its shards are in place: forward and backward on every device, the gradients
// summed, the same SGD step everywhere (lr / n: the loss is the batch's mean, as d2l's
// CrossEntropyLoss). Only queued work, the same every time for one n and lr: what --graph records.
void compute_and_update(Devices& s, int n, float lr) {
  for (Replica& r : s.replicas) r.grads.zero();
  forward(s, /*training=*/true);
  loss(s, /*with_gradient=*/true);
  backward(s);
  std::vector<float*> grads;
  for (Replica& r : s.replicas) grads.push_back(r.grads.data());
  s.allreduce.run(grads, mgpu::Elements{std::size_t(s.net.param_floats)});
  for (Replica& r : s.replicas)
    mgpu::sgd_update(*r.device, r.params.data(), r.grads.data(), s.net.param_floats, lr / n);
}

// d2l's train_batch: the batch split over the devices, then the step.
void train_batch(Devices& s, std::vector<mgpu::DeviceData>& data, int first, int n, float lr) {
  split_batch(data, first, n, s.replicas);
  compute_and_update(s, n, lr);
}

// Device 0's running statistics copied to every device: what evaluation normalizes with when
// each device kept its own (BatchNormMode::PerDevice), as nn.DataParallel keeps device 0's.
void share_running_statistics(std::vector<Replica>& replicas) {
  Replica& first = replicas[0];
  mgpu::Event ready(*first.device);
  ready.record(*first.device);
  for (std::size_t i = 1; i < replicas.size(); ++i) {
    Replica& r = replicas[i];
    ready.make_wait(*r.device);
    mgpu::copy_peer(*r.device, r.state.data(), *first.device, first.state.data(), mgpu::Elements{r.state.size()});
  }
  for (Replica& r : replicas) mgpu::synchronize(*r.device);  // `ready` dies here
}

// Test accuracy in evaluation mode, the test set cut into chunks of each device's capacity,
// chunk c on device c % k (all_devices; else every chunk on device 0, as d2l evaluates).
double evaluate_accuracy(Devices& s, std::vector<mgpu::DeviceImages>& test, bool all_devices) {
  share_running_statistics(s.replicas);
  for (Replica& r : s.replicas) r.metrics.reset(), r.n = 0;
  const int k = all_devices ? static_cast<int>(s.replicas.size()) : 1;
  const int capacity = s.replicas[0].capacity, count = test[0].count;
  for (int start = 0; start < count; start += k * capacity) {
    for (int i = 0; i < k; ++i) {
      Replica& r = s.replicas[i];
      const int first = start + i * capacity;
      r.n = first < count ? std::min(capacity, count - first) : 0;
      if (r.n == 0) continue;  // the test set has run out: this device sits the pass out
      r.x = test[i].pixels.data() + i64(first) * 28 * 28;
      r.labels = test[i].labels.data() + first;
    }
    forward(s, /*training=*/false);
    loss(s, /*with_gradient=*/false);
  }
  double hits = 0;
  for (Replica& r : s.replicas) hits += r.metrics.read()[1];
  return hits / count;
}

void write_floats(const std::filesystem::path& file, const std::vector<float>& v) {
  mgpu::write_whole_file(file.string(), std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float)));
}

// One table's tensors out of a flat download, one file each, in PyTorch's layout: the fc weight
// is stored [in][out] here and [out][in] in nn.Linear. `scale` multiplies every value.
void write_tensors(const Network& net, const std::vector<TensorInfo>& table, const std::vector<float>& flat,
                   const std::filesystem::path& dir, float scale = 1.0f) {
  std::filesystem::create_directories(dir);
  for (std::size_t t = 0; t < table.size(); ++t) {
    const TensorInfo& info = table[t];
    std::vector<float> v(flat.begin() + info.offset, flat.begin() + info.offset + info.count);
    if (&table == &net.params && int(t) == net.fc_weight) {
      const int in = info.shape[0], out = info.shape[1];
      std::vector<float> transposed(v.size());
      for (int i = 0; i < in; ++i)
        for (int o = 0; o < out; ++o) transposed[std::size_t(o) * in + i] = v[std::size_t(i) * out + o];
      v = transposed;
    }
    for (float& x : v) x *= scale;
    write_floats(dir / (info.name + ".f32"), v);
  }
}

}  // namespace

std::string name_of(CollectiveKind c) {
  switch (c) {
    case CollectiveKind::Ring: return "ring";
    case CollectiveKind::Naive: return "naive";
    case CollectiveKind::Nccl: return "nccl";
  }
  return "?";
}

std::string name_of(BatchNormMode m) { return m == BatchNormMode::Sync ? "sync" : "device"; }

void add_resnet_flags(CLI::App& app, ResnetOptions& ro) {
  app.add_option("--width", ro.width,
                 "channels of the first stage (d2l's: 64); the stages have N, 2N, 4N, 8N. Work per image grows "
                 "as N^2: --width 16 is 1/16 of it")
      ->transform(mgpu::integer(1, 1024))
      ->capture_default_str();
  app.add_option_function<std::string>(
         "--bn", [&ro](const std::string& v) { ro.bn = v == "sync" ? BatchNormMode::Sync : BatchNormMode::PerDevice; },
         "BatchNorm's batch statistics per device (d2l's DataParallel) or summed over all devices (SyncBN)")
      ->check(CLI::IsMember({"device", "sync"}))
      ->default_str("device");
  app.add_option_function<std::string>(
         "--allreduce",
         [&ro](const std::string& v) {
           ro.collective = v == "naive" ? CollectiveKind::Naive : v == "nccl" ? CollectiveKind::Nccl : CollectiveKind::Ring;
           ro.collective_given = true;
         },
         "the collective for gradients and SyncBN's sums (default: nccl in a cuda build with NCCL and one GPU "
         "per device, else ring)")
      ->check(CLI::IsMember({"ring", "naive", "nccl"}));
  app.add_option_function<std::string>(
         "--precision", [&ro](const std::string& v) { ro.precision = *mgpu::gemm_precision_named(v); },
         "cuda build: the GEMMs multiply fp32, or let the tensor cores read their inputs as tf32 or bf16 "
         "(chapter 06; fp32 accumulation either way); the cpu build computes in fp32 whatever is chosen")
      ->check(CLI::IsMember({"fp32", "tf32", "bf16"}))
      ->default_str("fp32");
  std::vector<std::string> tables;  // the registered tables' names
  std::string described;
  for (const nn::LayerKernels* k : nn::registered_layer_kernels()) {
    tables.push_back(k->name());
    described += std::string(described.empty() ? "" : ", ") + k->name();
  }
  app.add_option_function<std::string>(
         "--kernels", [&ro](const std::string& v) { ro.kernels = nn::find_layer_kernels(v); },
         "the table of layer kernels the convolutions and BatchNorm run: " + described +
             " (reference: this chapter's; the others: chapter 10's). Default: this build's fastest")
      ->check(CLI::IsMember(tables))
      ->default_str(nn::default_layer_kernels().name());
  mgpu::add_on_off(app, "--profile", ro.profile,
                   "before training, time one step kernel by kernel on device 0 and print the table");
  mgpu::add_on_off(app, "--graph", ro.graph,
                   "record one training step and replay it for every full batch (a CUDA graph on a GPU: one "
                   "launch a step; --devices 1 only)");
  app.add_option("--dump-step", ro.dump_step,
                 "run one training step on the first --batch-size images, write its tensors to DIR for "
                 "crosscheck.py, and stop")
      ->check(mgpu::text("a directory"));
}

std::string resolve_collective(ResnetOptions& ro, int devices) {
#if MGPU_HAVE_NCCL
  // One GPU per device; with one device there is nothing to sum, and the ring's run returns at once.
  const bool nccl_fits = devices > 1 && nccl::usable_devices(devices) == devices;
  const char* why_not = "--allreduce nccl needs one GPU per device (NCCL refuses two ranks on one GPU): use --allreduce ring";
#else
  (void)devices;
  const bool nccl_fits = false;
  const char* why_not = "--allreduce nccl needs the cuda build with NCCL: use --allreduce ring";
#endif
  if (!ro.collective_given) ro.collective = nccl_fits ? CollectiveKind::Nccl : CollectiveKind::Ring;
  if (ro.collective == CollectiveKind::Nccl && !nccl_fits) return why_not;
  return "";
}

std::string check_kernels_precision(const ResnetOptions& ro) {
  const char* needs = ro.kernels->convolution_precision();
  if (!needs || needs == std::string(mgpu::to_string(ro.precision))) return "";
  return std::string("--kernels ") + ro.kernels->name() + " multiplies its convolutions in " + needs + ": add --precision " +
         needs + " (or choose other --kernels)";
}

std::string check_graph(const ResnetOptions& ro, int devices) {
  if (!ro.graph || devices == 1) return "";
  return "--graph on records one device's step: it runs with --devices 1 (got " + std::to_string(devices) + ")";
}

void train(const mgpu::DeviceSet& devices, const mgpu::FashionMnist& data, const mgpu::Options& o,
           const ResnetOptions& ro, mgpu::TrainingLog& log, long* replayed_steps) {
  const int k = devices.size();
  mgpu::check_batches_fit(data.train.count, o.batch_size, k);
  const Network net(ro.width);
  mgpu::set_gemm_precision(devices, ro.precision);
  use_kernels(devices, ro);
  const int capacity = mgpu::shard_sizes(mgpu::largest_batch(o.batch_size, data.train.count), k)[0];  // the largest shard
  check_memory(devices, net, capacity, data);
  std::vector<Replica> replicas = make_replicas(devices, net, capacity, init_params(net, o.seed), init_state(net));
  const std::unique_ptr<mgpu::Collective> collective = make_collective(devices, ro, net);
  Devices s{net, replicas, ro.bn, *collective};

  std::vector<mgpu::DeviceData> train_data = mgpu::put_on_every_device(devices, data.train);  // once per run
  std::vector<mgpu::DeviceImages> test_data;
  for (int i = 0; i < k; ++i) test_data.emplace_back(devices[i], data.test);

  mgpu::EpochLoop loop;  // d2l's train_ch13 (common/train_loop.h): this chapter's parts of it
  loop.start_epoch = [&](int, const std::vector<int>& order) {
    for (Replica& r : replicas) r.metrics.reset();
    for (mgpu::DeviceData& dd : train_data) dd.order.upload(order);
  };
  // --graph on: the step recorded after the first one has run the usual way (that one also pays
  // one-time set-up, which must not be recorded), then replayed for every step of the recorded
  // size and rate; the shards are gathered before each replay (which examples: the one thing
  // that changes). Other steps (a last short batch, warm-up rates) run the usual way.
  std::unique_ptr<mgpu::CapturedWork> recorded;
  long steps_done = 0, replays = 0;
  loop.step = [&](const mgpu::BatchOf& b) {
    const bool replay = ro.graph && b.size == o.batch_size && b.lr == o.lr && steps_done > 0;
    ++steps_done;
    if (!replay) return train_batch(s, train_data, b.first, b.size, b.lr);
    split_batch(train_data, b.first, b.size, replicas);
    if (!recorded)
      recorded = std::make_unique<mgpu::CapturedWork>(*replicas[0].device,
                                                      [&s, n = b.size, lr = b.lr] { compute_and_update(s, n, lr); });
    recorded->replay();
    ++replays;
  };
  loop.synchronize = [&] { devices.synchronize(); };
  loop.devices = devices.all();  // the progress line counts their finished batches
  loop.train_metrics = [&] {
    mgpu::LossAndHits sum;
    for (Replica& r : replicas) {
      const auto [l, h] = r.metrics.read();
      sum.loss_sum += l, sum.hits += h;
    }
    return sum;
  };
  loop.test_accuracy = [&] { return evaluate_accuracy(s, test_data, o.eval_all_devices); };
  // d2l's recipe swings: say so once, the first time an epoch falls well below the best so far.
  double best_test_acc = 0;
  bool swing_explained = false;
  loop.epoch_ended = [&](const mgpu::EpochRecord& record) {
    best_test_acc = std::max(best_test_acc, record.test_acc);
    if (!swing_explained && record.test_acc < best_test_acc - 0.1) {
      swing_explained = true;
      std::printf("  (the test accuracy fell from %.4f: with d2l's recipe (lr 0.1, no decay) it swings from epoch\n"
                  "  to epoch, in PyTorch too, while BatchNorm's running statistics lag behind the weights; judge\n"
                  "  a run by its training loss and the range of its last epochs: chapters/09_resnet/README.md,\n"
                  "  \"The test accuracy swings\")\n",
                  best_test_acc);
    }
  };
  mgpu::train_epochs(o, data.train.count, o.batch_size, loop, &log);
  if (replayed_steps) *replayed_steps = replays;
}

StepProfile profile_step(const mgpu::DeviceSet& devices, const mgpu::FashionMnist& data, const mgpu::Options& o,
                         const ResnetOptions& ro) {
  const int k = devices.size(), n = mgpu::largest_batch(o.batch_size, data.train.count);
  mgpu::check_batches_fit(n, n, k);
  const Network net(ro.width);
  mgpu::set_gemm_precision(devices, ro.precision);
  use_kernels(devices, ro);
  check_memory(devices, net, mgpu::shard_sizes(n, k)[0], data);
  std::vector<Replica> replicas =
      make_replicas(devices, net, mgpu::shard_sizes(n, k)[0], init_params(net, o.seed), init_state(net));
  const std::unique_ptr<mgpu::Collective> collective = make_collective(devices, ro, net);
  Devices s{net, replicas, ro.bn, *collective};
  std::vector<mgpu::DeviceData> train_data = mgpu::put_on_every_device(devices, data.train);  // order: 0, 1, 2, ...
  train_batch(s, train_data, 0, n, o.lr);  // the first step pays one-time costs: not timed
  devices.synchronize();
  StepProfile result;
  const double start = mgpu::steady_seconds();
  train_batch(s, train_data, 0, n, o.lr);
  devices.synchronize();
  result.wall_seconds = mgpu::steady_seconds() - start;
  mgpu::KernelProfile profile(devices[0]);
  train_batch(s, train_data, 0, n, o.lr);
  result.kernels = profile.table();
  return result;
}

void dump_step(const mgpu::DeviceSet& devices, const mgpu::FashionMnist& data, const mgpu::Options& o,
               const ResnetOptions& ro) {
  const int k = devices.size(), n = o.batch_size;
  if (n > data.train.count)
    throw mgpu::Error("--dump-step: --batch-size " + std::to_string(n) + " is more than the " +
                      std::to_string(data.train.count) + " training images");
  mgpu::check_batches_fit(n, n, k);
  const Network net(ro.width);
  mgpu::set_gemm_precision(devices, ro.precision);
  use_kernels(devices, ro);
  const std::vector<int> sizes = mgpu::shard_sizes(n, k);
  check_memory(devices, net, sizes[0], data);
  const std::vector<float> params = init_params(net, o.seed), state = init_state(net);
  std::vector<Replica> replicas = make_replicas(devices, net, sizes[0], params, state);
  const std::unique_ptr<mgpu::Collective> collective = make_collective(devices, ro, net);
  Devices s{net, replicas, ro.bn, *collective};
  std::vector<mgpu::DeviceData> train_data = mgpu::put_on_every_device(devices, data.train);  // order: 0, 1, 2, ...

  split_batch(train_data, 0, n, replicas);
  for (Replica& r : replicas) r.grads.zero();
  forward(s, /*training=*/true);
  loss(s, /*with_gradient=*/true);
  backward(s);
  std::vector<float*> grads;
  for (Replica& r : replicas) grads.push_back(r.grads.data());
  s.allreduce.run(grads, mgpu::Elements{std::size_t(net.param_floats)});
  devices.synchronize();

  const std::filesystem::path dir = ro.dump_step;
  std::filesystem::create_directories(dir);
  write_tensors(net, net.params, params, dir / "params");
  write_tensors(net, net.state, state, dir / "state");
  write_tensors(net, net.state, replicas[0].state.download(), dir / "state_after");
  write_tensors(net, net.params, replicas[0].grads.download(), dir / "grads", 1.0f / n);  // of the mean loss
  // The batch, the logits [n][10] (from each device's [10][n_i]) and the mean loss.
  const std::size_t pixels = std::size_t(n) * 28 * 28;
  write_floats(dir / "images.f32", std::vector<float>(data.train.pixels.begin(), data.train.pixels.begin() + pixels));
  mgpu::write_whole_file((dir / "labels.i32").string(),
                         std::string(reinterpret_cast<const char*>(data.train.labels.data()), n * sizeof(std::int32_t)));
  // Every device's logits [10][n_i], as [n][10].
  auto all_logits = [&replicas] {
    std::vector<float> logits;
    for (Replica& r : replicas) {
      const std::vector<float> z = r.logits.download();
      for (int b = 0; b < r.n; ++b)
        for (int c = 0; c < 10; ++c) logits.push_back(z[std::size_t(c) * r.n + b]);
    }
    return logits;
  };
  double loss_sum = 0;
  for (Replica& r : replicas) {
    const std::vector<float> l = r.loss.download();
    for (int b = 0; b < r.n; ++b) loss_sum += l[b];
  }
  write_floats(dir / "logits.f32", all_logits());
  write_floats(dir / "loss.f32", {float(loss_sum / n)});
  // The same batch in evaluation mode, with device 0's running statistics after the step, as
  // the test accuracy is computed (the parameters are the step's starting ones: no SGD here).
  share_running_statistics(replicas);
  forward(s, /*training=*/false);
  write_floats(dir / "eval_logits.f32", all_logits());
  std::ostringstream meta;
  meta << "width=" << ro.width << "\ndevices=" << k << "\nbn=" << name_of(ro.bn) << "\nbatch=" << n << "\nshards=";
  for (int i = 0; i < k; ++i) meta << (i ? "," : "") << sizes[i];
  meta << "\nmomentum=" << kBatchNormMomentum << "\neps=" << kBatchNormEps << "\nprecision="
       << mgpu::to_string(mgpu::precision_in_this_build(ro.precision))  // what the GEMMs did
       << "\nbackend=" << mgpu::kBackendName << "\n";
  mgpu::write_whole_file((dir / "meta.txt").string(), meta.str());
  std::printf("wrote one training step of %d images on %d device(s), BatchNorm %s, to %s\n"
              "check it: /usr/bin/python3 chapters/09_resnet/crosscheck.py %s\n",
              n, k, name_of(ro.bn).c_str(), dir.string().c_str(), dir.string().c_str());
}

}  // namespace resnet
