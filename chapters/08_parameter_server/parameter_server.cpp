#include "parameter_server.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <exception>
#include <future>
#include <limits>
#include <thread>

#include "common/collective.h"  // chunk_of: the shards' slices of the bucket
#include "common/exercise.h"  // the student copy's holes call mgpu::exercise_not_done
#include "common/threads.h"
#include "common/vector_ops.h"

namespace ps {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

}  // namespace

std::string mode_name(Mode m) {
  switch (m) {
    case Mode::Bsp: return "bsp";
    case Mode::Asp: return "asp";
    case Mode::Ssp: return "ssp";
  }
  return "?";
}

double server_bytes_per_step(int workers, int servers, double model_bytes) {
  // k pulls out of the shard and k pushes into it, each 1/s of the model.
  return 2.0 * workers * model_bytes / servers;
}

double ring_bytes_per_device(int workers, double model_bytes) {
  // Reduce-scatter and all-gather: k - 1 chunks of 1/k of the model each, both ways.
  return 2.0 * (workers - 1) * model_bytes / workers;
}

double server_seconds(const cost::Interconnect& c, int k, int s, double bytes) {
  const double slice = bytes / s;
  const double transfers = k * (c.alpha_s + slice / c.link_bytes_s);
  const double adds = k * (c.alpha_s + slice / c.add_bytes_s);
  return transfers + adds + transfers;  // pushes in, adds and the update, pulls out
}

// ---- Clocks ----------------------------------------------------------------------------------

Clocks::Clocks(int workers, int bound)
    : bound_(bound), clock_(workers, 0), finished_(workers, false), waited_(workers, 0.0) {}

std::int64_t Clocks::slowest_running() const {
  std::int64_t slowest = std::numeric_limits<std::int64_t>::max();
  // BEGIN EXERCISE ex08.ssp_server
  for (std::size_t i = 0; i < clock_.size(); ++i)
    if (!finished_[i]) slowest = std::min(slowest, clock_[i]);
  // END EXERCISE ex08.ssp_server
  return slowest;
}

void Clocks::wait_turn(int worker) {
  // BEGIN EXERCISE ex08.ssp_server
  if (bound_ < 0) return;  // ASP: nobody waits
  const Clock::time_point start = Clock::now();
  std::unique_lock<std::mutex> lock(mutex_);
  // The caller is running, so slowest_running() is at most its own clock: the gap is >= 0.
  // wait() checks the condition first, sleeps while it is false, and checks it again on every
  // wake-up, the lock held each time: a tick or a finish between two checks cannot be missed.
  changed_.wait(lock, [&] { return clock_[worker] - slowest_running() <= bound_; });
  waited_[worker] += seconds_since(start);
  // END EXERCISE ex08.ssp_server
}

void Clocks::tick(int worker) {
  // BEGIN EXERCISE ex08.ssp_server
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    ++clock_[worker];
  }
  changed_.notify_all();  // the slowest may have moved: everyone waiting looks again
  // END EXERCISE ex08.ssp_server
}

void Clocks::finish(int worker) {
  // BEGIN EXERCISE ex08.ssp_server
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    finished_[worker] = true;
  }
  changed_.notify_all();  // a worker that waited for this one may go on
  // END EXERCISE ex08.ssp_server
}

double Clocks::waited_seconds(int worker) const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return waited_[worker];
}

// ---- One server shard ------------------------------------------------------------------------

namespace {

// What a worker asks of a shard. The shard's thread answers requests one at a time, in the order
// they arrived: that order is what "the server's version" means.
struct Request {
  enum class Kind { Pull, Push, Drain, Stop } kind = Kind::Stop;
  int worker = 0;
  float* params = nullptr;        // Pull: the worker's flat parameters (the whole bucket)
  const float* grads = nullptr;   // Push: the worker's flat gradients (the whole bucket)
  mgpu::Event* ready = nullptr;   // Push: recorded on the worker after the gradient was made
  std::int64_t pulled = 0;        // Push: the version the gradient was computed on
  int batch_size = 0;             // Push: n, the whole batch the gradient is part of
  float lr = 0;
  int epoch = 0;
  bool count_bytes = true;                 // Pull: training (true) or evaluation
  std::promise<std::int64_t> answer;       // Pull: the version sent; Drain: done
};

}  // namespace

