#include "pipeline.h"

#include <algorithm>
#include <thread>

#include "../02_data_parallel/data_parallel.h"  // dp::Allreduce: the hybrid sums each stage with chapter 02's collective
#include "common/exercise.h"  // the student copy's holes call mgpu::exercise_not_done
#include "common/vector_ops.h"

namespace pp {

using lenet::Activation;
using lenet::ImageShape;
using mgpu::Buffer;
using mgpu::Elements;

// ---- Where the model is cut ---------------------------------------------------------------

std::string check_cuts(const std::vector<int>& cuts) {
  for (std::size_t i = 0; i < cuts.size(); ++i) {
    if (cuts[i] < 1 || cuts[i] > kLayers - 1)
      return "a cut must name a layer from 1 to " + std::to_string(kLayers - 1) + " (the first layer of a stage), got " +
             std::to_string(cuts[i]);
    if (i > 0 && cuts[i] <= cuts[i - 1]) return "the cuts must increase: every stage needs at least one layer";
  }
  if (static_cast<int>(cuts.size()) > kLayers - 1)
    return "LeNet has " + std::to_string(kLayers) + " layers: at most " + std::to_string(kLayers) + " stages";
  return "";
}

std::vector<int> stage_bounds(const std::vector<int>& cuts) {
  const std::string why = check_cuts(cuts);
  if (!why.empty()) throw mgpu::Error("stage_bounds: " + why);
  std::vector<int> bounds{0};
  bounds.insert(bounds.end(), cuts.begin(), cuts.end());
  bounds.push_back(kLayers);
  return bounds;
}

std::vector<int> default_cuts(int stages) {
  switch (stages) {
    case 1: return {};
    case 2: return {2};  // the convolutions | the dense layers
    case 3: return {1, 2};
    case 4: return {1, 2, 3};
  }
  throw mgpu::Error("default_cuts: LeNet splits into 1 to 4 stages, not " + std::to_string(stages));
}

// ---- Schedules ----------------------------------------------------------------------------

const char* name_of(Schedule s) {
  switch (s) {
    case Schedule::Naive: return "naive";
    case Schedule::GPipe: return "gpipe";
    case Schedule::OneFOneB: return "1f1b";
  }
  return "?";
}

std::vector<Op> stage_ops(Schedule schedule, int stage, int stages, int m) {
  if (stage < 0 || stage >= stages || m < 1) throw mgpu::Error("stage_ops: no such stage or no micro-batch");
  if (schedule == Schedule::Naive && m != 1) throw mgpu::Error("stage_ops: the naive schedule has one micro-batch");
  std::vector<Op> ops;
  // BEGIN EXERCISE ex07.pipeline
  if (schedule != Schedule::OneFOneB) {  // GPipe: every forward, then every backward
    for (int j = 0; j < m; ++j) ops.push_back({Op::Forward, j});
    for (int j = 0; j < m; ++j) ops.push_back({Op::Backward, j});
    return ops;
  }
  // 1F1B: the last stage can start backward after its first forward; stage s has k - 1 - s
  // stages after it, so it runs that many extra forwards before its first backward comes back.
  const int warmup = std::min(m, stages - 1 - stage);
  int forward = 0, backward = 0;
  while (forward < warmup) ops.push_back({Op::Forward, forward++});
  while (forward < m) {  // steady state: one forward, one backward
    ops.push_back({Op::Forward, forward++});
    ops.push_back({Op::Backward, backward++});
  }
  while (backward < m) ops.push_back({Op::Backward, backward++});  // cool-down
  // END EXERCISE ex07.pipeline
  return ops;
}

int peak_in_flight(const std::vector<Op>& ops) {
  int peak = 0;
  // BEGIN EXERCISE ex07.pipeline
  int live = 0;  // micro-batches forwarded and not yet backwarded: their activations are kept
  for (const Op& op : ops) {
    live += op.kind == Op::Forward ? 1 : -1;
    peak = std::max(peak, live);
  }
  // END EXERCISE ex07.pipeline
  return peak;
}

double bubble_formula(int stages, int m) { return double(stages - 1) / (m + stages - 1); }

std::vector<double> predicted_idle(const std::vector<double>& stage_time, int m) {
  std::vector<double> idle;
  // BEGIN EXERCISE ex07.bubble
  double sum = 0, slowest = 0;
  for (double t : stage_time) sum += t, slowest = std::max(slowest, t);
  const double step = (m - 1) * slowest + sum;  // the slowest stage back to back, plus one trip through all
  for (double t : stage_time) idle.push_back(step > 0 ? 1.0 - m * t / step : 0.0);
  // END EXERCISE ex07.bubble
  return idle;
}

// ---- One stage's memory -------------------------------------------------------------------

namespace {

// Floats per image of each tensor a layer's forward pass keeps for its backward pass.
//   layer 0: col1 [9][B*26*26], h1 [20][B][26][26], output p1 [20][B][13][13]
//   layer 1: col2 [500][B*9*9], h2 [50][B][9][9], p2 [50][B][4][4], output f [800][B]
//   layer 2: output h3 [128][B]           layer 3: output z4 [10][B]
std::int64_t per_image(int layer_count_a, int layer_count_b) { return std::int64_t(layer_count_a) * layer_count_b; }

// One micro-batch's activations on one stage, for up to B = capacity images. Only the buffers
// of the stage's own layers are allocated; the others stay empty.
struct Slot {
  std::unique_ptr<mgpu::Batch> images;  // stage 0: [B][28][28] images and [B] labels, gathered here
  Buffer<float> x;                       // later stages: [kFeaturesInto[first]][B], received
  Buffer<std::int32_t> y;                // later stages: [B] labels, received beside x
  Buffer<float> col1, h1, p1, col2, h2, p2, f, h3, z4;
  Buffer<float> dz4, loss, correct;      // last stage: the loss's gradient and the metrics' inputs
  Buffer<float> dx;                      // later stages: [kFeaturesInto[first]][B], sent back

