// What chapter 08's suite and its hidden cases share: a server with its workers, driven step by
// step; a whole epoch of training through it; the flat parameter bucket on the host; and a
// watch on Clocks::wait_turn that tells whether it blocks.
#pragma once
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <vector>

#include "../chapters/08_parameter_server/parameter_server.h"
#include "helpers.h"

namespace testing {

// Whether wait_turn(worker) returns within `patience`. It runs on a thread of its own; when it
// blocks, `release` is called to let it go (so that the test ends either way). The patience is
// counted from when that thread has started: on a loaded machine a thread may take longer than
// the patience to start, and a wait released before it began would look like one that never blocked.
inline bool returns_within(ps::Clocks& clocks, int worker, std::chrono::milliseconds patience,
                           const std::function<void()>& release) {
  std::promise<void> started;
  std::future<void> f = std::async(std::launch::async, [&] {
    started.set_value();
    clocks.wait_turn(worker);
  });
  started.get_future().wait();
  const bool returned = f.wait_for(patience) == std::future_status::ready;
  if (!returned) release();
  f.get();
  return returned;
}

// s server devices, then k worker devices each with a Flat replica and the training set `set`.
struct Rig {
  Rig(int s, int k, ps::Mode mode, const mgpu::LabeledImages& set, int piece, const lenet::HostParams& init)
      : devices(s + k) {
    std::vector<int> servers, workers;
    for (int j = 0; j < s; ++j) servers.push_back(j);
    for (int i = 0; i < k; ++i) workers.push_back(s + i);
    for (int w : workers) {
      replicas.emplace_back(devices[w], init, piece, lenet::Layout::Flat);
      data.emplace_back(devices[w], set);
      std::vector<int> identity(set.count);
      for (int i = 0; i < set.count; ++i) identity[i] = i;
      data.back().order.upload(identity);
    }
    server = std::make_unique<ps::ParameterServer>(devices, servers, workers, init, mode);
  }
  ~Rig() { server.reset(); }  // before the replicas: its threads copy into them
  mgpu::DeviceSet devices;
  std::vector<dp::Replica> replicas;
  std::vector<mgpu::DeviceData> data;
  std::unique_ptr<ps::ParameterServer> server;
};

// LeNet's parameters as one flat bucket (lenet::offset_of's layout), the padding zero.
inline std::vector<float> flat_of(const lenet::HostParams& p) {
  std::vector<float> flat(lenet::flat_count(), 0.0f);
  for (int t = 0; t < lenet::kParamTensors; ++t)
    std::copy(p[t].begin(), p[t].end(), flat.begin() + lenet::offset_of(t));
  return flat;
}

// The parameters of a flat bucket, its padding set to zero (as flat_of leaves it): the server
// updates the padding like the rest, and nothing reads it.
inline std::vector<float> without_padding(const std::vector<float>& flat) {
  lenet::HostParams p;
  for (int t = 0; t < lenet::kParamTensors; ++t)
    p.emplace_back(flat.begin() + lenet::offset_of(t), flat.begin() + lenet::offset_of(t) + lenet::kParams[t].count);
  return flat_of(p);
}

// Worker i's flat gradients set to `g` (the padding too: the server updates it like the rest).
inline void set_gradient(dp::Replica& r, const std::vector<float>& g) {
  mgpu::copy_bytes_to_device(*r.device, r.grads.flat(), g.data(), g.size() * sizeof(float));
}

// How many elements of `got` differ from `want` by more than rtol relative (+ rtol absolute).
inline std::size_t count_far(const std::vector<float>& got, const std::vector<float>& want, float rtol) {
  std::size_t wrong = 0;
  for (std::size_t j = 0; j < want.size(); ++j)
    if (!(std::abs(got[j] - want[j]) <= rtol * (1 + std::abs(want[j])))) ++wrong;
  return wrong;
}

// `steps` batches of `batch` from `set` (in order 0, 1, 2, ...), through a server in `mode`.
struct EpochRun {
  lenet::HostParams params;
  std::vector<ps::PushRecord> records;
  std::vector<ps::WorkerStats> stats;
  ps::Traffic traffic;
  std::vector<std::int64_t> versions;
  double seconds = 0;
};
inline EpochRun run_steps(int s, int k, const ps::Settings& settings, const mgpu::LabeledImages& set, int batch,
                          int steps, float lr, std::uint64_t seed = 7) {
  const lenet::HostParams init = lenet::init_params(seed, 0.1f);
  Rig rig(s, k, settings.mode, set, mgpu::shard_sizes(batch, k)[0], init);
  const std::vector<ps::WorkItem> items = ps::epoch_work(batch * steps, batch, k);
  const auto start = std::chrono::steady_clock::now();
  EpochRun out;
  out.stats = ps::run_epoch(*rig.server, rig.data, rig.replicas, items, settings, 1, [lr](int) { return lr; });
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  out.params = rig.server->download();
  out.records = rig.server->records();
  out.traffic = rig.server->traffic();
  out.versions = rig.server->versions();
  return out;
}

// BSP on s shards and k workers, worker `straggler` slowed 16 times, `steps` steps of `batch`
// random images (drawn from `seed`): every worker does the same work, and every other worker
// spends most of the straggler's extra time waiting at the barrier.
//
// Why 16 times: with slowdown f, the straggler's compute C_s and a fast worker's C_i (summed
// over the steps), the fast worker waits f C_s - C_i at the barrier, and the straggler sleeps
// (f - 1) C_s. "Waits more than half the sleep" then holds while C_i < (f + 1) / 2 C_s. Batches
// this small compute in a millisecond or two, where a busy machine's scheduling can make one
// worker's compute 2.5 times another's (seen in CI with f = 3, whose margin is 2); f = 16 gives a
// margin of 8.5, for about 15 C_s of sleep (a fifth of a second here).
inline void check_bsp_waits_for_straggler(int s, int k, int straggler, int batch, int steps, std::uint64_t seed) {
  mgpu::Rng rng(seed);
  const mgpu::LabeledImages set = random_set(batch * steps, rng);
  ps::Settings settings;
  settings.straggler = straggler;
  settings.slowdown = 16;
  const EpochRun r = run_steps(s, k, settings, set, batch, steps, 0.1f);
  for (const ps::WorkerStats& w : r.stats) CHECK(w.items == steps);
  REQUIRE(r.stats[straggler].straggler_sleep_s > 0);
  for (int i = 0; i < k; ++i) {
    if (i == straggler) continue;
    CAPTURE(i);
    CHECK(r.stats[i].clock_wait_s > 0.5 * r.stats[straggler].straggler_sleep_s);  // waited at the barrier
  }
}

}  // namespace testing