class ServerShard {
 public:
  ServerShard(int index, const Device& device, mgpu::Chunk range, const std::vector<float>& init_flat,
              std::vector<const Device*> workers, Mode mode, Clock::time_point start)
      : index_(index),
        device_(device),
        range_(range),
        mode_(mode),
        start_(start),
        workers_(std::move(workers)),
        master_(device, range.count),
        sum_(device, mode == Mode::Bsp ? range.count : 0),
        served_(device) {
    master_.upload(init_flat.data() + range.begin, range.count);
    if (mode == Mode::Bsp) sum_.zero();
    for (const Device* w : workers_) {
      staging_.emplace_back(device, range.count);
      pulled_.push_back(std::make_unique<mgpu::Event>(*w));  // belongs to the worker's device
    }
    thread_ = mgpu::start_thread("a server shard's thread", [this] { serve(); });
  }

  ~ServerShard() {
    Request stop;
    stop.kind = Request::Kind::Stop;
    post(std::move(stop));
    thread_.join();
    try {
      mgpu::synchronize(device_);  // queued copies may still use the staging buffers
    } catch (...) {                // a destructor must not throw
    }
  }

  void post(Request r) {
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(std::move(r));
    }
    request_arrived_.notify_one();
  }

  mgpu::Chunk range() const { return range_; }
  std::vector<float> download() { return master_.download(); }
  std::int64_t version() const {
    const std::lock_guard<std::mutex> lock(stats_mutex_);
    return version_;
  }
  std::vector<PushRecord> records() const {
    const std::lock_guard<std::mutex> lock(stats_mutex_);
    return records_;
  }
  Traffic traffic() const {
    const std::lock_guard<std::mutex> lock(stats_mutex_);
    return traffic_;
  }

 private:
  // The shard's thread: takes requests in order until Stop. After an error, every later request
  // that waits for an answer gets the error instead, so no worker waits forever.
  void serve() {
    mgpu::activate(device_);
    std::exception_ptr error;
    for (;;) {
      Request r = next_request();
      if (r.kind == Request::Kind::Stop) return;
      try {
        if (error) std::rethrow_exception(error);
        if (r.kind == Request::Kind::Pull) r.answer.set_value(answer_pull(r));
        if (r.kind == Request::Kind::Push) apply_push(r);
        if (r.kind == Request::Kind::Drain) {
          mgpu::synchronize(device_);
          r.answer.set_value(0);
        }
      } catch (...) {
        if (!error) error = std::current_exception();
        if (r.kind == Request::Kind::Pull || r.kind == Request::Kind::Drain) r.answer.set_exception(error);
      }
    }
  }

  Request next_request() {
    std::unique_lock<std::mutex> lock(mutex_);
    request_arrived_.wait(lock, [&] { return !queue_.empty(); });
    Request r = std::move(queue_.front());
    queue_.pop_front();
    return r;
  }

  // Copies this shard's master slice into the worker's parameters; returns the version sent.
  std::int64_t answer_pull(Request& r) {
    const Device& worker = *workers_.at(r.worker);
    const mgpu::Elements n{range_.count};
    // BEGIN EXERCISE ex08.ssp_server
    // The copy is queued on the worker's device: it must start after every update the server
    // has queued so far, and no later update may start before it has read the master.
    served_.record(device_);
    served_.make_wait(worker);
    mgpu::copy_peer(worker, r.params + range_.begin, device_, master_.data(), n);
    pulled_[r.worker]->record(worker);
    pulled_[r.worker]->make_wait(device_);
    // END EXERCISE ex08.ssp_server
    const std::lock_guard<std::mutex> lock(stats_mutex_);
    if (r.count_bytes) traffic_.pulled += static_cast<std::int64_t>(n.count * sizeof(float));
    return version_;
  }

  // Takes the worker's gradient slice into its staging buffer and updates the master: at once
  // (ASP, SSP), or once the step's k pushes are summed (BSP).
  void apply_push(Request& r) {
    const Device& worker = *workers_.at(r.worker);
    const mgpu::Elements n{range_.count};
    {
      const std::lock_guard<std::mutex> lock(stats_mutex_);
      traffic_.pushed += static_cast<std::int64_t>(n.count * sizeof(float));
      records_.push_back({r.worker, index_, r.epoch, r.pulled, version_, seconds_since(start_)});
    }
    const float* grad = r.grads + range_.begin;
    float* staging = staging_[r.worker].data();
    const auto count = static_cast<std::int64_t>(n.count);
    const float scale = r.lr / r.batch_size;  // lr * g_i / n: see "The learning rate of a push"
    std::int64_t version = version_;
    // BEGIN EXERCISE ex08.ssp_server
    r.ready->make_wait(device_);  // the gradient is made before the copy reads it
    mgpu::copy_peer(device_, staging, worker, grad, n);
    if (mode_ == Mode::Bsp) {
      mgpu::add_into(device_, sum_.data(), staging, count);
      if (++step_pushes_ < static_cast<int>(workers_.size())) return;  // not yet the whole step
      mgpu::sgd_update(device_, master_.data(), sum_.data(), count, scale);
      sum_.zero();
      step_pushes_ = 0;
    } else {
      mgpu::sgd_update(device_, master_.data(), staging, count, scale);
    }
    ++version;
    // END EXERCISE ex08.ssp_server
    const std::lock_guard<std::mutex> lock(stats_mutex_);
    version_ = version;
  }

  int index_;
  const Device& device_;
  mgpu::Chunk range_;
  Mode mode_;
  Clock::time_point start_;
  std::vector<const Device*> workers_;
  mgpu::Buffer<float> master_;                // [range.count]: this shard's slice of the parameters
  mgpu::Buffer<float> sum_;                   // [range.count]: BSP, the step's pushes summed so far
  std::vector<mgpu::Buffer<float>> staging_;  // [k][range.count]: each worker's last push
  mgpu::Event served_;                        // server device: "the updates queued so far"
  std::vector<std::unique_ptr<mgpu::Event>> pulled_;  // [k], worker i's device: "my pull has read"
  int step_pushes_ = 0;                       // BSP: pushes of the current step so far

  std::mutex mutex_;  // the request queue
  std::condition_variable request_arrived_;
  std::deque<Request> queue_;

  mutable std::mutex stats_mutex_;  // what other threads read: version, records, traffic
  std::int64_t version_ = 0;
  std::vector<PushRecord> records_;
  Traffic traffic_;

  std::thread thread_;  // last: starts once everything above is made
};