  float* input() { return images ? images->x.data() : x.data(); }
  std::int32_t* labels() { return images ? images->y.data() : y.data(); }
  float* output_of(int layer) {  // what layer `layer` writes: the next layer's input
    switch (layer) {
      case 0: return p1.data();
      case 1: return f.data();
      case 2: return h3.data();
      default: return z4.data();
    }
  }
  std::size_t bytes() const {
    std::size_t floats = x.size() + col1.size() + h1.size() + p1.size() + col2.size() + h2.size() + p2.size() +
                         f.size() + h3.size() + z4.size() + dz4.size() + loss.size() + correct.size() + dx.size();
    if (images) floats += images->x.size();
    return floats * sizeof(float) + (images ? images->y.size() : y.size()) * sizeof(std::int32_t);
  }
};

std::vector<std::unique_ptr<mgpu::Event>> events(const Device& d, int n) {
  std::vector<std::unique_ptr<mgpu::Event>> e;
  for (int i = 0; i < n; ++i) e.push_back(std::make_unique<mgpu::Event>(d));
  return e;
}

}  // namespace

struct Pipeline::Stage {
  Stage(const Device& d, int first, int last, int stages, int index, const lenet::HostParams& init, int B,
        int slot_count, int micro_batches);
  const Device* device;
  int first, last;  // layers [first, last)
  bool is_first, is_last;
  // The stage's tensors (2 * first .. 2 * last - 1), one flat allocation each for parameters and
  // gradients, laid out as in lenet::offset_of: a stage's gradient is one contiguous bucket,
  // summed across replicas in one call. `params` and `grads` view them (other tensors: nullptr).
  Buffer<float> param_storage, grad_storage;
  lenet::Params params, grads;
  std::vector<Slot> slots;  // one per micro-batch in flight (peak_in_flight of the schedule)
  // Scratch that one micro-batch's backward pass uses and leaves: [features][B] each.
  Buffer<float> ones, dout, dh3, df, dp2, dh2, dcol2, dp1, dh1;
  std::unique_ptr<mgpu::Metrics> metrics, eval_metrics;  // last stage
  std::unique_ptr<mgpu::DeviceImages> train, test;       // first stage
  Buffer<std::int32_t> order, test_order;                 // first stage
  // Events of this device, per micro-batch j of a step:
  std::vector<std::unique_ptr<mgpu::Event>> sent_forward;  // j's output is ready to be copied forward
  std::vector<std::unique_ptr<mgpu::Event>> sent_back;     // j's input gradient is ready to be copied back
  std::vector<std::unique_ptr<mgpu::Event>> took_forward;  // j's input has been copied from the stage before
  std::vector<std::unique_ptr<mgpu::Event>> took_back;     // j's output gradient has been copied from the stage after
  std::unique_ptr<mgpu::Event> step_done;
  Slot& slot(int micro) { return slots[micro % slots.size()]; }
  std::int64_t offset(int t) const { return lenet::offset_of(t) - lenet::offset_of(2 * first); }
  std::int64_t flat_count() const { return offset(2 * last); }
};

Pipeline::Stage::Stage(const Device& d, int first_, int last_, int stages, int index, const lenet::HostParams& init,
                       int B, int slot_count, int m)
    : device(&d), first(first_), last(last_), is_first(index == 0), is_last(index == stages - 1) {
  param_storage = Buffer<float>(d, lenet::offset_of(2 * last) - lenet::offset_of(2 * first));
  grad_storage = Buffer<float>(d, param_storage.size());
  param_storage.zero();  // the padding between tensors stays zero
  grad_storage.zero();
  for (int t = 2 * first; t < 2 * last; ++t) {
    params.tensors[t] = param_storage.data() + offset(t);
    grads.tensors[t] = grad_storage.data() + offset(t);
    mgpu::copy_bytes_to_device(d, params.tensors[t], init.at(t).data(), init[t].size() * sizeof(float));
  }
  auto has = [&](int layer) { return first <= layer && layer < last; };
  auto floats = [&](std::int64_t per_image_count) { return std::size_t(per_image_count) * B; };
  for (int i = 0; i < slot_count; ++i) {
    Slot s;
    if (is_first) {
      s.images = std::make_unique<mgpu::Batch>(d, B);
    } else {
      s.x = Buffer<float>(d, floats(kFeaturesInto[first]));
      s.y = Buffer<std::int32_t>(d, B);
      s.dx = Buffer<float>(d, floats(kFeaturesInto[first]));
    }
    if (has(0)) s.col1 = Buffer<float>(d, floats(per_image(9, 676))), s.h1 = Buffer<float>(d, floats(per_image(20, 676))),
                s.p1 = Buffer<float>(d, floats(kFeaturesInto[1]));
    if (has(1)) s.col2 = Buffer<float>(d, floats(per_image(500, 81))), s.h2 = Buffer<float>(d, floats(per_image(50, 81))),
                s.p2 = Buffer<float>(d, floats(800)), s.f = Buffer<float>(d, floats(kFeaturesInto[2]));
    if (has(2)) s.h3 = Buffer<float>(d, floats(kFeaturesInto[3]));
    if (has(3)) s.z4 = Buffer<float>(d, floats(10)), s.dz4 = Buffer<float>(d, floats(10)), s.loss = Buffer<float>(d, B),
                s.correct = Buffer<float>(d, B);
    slots.push_back(std::move(s));
  }
  ones = Buffer<float>(d, floats(has(0) ? 676 : has(1) ? 81 : 1));  // the longest row a bias gradient sums
  mgpu::fill(d, ones.data(), ones.size(), 1.0f);
  if (!is_last) dout = Buffer<float>(d, floats(kFeaturesInto[last]));
  if (has(3) && first < 3) dh3 = Buffer<float>(d, floats(128));
  if (has(2) && first < 2) df = Buffer<float>(d, floats(800));
  if (has(1)) dp2 = Buffer<float>(d, floats(800)), dh2 = Buffer<float>(d, floats(per_image(50, 81))),
              dcol2 = Buffer<float>(d, floats(per_image(500, 81)));
  if (has(1) && first < 1) dp1 = Buffer<float>(d, floats(kFeaturesInto[1]));
  if (has(0)) dh1 = Buffer<float>(d, floats(per_image(20, 676)));
  if (is_last) metrics = std::make_unique<mgpu::Metrics>(d), eval_metrics = std::make_unique<mgpu::Metrics>(d);
  sent_forward = events(d, m);
  sent_back = events(d, m);
  took_forward = events(d, m);
  took_back = events(d, m);
  step_done = std::make_unique<mgpu::Event>(d);
}

struct Pipeline::Replica {
  std::vector<std::unique_ptr<Stage>> stages;
};

// ---- Building the pipeline ----------------------------------------------------------------

namespace {

int cores() { return std::max(1u, std::thread::hardware_concurrency()); }

}  // namespace

Pipeline::Pipeline(const PipelineConfig& config, const lenet::HostParams& init, int batch_size)
    : config_(config), bounds_(stage_bounds(config.cuts)) {
  const int k = stages(), R = replicas(), m = config.micro_batches;
  if (R < 1 || m < 1 || batch_size < 1) throw mgpu::Error("Pipeline: need replicas, micro-batches and a batch size >= 1");
  if (config.schedule == Schedule::Naive && m != 1) throw mgpu::Error("Pipeline: the naive schedule has one micro-batch");
  capacity_ = mgpu::shard_sizes(std::max(batch_size, R * std::min(m, batch_size)), R)[0];  // a replica's part
  capacity_ = (capacity_ + std::min(m, capacity_) - 1) / std::min(m, capacity_);          // its largest micro-batch
  // Stage s of every replica lives in one DeviceSet, so that a collective of earlier chapters
  // (made for a DeviceSet) can sum that stage's gradients across the replicas. cpu: the cores
  // are shared among all k x R devices. cuda: device (s, r) on GPU (r * k + s) % gpu_count().
  const int share = std::max(1, (config.cpu_threads > 0 ? config.cpu_threads : cores()) / (k * R));
  for (int s = 0; s < k; ++s) {
    std::vector<int> gpus;
    if (mgpu::kCudaBackend)
      for (int r = 0; r < R; ++r) gpus.push_back((r * k + s) % std::max(1, mgpu::gpu_count()));
    devices_.push_back(std::make_unique<mgpu::DeviceSet>(R, gpus, share * R));
  }
  for (int r = 0; r < R; ++r) {
    auto replica = std::make_unique<Replica>();
    for (int s = 0; s < k; ++s) {
      // Enough slots for the schedule's peak, and for evaluation's forward-only passes.
      const int slots = peak_in_flight(stage_ops(config.schedule, s, k, m));
      replica->stages.push_back(std::make_unique<Stage>((*devices_[s])[r], bounds_[s], bounds_[s + 1], k, s, init,
                                                        capacity_, slots, m));
    }
    replicas_.push_back(std::move(replica));
  }
  if (R > 1)  // the hybrid: one collective per stage, across that stage's R devices
    for (int s = 0; s < k; ++s)
      allreduce_.push_back(
          std::make_unique<dp::Allreduce>(*devices_[s], replicas_[0]->stages[s]->grad_storage.size()));
}

Pipeline::~Pipeline() {
  allreduce_.clear();
  try {
    synchronize();  // queued copies may still read buffers about to be freed
  } catch (...) {
  }
}

std::string Pipeline::mapping() const {
  std::string out;
  for (int s = 0; s < stages(); ++s) {
    out += "stage " + std::to_string(s) + " (layers " + std::to_string(bounds_[s]) + "-" +
           std::to_string(bounds_[s + 1] - 1) + "):";
    for (int r = 0; r < replicas(); ++r)
      out += std::string(r ? "," : "") + " replica " + std::to_string(r) + " -> " + (*devices_[s])[r].name() +
             ((*devices_[s])[r].gpu >= 0 ? "" : " device " + std::to_string(r * stages() + s));
    out += "\n";
  }
  return out;
}

void Pipeline::synchronize() const {
  for (const auto& set : devices_) set->synchronize();
}

void Pipeline::set_training_data(const mgpu::LabeledImages& train) {
  for (auto& r : replicas_) {
    Stage& st = *r->stages[0];
    st.train = std::make_unique<mgpu::DeviceImages>(*st.device, train);
    st.order = Buffer<std::int32_t>(*st.device, train.count);
  }
}

void Pipeline::set_order(const std::vector<int>& order) {
  for (auto& r : replicas_) r->stages[0]->order.upload(order);
}

// ---- One micro-batch through one stage ----------------------------------------------------

namespace {

// Layer l's forward pass on n images: from `in`, into the slot's buffers (its output included).
void layer_forward(const Device& d, int l, lenet::Params& p, Slot& s, const float* in, int n) {
  switch (l) {
    case 0:  // in [1][n][28][28] -> p1 [20][n][13][13]
      lenet::conv2d_forward(d, in, {1, n, 28, 28}, p.W1(), p.b1(), 20, 3, Activation::Relu, s.col1.data(), s.h1.data());
      lenet::avgpool2_forward(d, s.h1.data(), {20, n, 26, 26}, s.p1.data());
      break;
    case 1:  // in [20][n][13][13] -> f [800][n]
      lenet::conv2d_forward(d, in, {20, n, 13, 13}, p.W2(), p.b2(), 50, 5, Activation::Relu, s.col2.data(), s.h2.data());
      lenet::avgpool2_forward(d, s.h2.data(), {50, n, 9, 9}, s.p2.data());
      lenet::flatten(d, s.p2.data(), {50, n, 4, 4}, s.f.data());
      break;
    case 2:  // in [800][n] -> h3 [128][n]
      lenet::dense_forward(d, in, 800, n, p.W3(), p.b3(), 128, Activation::Relu, s.h3.data());
      break;
    case 3:  // in [128][n] -> z4 [10][n]
      lenet::dense_forward(d, in, 128, n, p.W4(), p.b4(), 10, Activation::None, s.z4.data());
      break;
  }
}

// Layer l's backward pass, chapter 01's (lenet::layer_backward) on this stage's buffers: from dy
// (the gradient of its output; may be overwritten), adds its parameter gradients into g and
// writes the gradient of its input into dx (nullptr: not needed).
void layer_backward(const Device& d, int l, lenet::Params& p, lenet::Params& g, Slot& s, const float* in, float* dy,
                    float* dx, int n, const float* ones, float* dp2, float* dh2, float* dcol2, float* dh1) {
  lenet::LayerTensors t;
  t.in = in, t.dy = dy, t.dx = dx, t.ones = ones;
  const float* cols[] = {s.col1.data(), s.col2.data()};
  const float* relu_outs[] = {s.h1.data(), s.h2.data(), s.h3.data()};
  if (l <= 1) t.col = cols[l], t.dconv = l == 0 ? dh1 : dh2;
  if (l <= 2) t.relu_out = relu_outs[l];
  if (l == 1) t.dpool = dp2, t.dcol = dcol2;
  lenet::layer_backward(d, l, p, g, t, n);
}

using Marks = std::vector<std::pair<Span, std::array<mgpu::Timestamp, 2>>>;

// Adds a span of kind `kind` from timestamp `from` to timestamp `to` to marks (nothing when
// marks is null).
struct Marker {
  Marks* marks;
  const Device& d;
  Span base;
  mgpu::Timestamp now() const {
    mgpu::Timestamp t;
    if (marks) t.record(d);
    return t;
  }
  void add(char kind, const mgpu::Timestamp& from, const mgpu::Timestamp& to) const {
    if (!marks) return;
    Span s = base;
    s.kind = kind;
    marks->push_back({s, {from, to}});
  }
};

}  // namespace

void Pipeline::run_op(Replica& r, int s, Op op, const std::vector<int>& sizes, int first, bool training, Marks* marks) {
  Stage& st = *r.stages[s];
  const Device& d = *st.device;
  const int j = op.micro, n = sizes[j], S = static_cast<int>(st.slots.size());
  int start = first;
  for (int i = 0; i < j; ++i) start += sizes[i];
  Slot& slot = st.slot(j);
  const Marker mark{marks, d, Span{timed_steps_, 0, s, 'F', j, 0, 0}};

  if (op.kind == Op::Forward) {
    const mgpu::Timestamp t0 = mark.now();
    // The output buffer of this slot last held micro-batch j - S: the next stage must have
    // copied it before it is overwritten.
    if (!st.is_last && j >= S) r.stages[s + 1]->took_forward[j - S]->make_wait(d);
    if (st.is_first) {
      const mgpu::DeviceImages& data = training ? *st.train : *st.test;
      const std::int32_t* order = (training ? st.order : st.test_order).data();
      mgpu::gather(d, data, order + start, n, *slot.images);
      mark.add('W', t0, t0);
    } else {
      // BEGIN EXERCISE ex07.pipeline
      Stage& prev = *r.stages[s - 1];
      Slot& from = prev.slot(j);
      // Wait until the stage before has finished micro-batch j's forward pass, then pull its
      // output and the labels (queued on this device: the receiver pulls, as in chapter 02).
      prev.sent_forward[j]->make_wait(d);
      const mgpu::Timestamp t1 = mark.now();
      mark.add('W', t0, t1);
      mgpu::copy_peer(d, slot.x.data(), *prev.device, from.output_of(prev.last - 1),
                      Elements{std::size_t(kFeaturesInto[st.first]) * n});
      mgpu::copy_peer(d, slot.y.data(), *prev.device, from.labels(), Elements{std::size_t(n)});
      st.took_forward[j]->record(d);  // the stage before may reuse its buffer
      mark.add('C', t1, mark.now());
      // END EXERCISE ex07.pipeline
    }
    const mgpu::Timestamp t2 = mark.now();
    const float* in = slot.input();
    for (int l = st.first; l < st.last; ++l) {
      layer_forward(d, l, st.params, slot, in, n);
      in = slot.output_of(l);
    }
    if (st.is_last) {  // the loss, its gradient (training only), and the running metrics
      lenet::softmax_cross_entropy(d, slot.z4.data(), slot.labels(), 10, n, slot.loss.data(), slot.correct.data(),
                                   training ? slot.dz4.data() : nullptr);
      mgpu::accumulate_metrics(d, slot.loss.data(), slot.correct.data(), n,
                                training ? *st.metrics : *st.eval_metrics);
    }
    mark.add('F', t2, mark.now());  // before the event: the next stage starts after this clock reading
    if (!st.is_last) st.sent_forward[j]->record(d);
    return;
  }

  // Backward: the gradient of this stage's output, from the stage after (or from the loss).
  const mgpu::Timestamp t0 = mark.now();
  float* dy = slot.dz4.data();
  // The slot's dx last held micro-batch j - S's input gradient: the stage before must have copied it.
  if (!st.is_first && j >= S) r.stages[s - 1]->took_back[j - S]->make_wait(d);
  // BEGIN EXERCISE ex07.pipeline
  if (!st.is_last) {
    // The mirror image of the forward's receive: wait until the stage after has finished
    // micro-batch j's backward pass, then pull the gradient of this stage's output.
    Stage& next = *r.stages[s + 1];
    next.sent_back[j]->make_wait(d);
    const mgpu::Timestamp t1 = mark.now();
    mark.add('W', t0, t1);
    mgpu::copy_peer(d, st.dout.data(), *next.device, next.slot(j).dx.data(),
                    Elements{std::size_t(kFeaturesInto[st.last]) * n});
    st.took_back[j]->record(d);  // the stage after may reuse its dx
    mark.add('C', t1, mark.now());
    dy = st.dout.data();
  } else {
    mark.add('W', t0, t0);
  }
  // END EXERCISE ex07.pipeline
  const mgpu::Timestamp t2 = mark.now();
  // The scratch gradient of the input of layers first+1 .. last-1: dp1, df, dh3 (lenet.h's names).
  auto gradient_into = [&](int l) -> float* {
    if (l == st.first) return st.is_first ? nullptr : slot.dx.data();
    return l == 1 ? st.dp1.data() : l == 2 ? st.df.data() : st.dh3.data();
  };
  for (int l = st.last - 1; l >= st.first; --l) {
    const float* in = l == st.first ? slot.input() : slot.output_of(l - 1);
    float* dx = gradient_into(l);
    layer_backward(d, l, st.params, st.grads, slot, in, dy, dx, n, st.ones.data(), st.dp2.data(), st.dh2.data(),
                   st.dcol2.data(), st.dh1.data());
    dy = dx;
  }
  if (marks) marks->push_back({Span{timed_steps_, 0, s, 'B', j, 0, 0}, {t2, mark.now()}});
  if (!st.is_first) st.sent_back[j]->record(d);
}

// Queues every stage's ops on its device, in an order the host can follow: an op is queued
// once the ops whose events it waits for have been queued (an event must be recorded before
// another device can be told to wait for it). The devices then run in parallel, each in its
// own order, held back only by those events.
void Pipeline::queue_ops(Replica& r, const std::vector<std::vector<Op>>& ops, const std::vector<int>& sizes, int first,
                         bool training, Marks* marks) {
  // BEGIN EXERCISE ex07.pipeline
  const int k = stages(), m = static_cast<int>(sizes.size());
  std::vector<std::size_t> next(k, 0);  // the next op of each stage
  std::vector<std::array<std::vector<bool>, 2>> queued(k, {std::vector<bool>(m), std::vector<bool>(m)});
  // Whether every event run_op(s, op) waits for has been recorded by an op queued before it.
  auto ready = [&](int s, Op op) {
    const int S = static_cast<int>(r.stages[s]->slots.size()), j = op.micro;
    if (op.kind == Op::Forward)
      return (s == 0 || queued[s - 1][Op::Forward][j]) &&  // sent_forward[j]: the input to pull
             (s == k - 1 || j < S || queued[s + 1][Op::Forward][j - S]);  // took_forward[j - S]: the slot is free
    return (s == k - 1 || queued[s + 1][Op::Backward][j]) &&  // sent_back[j]: the output's gradient
           (s == 0 || j < S || queued[s - 1][Op::Backward][j - S]);  // took_back[j - S]: dx is free
  };
  // Round and round the stages, each as far along its own order as the events allow. A round
  // that queues nothing ends it: either everything is queued, or the orders wait on each other.
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < k; ++s)
      while (next[s] < ops[s].size() && ready(s, ops[s][next[s]])) {
        const Op op = ops[s][next[s]++];
        run_op(r, s, op, sizes, first, training, marks);
        queued[s][op.kind][op.micro] = true;
        progress = true;
      }
  }
  for (int s = 0; s < k; ++s)
    if (next[s] != ops[s].size()) throw mgpu::Error("Pipeline: the schedule cannot be queued (an op waits forever)");
  // END EXERCISE ex07.pipeline
}

