#include "nn_data_parallel.h"

#include <algorithm>
#include <string>

#include "common/batches.h"
#include "common/gemm.h"
#include "common/parallel.h"  // mgpu::for_each_lane: this file is built as device code (CMakeLists.txt)
#include "common/train_loop.h"
#include "common/vector_ops.h"

namespace dp {

namespace {
constexpr int kPixels = 28 * 28, kClasses = 10;
const std::size_t kFlat = static_cast<std::size_t>(lenet::flat_count());  // F
}  // namespace

DataParallel::DataParallel(const DeviceSet& devices, const lenet::HostParams& init, int batch_size)
    : capacity_(batch_size),
      chunk_(lenet::chunk_images(mgpu::shard_sizes(batch_size, devices.size())[0])),
      batch_(devices[0], batch_size),
      logits_(devices[0], std::size_t(kClasses) * batch_size),
      dlogits_(devices[0], std::size_t(kClasses) * batch_size),
      loss_(devices[0], batch_size),
      correct_(devices[0], batch_size),
      ones_(devices[0], batch_size),
      sums_(devices[0], 2),
      staging_(devices[0], devices.size() > 1 ? kFlat : 0) {
  const int k = devices.size();
  const std::vector<int> largest = mgpu::shard_sizes(batch_size, k);  // the shards of a whole batch
  for (int i = 0; i < k; ++i) {
    const Device& d = devices[i];
    Worker w;
    w.device = &d;
    w.params = i == 0 ? lenet::upload_params(d, init, lenet::Layout::Flat) : lenet::zero_params(d, lenet::Layout::Flat);
    w.grads = lenet::zero_params(d, lenet::Layout::Flat);
    if (i > 0) w.x = mgpu::Buffer<float>(d, std::size_t(largest[i]) * kPixels);
    const int chunks = (largest[i] + chunk_ - 1) / chunk_;
    for (int c = 0; c < chunks; ++c) w.chunks.emplace_back(d, chunk_);
    w.lanes = std::min(mgpu::lanes_per_device(d), chunks);
    for (int l = 1; l < w.lanes; ++l) w.lane_grads.push_back(lenet::zero_params(d, lenet::Layout::Flat));
    w.ready = std::make_unique<mgpu::Event>(d);
    workers_.push_back(std::move(w));
  }
  mgpu::fill(devices[0], ones_.data(), batch_size, 1.0f);
  sums_.zero();
  // What device 0 holds and a DDP replica does not (a replica's shard is n_0 images and labels).
  device0_extra_bytes_ = std::size_t(batch_size - largest[0]) * (kPixels * sizeof(float) + sizeof(std::int32_t)) +
                         (logits_.size() + dlogits_.size() + loss_.size() + correct_.size() + ones_.size() +
                          sums_.size() + staging_.size()) * sizeof(float);
}

DataParallel::~DataParallel() {
  for (Worker& w : workers_) {
    try {
      mgpu::synchronize(*w.device);
    } catch (...) {  // a destructor must not throw; the error was (or will be) reported elsewhere
    }
  }
}

void DataParallel::copy(const Device& to, float* dst, const Device& from, const float* src, std::size_t n) {
  mgpu::copy_peer(to, dst, from, src, mgpu::Elements{n});  // queued on `to`
  if (to.id != from.id) step_bytes_ += n * sizeof(float);
}

void DataParallel::step(mgpu::DeviceData& data, int first, int n, float lr) {
  const int k = static_cast<int>(workers_.size());
  if (n > capacity_)
    throw mgpu::Error("DataParallel::step: a batch of " + std::to_string(n) + " examples exceeds the " +
                      std::to_string(capacity_) + " it was made for");
  if (first < 0 || first + n > data.images.count)
    throw mgpu::Error("DataParallel::step: examples " + std::to_string(first) + ".." + std::to_string(first + n) +
                      " of the order run past the " + std::to_string(data.images.count) + " examples");
  const std::vector<int> sizes = mgpu::shard_sizes(n, k);
  std::vector<int> starts(k, 0);  // device i's shard is examples [starts[i], starts[i] + sizes[i]) of the batch
  for (int i = 1; i < k; ++i) starts[i] = starts[i - 1] + sizes[i - 1];
  Worker& w0 = workers_[0];
  const Device& d0 = *w0.device;
  step_bytes_ = 0;

  // 1. Broadcast: device i waits for device 0's last SGD step, then pulls the master parameters.
  w0.ready->record(d0);
  for (int i = 1; i < k; ++i) {
    w0.ready->make_wait(*workers_[i].device);
    copy(*workers_[i].device, workers_[i].params.flat(), d0, w0.params.flat(), kFlat);
  }
  // 2. Scatter: device 0 gathers the whole batch from its copy of the training set, [n][28][28]
  //    and [n]; device i pulls its shard's images. Device 0's own shard is the batch's front.
  mgpu::gather(d0, data.images, data.order.data() + first, n, batch_);
  w0.ready->record(d0);
  for (int i = 1; i < k; ++i) {
    w0.ready->make_wait(*workers_[i].device);
    copy(*workers_[i].device, workers_[i].x.data(), d0, batch_.x.data() + std::size_t(starts[i]) * kPixels,
         std::size_t(sizes[i]) * kPixels);
  }
  // 3. Forward on every device, chunk c of its shard into chunks[c].z4 [10][m]; the lanes of a
  //    cpu device take every lanes-th chunk. The loss is not computed here: its labels and its
  //    kernel are on device 0.
  auto chunk_size = [&](int i, int c) { return std::min(chunk_, sizes[i] - c * chunk_); };
  auto chunk_count = [&](int i) { return (sizes[i] + chunk_ - 1) / chunk_; };
  for (int i = 0; i < k; ++i) {
    Worker& w = workers_[i];
    const float* x = i == 0 ? batch_.x.data() : w.x.data();
    w.grads.zero();
    for (lenet::Params& g : w.lane_grads) g.zero();
    mgpu::for_each_lane(*w.device, w.lanes, [&](int lane) {
      for (int c = lane; c < chunk_count(i); c += w.lanes)
        lenet::forward(*w.device, w.params, w.chunks[c], x + std::size_t(c) * chunk_ * kPixels, chunk_size(i, c));
    });
    if (i > 0) w.ready->record(*w.device);  // device 0's own stream orders its work
  }
  // 4. Gather: device 0 waits for each device's forward and pulls its logits into logits_, where
  //    the chunk of examples [s, s + m) is the block [10][m] at 10 s; then the loss of that
  //    block (chapter 01's softmax cross-entropy, lenet::loss's kernel) with its dlogits.
  for (int i = 0; i < k; ++i) {
    Worker& w = workers_[i];
    if (i > 0) w.ready->make_wait(d0);
    for (int c = 0; c < chunk_count(i); ++c) {
      const int s = starts[i] + c * chunk_, m = chunk_size(i, c);
      copy(d0, logits_.data() + std::size_t(kClasses) * s, *w.device, w.chunks[c].z4.data(), std::size_t(kClasses) * m);
      lenet::softmax_cross_entropy(d0, logits_.data() + std::size_t(kClasses) * s, batch_.y.data() + s, kClasses, m,
                                   loss_.data() + s, correct_.data() + s, dlogits_.data() + std::size_t(kClasses) * s);
    }
  }
  // The epoch's sums, as chapter 01 sums a bias gradient: [1][n] times ones [n][1], added in.
  mgpu::gemm(d0, mgpu::Transpose::No, mgpu::Transpose::No, 1, 1, n, 1.0f, loss_.data(), ones_.data(), 1.0f,
             sums_.data());
  mgpu::gemm(d0, mgpu::Transpose::No, mgpu::Transpose::No, 1, 1, n, 1.0f, correct_.data(), ones_.data(), 1.0f,
             sums_.data() + 1);
  w0.ready->record(d0);
  // 5. Scatter dlogits: device i waits for the loss, pulls each chunk's dlogits into its dz4
  //    [10][m], and runs backward, each lane adding into its own gradient; then the lanes' sum.
  for (int i = 0; i < k; ++i) {
    Worker& w = workers_[i];
    if (i > 0) w0.ready->make_wait(*w.device);
    for (int c = 0; c < chunk_count(i); ++c) {
      const std::size_t s = starts[i] + c * chunk_, m = chunk_size(i, c);
      copy(*w.device, w.chunks[c].dz4.data(), d0, dlogits_.data() + kClasses * s, kClasses * m);
    }
    mgpu::for_each_lane(*w.device, w.lanes, [&](int lane) {
      for (int c = lane; c < chunk_count(i); c += w.lanes)
        lenet::backward(*w.device, w.params, lane == 0 ? w.grads : w.lane_grads[lane - 1], w.chunks[c],
                        chunk_size(i, c));
    });
    for (lenet::Params& g : w.lane_grads) mgpu::add_into(*w.device, w.grads.flat(), g.flat(), kFlat);
    // Not on device 0: its event must still mark the loss, or device i > 0 would wait for
    // device 0's backward too, and the two backward passes would run one after the other.
    if (i > 0) w.ready->record(*w.device);
  }
  // 6. Reduce on device 0 (the first half of chapter 02's allreduce, no broadcast back): pull
  //    each gradient [F] into the staging buffer and add it; then device 0 alone steps.
  for (int i = 1; i < k; ++i) {
    workers_[i].ready->make_wait(d0);
    copy(d0, staging_.data(), *workers_[i].device, workers_[i].grads.flat(), kFlat);
    mgpu::add_into(d0, w0.grads.flat(), staging_.data(), static_cast<std::int64_t>(kFlat));
  }
  lenet::sgd(d0, w0.params, w0.grads, lr, n);
}

std::array<double, 2> DataParallel::read_metrics() const {
  const std::vector<float> s = sums_.download();
  return {s[0], s[1]};
}

DataParallelRun train_dataparallel(const DeviceSet& devices, const mgpu::FashionMnist& data,
                                   const mgpu::Options& o, mgpu::TrainingLog& log) {
  mgpu::check_batches_fit(data.train.count, o.batch_size, devices.size());
  const int largest = mgpu::largest_batch(o.batch_size, data.train.count);
  DataParallel trainer(devices, lenet::init_params(o.seed), largest);
  mgpu::DeviceData train(devices[0], data.train);  // device 0 only: the batch is gathered there
  const mgpu::DeviceImages test(devices[0], data.test);
  lenet::Lanes eval_lanes = lenet::make_lanes(devices[0], largest);
  DataParallelRun run;
  double moved = 0;
  int steps = 0;

  mgpu::EpochLoop loop;  // d2l's train_ch13 (common/train_loop.h): this trainer's parts of it
  loop.start_epoch = [&](int, const std::vector<int>& order) {
    trainer.reset_metrics();
    train.order.upload(order);
  };
  loop.step = [&](const mgpu::BatchOf& b) {
    trainer.step(train, b.first, b.size, b.lr);
    if (b.size == o.batch_size) run.bytes_per_full_step = trainer.step_bytes();
    moved += trainer.step_bytes();
    ++steps;
  };
  loop.synchronize = [&] { devices.synchronize(); };
  loop.devices = devices.all();  // the progress line counts their finished batches
  loop.train_metrics = [&] {
    const auto [loss_sum, hits] = trainer.read_metrics();
    return mgpu::LossAndHits{loss_sum, hits};
  };
  loop.test_accuracy = [&] { return lenet::evaluate_accuracy(devices[0], trainer.master(), eval_lanes, test); };
  mgpu::train_epochs(o, data.train.count, o.batch_size, loop, &log);
  run.params = trainer.master().download();
  run.mean_bytes_per_step = steps ? moved / steps : 0;
  run.device0_extra_bytes = trainer.device0_extra_bytes();
  return run;
}

}  // namespace dp