// ---- The server ------------------------------------------------------------------------------

ParameterServer::ParameterServer(const DeviceSet& devices, const std::vector<int>& server_devices,
                                 const std::vector<int>& worker_devices, const lenet::HostParams& init, Mode mode)
    : devices_(devices), worker_devices_(worker_devices) {
  if (server_devices.empty()) throw mgpu::Error("ParameterServer: needs at least one server shard");
  if (worker_devices.empty()) throw mgpu::Error("ParameterServer: needs at least one worker");
  // The initial parameters in the Flat layout, on the host: what every shard slices.
  lenet::Params flat = lenet::upload_params(devices[server_devices[0]], init, lenet::Layout::Flat);
  std::vector<float> init_flat(lenet::flat_count());
  mgpu::copy_bytes_to_host(devices[server_devices[0]], init_flat.data(), flat.flat(),
                           init_flat.size() * sizeof(float));
  std::vector<const Device*> workers;
  for (int w : worker_devices) {
    workers.push_back(&devices[w]);
    ready_.push_back(std::make_unique<mgpu::Event>(devices[w]));
  }
  const int s = static_cast<int>(server_devices.size());
  const Clock::time_point start = Clock::now();
  for (int j = 0; j < s; ++j) {
    const mgpu::Chunk range = mgpu::chunk_of(mgpu::Elements{init_flat.size()}, s, j);
    if (range.count == 0) throw mgpu::Error("ParameterServer: more shards than parameters");
    shards_.push_back(
        std::make_unique<ServerShard>(j, devices[server_devices[j]], range, init_flat, workers, mode, start));
  }
}

ParameterServer::~ParameterServer() {
  shards_.clear();  // each shard stops its thread; then the events its pushes used may go
  try {
    for (int w : worker_devices_) mgpu::synchronize(devices_[w]);  // pulls still copying
  } catch (...) {  // a destructor must not throw
  }
}

int ParameterServer::shards() const { return static_cast<int>(shards_.size()); }