// Every device waits until every device has finished the step: the next step's buffers may then
// be rewritten without asking who still reads them. (Chapter 02's allreduce ends the same way.)
void Pipeline::end_step_barrier() {
  std::vector<const Device*> all;
  std::vector<mgpu::Event*> done;
  for (auto& r : replicas_)
    for (auto& st : r->stages) {
      st->step_done->record(*st->device);
      all.push_back(st->device);
      done.push_back(st->step_done.get());
    }
  for (std::size_t a = 0; a < all.size(); ++a)
    for (std::size_t b = 0; b < all.size(); ++b)
      if (a != b) done[b]->make_wait(*all[a]);
}

void Pipeline::step(int first, int n, float lr, std::vector<Span>* timeline) {
  const int k = stages(), R = replicas();
  Marks marks;
  Marks* record = timeline ? &marks : nullptr;
  const std::vector<int> parts = mgpu::shard_sizes(n, R);  // the batch across the replicas
  for (int r = 0, start = first; r < R; start += parts[r], ++r) {
    const int m = std::min(config_.micro_batches, parts[r]);
    const std::vector<int> sizes = mgpu::shard_sizes(parts[r], m);
    if (sizes[0] > capacity_) throw mgpu::Error("Pipeline::step: a micro-batch larger than the pipeline was made for");
    std::vector<std::vector<Op>> ops;
    for (int s = 0; s < k; ++s) ops.push_back(stage_ops(m == 1 ? Schedule::Naive : config_.schedule, s, k, m));
    for (auto& st : replicas_[r]->stages) st->grad_storage.zero();  // backward adds into it
    const std::size_t before = marks.size();
    queue_ops(*replicas_[r], ops, sizes, start, /*training=*/true, record);
    for (std::size_t i = before; i < marks.size(); ++i) marks[i].first.replica = r;
  }
  // The update: each stage's gradient summed over its replicas (chapter 02's allreduce, one
  // flat bucket per stage), then the same SGD step on every replica, divided by the whole batch.
  for (int s = 0; s < k; ++s) {
    std::vector<mgpu::Timestamp> began(record ? R : 0);
    for (int r = 0; r < R && record; ++r) began[r].record(*replicas_[r]->stages[s]->device);
    if (R > 1) {
      std::vector<float*> grads;  // [R]: the stage's flat gradient on each replica's device
      for (auto& rep : replicas_) grads.push_back(rep->stages[s]->grad_storage.data());
      allreduce_[s]->run(grads, Elements{replicas_[0]->stages[s]->grad_storage.size()});
    }
    for (int r = 0; r < R; ++r) {
      Stage& st = *replicas_[r]->stages[s];
      mgpu::sgd_update(*st.device, st.param_storage.data(), st.grad_storage.data(), st.flat_count(), lr / n);
      if (record) {
        mgpu::Timestamp end;
        end.record(*st.device);
        marks.push_back({Span{timed_steps_, r, s, 'U', -1, 0, 0}, {began[r], end}});
      }
    }
  }
  end_step_barrier();
  if (timeline) {
    for (auto& [span, t] : marks) {
      span.begin = t[0].seconds();
      span.end = t[1].seconds();
      timeline->push_back(span);
    }
    ++timed_steps_;
  }
}