std::vector<std::int64_t> ParameterServer::pull(int worker, lenet::Params& params, bool count_bytes) {
  if (params.layout() != lenet::Layout::Flat) throw mgpu::Error("ParameterServer::pull: parameters must be Flat");
  std::vector<std::future<std::int64_t>> answers;
  for (auto& shard : shards_) {  // ask every shard at once, then wait for all of them
    Request r;
    r.kind = Request::Kind::Pull;
    r.worker = worker;
    r.params = params.flat();
    r.count_bytes = count_bytes;
    answers.push_back(r.answer.get_future());
    shard->post(std::move(r));
  }
  std::vector<std::int64_t> versions;
  for (auto& a : answers) versions.push_back(a.get());  // rethrows a shard's error
  return versions;
}

void ParameterServer::push(int worker, const lenet::Params& grads, const std::vector<std::int64_t>& pulled,
                           int batch_size, float lr, int epoch) {
  if (grads.layout() != lenet::Layout::Flat) throw mgpu::Error("ParameterServer::push: gradients must be Flat");
  if (pulled.size() != shards_.size()) throw mgpu::Error("ParameterServer::push: one pulled version per shard");
  mgpu::Event& ready = *ready_.at(worker);
  ready.record(devices_[worker_devices_[worker]]);  // after the gradient's work, on the worker's stream
  for (std::size_t j = 0; j < shards_.size(); ++j) {
    Request r;
    r.kind = Request::Kind::Push;
    r.worker = worker;
    r.grads = grads.flat();
    r.ready = &ready;
    r.pulled = pulled[j];
    r.batch_size = batch_size;
    r.lr = lr;
    r.epoch = epoch;
    shards_[j]->post(std::move(r));
  }
}

void ParameterServer::drain() {
  std::vector<std::future<std::int64_t>> done;
  for (auto& shard : shards_) {
    Request r;
    r.kind = Request::Kind::Drain;
    done.push_back(r.answer.get_future());
    shard->post(std::move(r));
  }
  for (auto& d : done) d.get();
  for (int w : worker_devices_) mgpu::synchronize(devices_[w]);  // the pulls' copies
}

lenet::HostParams ParameterServer::download() {
  drain();
  std::vector<float> flat(lenet::flat_count());
  for (auto& shard : shards_) {
    const std::vector<float> part = shard->download();
    std::copy(part.begin(), part.end(), flat.begin() + shard->range().begin);
  }
  lenet::HostParams out;
  for (int t = 0; t < lenet::kParamTensors; ++t)
    out.emplace_back(flat.begin() + lenet::offset_of(t), flat.begin() + lenet::offset_of(t) + lenet::kParams[t].count);
  return out;
}

std::vector<PushRecord> ParameterServer::records() const {
  std::vector<PushRecord> all;
  for (const auto& shard : shards_) {
    const std::vector<PushRecord> r = shard->records();
    all.insert(all.end(), r.begin(), r.end());
  }
  return all;
}

std::vector<std::int64_t> ParameterServer::versions() const {
  std::vector<std::int64_t> v;
  for (const auto& shard : shards_) v.push_back(shard->version());
  return v;
}

Traffic ParameterServer::traffic() const {
  Traffic t;
  for (const auto& shard : shards_) {
    const Traffic s = shard->traffic();
    t.pulled += s.pulled;
    t.pushed += s.pushed;
  }
  return t;
}

// ---- Workers ---------------------------------------------------------------------------------

std::vector<WorkItem> epoch_work(int train_examples, int batch_size, int workers) {
  mgpu::check_batches_fit(train_examples, batch_size, workers);
  std::vector<WorkItem> items;
  for (int first = 0, b = 0; first < train_examples; first += batch_size, ++b) {
    const int n = std::min(batch_size, train_examples - first);
    int start = first;
    for (int size : mgpu::shard_sizes(n, workers)) {
      items.push_back({b, start, size, n});
      start += size;
    }
  }
  return items;
}