void Pipeline::reset_metrics() {
  for (auto& r : replicas_) r->stages.back()->metrics->reset();
}

std::array<double, 2> Pipeline::read_metrics() const {
  std::array<double, 2> sum{0, 0};
  for (const auto& r : replicas_) {
    const auto m = r->stages.back()->metrics->read();
    sum[0] += m[0], sum[1] += m[1];
  }
  return sum;
}

double Pipeline::evaluate(const mgpu::LabeledImages& test, int batch_size) {
  Replica& r = *replicas_[0];
  Stage& st0 = *r.stages[0];
  if (!st0.test || st0.test->count != test.count) {
    st0.test = std::make_unique<mgpu::DeviceImages>(*st0.device, test);
    std::vector<int> identity(test.count);
    for (int i = 0; i < test.count; ++i) identity[i] = i;
    st0.test_order = Buffer<std::int32_t>(*st0.device, test.count);
    st0.test_order.upload(identity);
  }
  r.stages.back()->eval_metrics->reset();
  const int chunk = std::min(batch_size, capacity_ * std::min(config_.micro_batches, capacity_));
  for (int first = 0; first < test.count; first += chunk) {
    const int n = std::min(chunk, test.count - first);
    const std::vector<int> sizes = mgpu::shard_sizes(n, std::min(config_.micro_batches, n));
    std::vector<std::vector<Op>> ops(stages());  // forward passes only
    for (auto& o : ops)
      for (int j = 0; j < static_cast<int>(sizes.size()); ++j) o.push_back({Op::Forward, j});
    queue_ops(r, ops, sizes, first, /*training=*/false, nullptr);
    end_step_barrier();
  }
  return r.stages.back()->eval_metrics->read()[1] / test.count;
}