namespace {

// What every worker thread of one epoch shares.
struct EpochShared {
  ParameterServer& server;
  const std::vector<WorkItem>& items;
  const Settings& settings;
  int epoch;
  const std::function<float(int)>& lr_of;
  Clocks clocks;
  std::atomic<std::size_t> next{0};  // the next item nobody has taken
  std::atomic<std::size_t> done{0};  // items pushed
  std::atomic<bool> failed{false};   // a worker has failed: the others stop
  // How many workers have returned, so that the thread that started them can show the
  // epoch's progress while it waits, and stop waiting the moment the last one returns.
  std::mutex finished_mutex{};
  std::condition_variable finished_changed{};
  int finished = 0;
};

// Worker i's loop: wait for its turn, take the next item, pull, compute, push.
void work(int i, EpochShared& e, mgpu::DeviceData& data, dp::Replica& r, WorkerStats& stats) {
  const Device& d = *r.device;
  mgpu::activate(d);
  for (;;) {
    e.clocks.wait_turn(i);
    const std::size_t n = e.next++;
    if (n >= e.items.size() || e.failed) return;
    const WorkItem& w = e.items[n];
    const Clock::time_point began = Clock::now();
    // The pull returns once every shard has queued its copy; the work below queues after it.
    const std::vector<std::int64_t> versions = e.server.pull(i, r.params);
    mgpu::gather(d, data.images, data.order.data() + w.first, w.count, r.shard);
    r.grads.zero();
    lenet::accumulate_gradients(d, r.params, r.grads, r.lanes, r.shard.x.data(), r.shard.y.data(), w.count,
                                r.metrics);
    // The worker waits for its gradient before it pushes, as a worker process waits before it
    // sends a gradient over the network. (Pushing at once would be faster for this worker, but
    // the server's stream would then wait for the worker's compute, and every push and pull
    // queued behind it would wait too: one slow worker would stall the server for everyone.)
    mgpu::synchronize(d);
    if (i == e.settings.straggler && e.settings.slowdown > 1) {
      // A slower device: it takes `slowdown` times as long as this one did (a sleep, so that
      // it does not take the other workers' cores, as a slower GPU would not).
      const double extra = (e.settings.slowdown - 1) * seconds_since(began);
      std::this_thread::sleep_for(std::chrono::duration<double>(extra));
      stats.straggler_sleep_s += extra;
    }
    e.server.push(i, r.grads, versions, w.batch_size, e.lr_of(w.batch), e.epoch);
    e.clocks.tick(i);
    ++stats.items;
    ++e.done;
  }
}

}  // namespace

std::vector<WorkerStats> run_epoch(ParameterServer& server, std::vector<mgpu::DeviceData>& data,
                                   std::vector<dp::Replica>& replicas, const std::vector<WorkItem>& items,
                                   const Settings& settings, int epoch, const std::function<float(int)>& lr_of,
                                   const std::function<void(std::size_t done, std::size_t items)>& progress) {
  const int k = static_cast<int>(replicas.size());
  if (k != server.workers() || static_cast<int>(data.size()) != k)
    throw mgpu::Error("run_epoch: one DeviceData and one replica per worker of the server expected");
  const int bound = settings.mode == Mode::Bsp ? 0 : settings.mode == Mode::Ssp ? settings.staleness : -1;
  EpochShared shared{server, items, settings, epoch, lr_of, Clocks(k, bound)};
  std::vector<WorkerStats> stats(k);
  std::vector<std::exception_ptr> errors(k);
  std::vector<std::thread> threads;
  for (int i = 0; i < k; ++i) {
    try {
      threads.push_back(mgpu::start_thread("worker " + std::to_string(i) + "'s thread", [&, i] {
        try {
          work(i, shared, data[i], replicas[i], stats[i]);
        } catch (...) {
          errors[i] = std::current_exception();
          shared.failed = true;
        }
        shared.clocks.finish(i);  // done or failed: nobody waits for this worker any more
        {
          const std::lock_guard<std::mutex> lock(shared.finished_mutex);
          ++shared.finished;
        }
        shared.finished_changed.notify_one();
      }));
    } catch (...) {
      // The workers already running stop at their next piece of work and must be joined before
      // this function's state goes; those never started must not be waited for.
      shared.failed = true;
      for (int j = i; j < k; ++j) shared.clocks.finish(j);
      for (std::thread& t : threads) t.join();
      throw;
    }
  }
  // While the workers run, this thread shows their progress every 100 ms (it has nothing else
  // to do); it wakes at once when the last worker returns, so the epoch's time is not rounded up.
  {
    std::unique_lock<std::mutex> lock(shared.finished_mutex);
    while (!shared.finished_changed.wait_for(lock, std::chrono::milliseconds(100),
                                             [&] { return shared.finished == k; }))
      if (progress) progress(shared.done, items.size());
  }
  for (std::thread& t : threads) t.join();
  for (const std::exception_ptr& error : errors)
    if (error) std::rethrow_exception(error);
  server.drain();  // every push of the epoch applied
  for (int i = 0; i < k; ++i) stats[i].clock_wait_s = shared.clocks.waited_seconds(i);
  return stats;
}

}  // namespace ps