lenet::HostParams Pipeline::download() const {
  lenet::HostParams host(lenet::kParamTensors);
  for (const auto& st : replicas_[0]->stages)
    for (int t = 2 * st->first; t < 2 * st->last; ++t) {
      host[t].resize(lenet::kParams[t].count);
      mgpu::copy_bytes_to_host(*st->device, host[t].data(), st->params.tensors[t], host[t].size() * sizeof(float));
    }
  return host;
}

std::size_t Pipeline::activation_bytes(int stage) const {
  std::size_t bytes = 0;
  for (const Slot& s : replicas_[0]->stages.at(stage)->slots) bytes += s.bytes();
  return bytes;
}

int Pipeline::slots(int stage) const { return static_cast<int>(replicas_[0]->stages.at(stage)->slots.size()); }

// ---- The bubble, measured -----------------------------------------------------------------

Bubble measure_bubble(const std::vector<Span>& spans, int stages, int m) {
  Bubble b;
  b.busy.assign(stages, 0.0);
  b.stage_time.assign(stages, 0.0);
  int steps = 0;
  for (int step = 0;; ++step) {
    double begin = 1e300, end = -1e300;
    std::vector<double> busy(stages, 0.0);
    bool any = false;
    for (const Span& s : spans) {
      if (s.step != step || s.replica != 0) continue;
      any = true;
      begin = std::min(begin, s.begin);
      end = std::max(end, s.end);
      if (s.kind == 'F' || s.kind == 'B') busy[s.stage] += s.end - s.begin;
    }
    if (!any) break;
    ++steps;
    b.step_seconds += end - begin;
    for (int s = 0; s < stages; ++s) {
      b.busy[s] += busy[s] / (end - begin);
      b.stage_time[s] += busy[s] / m;
    }
  }
  if (steps == 0) throw mgpu::Error("measure_bubble: no step in the timeline");
  b.step_seconds /= steps;
  for (int s = 0; s < stages; ++s) {
    b.busy[s] /= steps;
    b.stage_time[s] /= steps;
    b.idle.push_back(1.0 - b.busy[s]);
  }
  return b;
}

}  // namespace pp
