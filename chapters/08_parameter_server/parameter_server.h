// Chapter 08: data-parallel training as it was done before allreduce won: a parameter server.
//
//   Server shards  s host threads, each owning one contiguous slice of LeNet's flat parameter
//                  bucket (its "master" copy) on a server device, with a queue of requests:
//                  pull (copy my slice to a worker) and push (take a worker's gradient, update).
//   Workers        k host threads, each driving one worker device: take a piece of work (one
//                  shard of one batch), pull the parameters, forward + backward, push the gradient.
//   Clocks         how far ahead of the slowest worker a worker may run: 0 steps (BSP), s steps
//                  (SSP), without limit (ASP).
//
// Versions and staleness. Each server shard counts the updates it has applied: its version. A
// pull answers with the version the worker got; a push carries it back. When the server applies
// the push, staleness = (its version then) - (the version the gradient was computed on): how
// many other updates landed while this worker was computing. BSP's is always 0; ASP's grows with
// k and with how uneven the workers are; SSP(s) bounds it (by (k-1)(2s+1), see Clocks).
//
// Everything that moves between devices is a peer copy ordered by events, as in chapter 02; the
// only new synchronization is on the host: the servers' request queues and the workers' clocks.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "../02_data_parallel/data_parallel.h"  // chapter 02's replicas: a worker is one
#include "common/cost_model.h"  // chapter 03's cost model: the server's traffic priced beside the ring's
#include "common/device.h"

namespace ps {

using mgpu::Device;
using mgpu::DeviceSet;

// ---- What the modes mean ---------------------------------------------------------------------
//   Bsp  bulk synchronous: the server waits for all k pushes of a step, sums them, steps once.
//        Every worker waits for the others before pulling: it is chapter 02's training.
//   Asp  asynchronous: the server applies each push as it arrives; nobody waits for anybody.
//   Ssp  stale synchronous: as Asp, but a worker more than `staleness` steps ahead of the
//        slowest waits for it.
enum class Mode { Bsp, Asp, Ssp };
std::string mode_name(Mode m);  // "bsp", "asp", "ssp"

// The learning rate of a push. A push holds the gradient summed over n_i examples of a batch of
// n; the server steps by lr * g_i / n (n the whole batch, not the shard). So the k pushes of one
// batch, applied one after another to fresh parameters, move the model as one BSP step does:
// ASP and SSP differ from BSP only by staleness and by applying the pieces one at a time.

// ---- The bytes a step moves ------------------------------------------------------------------
// One step = one batch, k workers. Every worker pulls the whole model (model_bytes) and pushes a
// whole gradient (model_bytes); the servers' links carry all of it. Each of s shards holds 1/s
// of the model, so its link carries 2k model_bytes / s per step. The ring of chapter 03 moves
// 2(k-1)/k model_bytes through each device's link.
double server_bytes_per_step(int workers, int servers, double model_bytes);  // through ONE shard's link
double ring_bytes_per_device(int workers, double model_bytes);
// Chapter 03's alpha-beta model, for one BSP step through the servers: each shard's link takes the
// k pushes in one after another, the shard adds them, then the link sends the k pulls out:
//   T = k (alpha + S/(sB))  +  k (alpha + S/(sA))  +  k (alpha + S/(sB))
// The bandwidth term 2k S/(sB) grows with k; the ring's 2(k-1)/k S/B does not.
double server_seconds(const cost::Interconnect& link, int workers, int servers, double model_bytes);

// One push as a server shard applied it.
struct PushRecord {
  int worker = 0;
  int shard = 0;            // which server shard applied it
  int epoch = 0;            // 1-based
  std::int64_t pulled = 0;  // the shard's version the gradient was computed on
  std::int64_t applied = 0; // the shard's version when the push was applied (before its update)
  double seconds = 0;       // when, since the server started
  std::int64_t staleness() const { return applied - pulled; }
};

// ---- Clocks: who may run ahead ---------------------------------------------------------------
// clock[i] = pushes worker i has made this epoch. wait_turn(i) blocks while worker i is more than
// `bound` steps ahead of the slowest worker still running (bound 0: BSP's barrier; bound < 0:
// never, ASP). A worker that runs out of work calls finish(), so nobody waits for it.
//
// Why (k-1)(2s+1) bounds SSP's staleness: when worker i (clock c) pulls, every other worker has
// made at least c - s pushes (or i could not have passed wait_turn); until i pushes, none can get
// past c + s + 1 (i is still at c). So at most 2s + 1 pushes of each of the k - 1 others land
// between i's pull and i's push.
class Clocks {
 public:
  Clocks(int workers, int bound);
  void wait_turn(int worker);  // blocks until `worker` may start its next step
  void tick(int worker);       // `worker` has pushed one more step
  void finish(int worker);     // `worker` takes no more steps: never wait for it
  double waited_seconds(int worker) const;  // time spent blocked in wait_turn

 private:
  std::int64_t slowest_running() const;  // with mutex_ held
  int bound_;
  std::vector<std::int64_t> clock_;
  std::vector<bool> finished_;
  std::vector<double> waited_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
};

// ---- The server ------------------------------------------------------------------------------

// Bytes that went through server shards: pulls out, pushes in (training only, not evaluation).
struct Traffic {
  std::int64_t pulled = 0, pushed = 0;
};

class ServerShard;  // parameter_server.cpp

// s shards on s server devices, holding LeNet's flat bucket split with mgpu::chunk_of (chapter 03's
// chunks: shard j holds elements [begin_j, begin_j + count_j) of lenet::flat_count()).
class ParameterServer {
 public:
  // `server_devices`: one index into `devices` per shard. `worker_devices`: worker i's index into
  // `devices`, k of them (BSP waits for k pushes per step). `init`: the starting parameters.
  ParameterServer(const DeviceSet& devices, const std::vector<int>& server_devices,
                  const std::vector<int>& worker_devices, const lenet::HostParams& init, Mode mode);
  ~ParameterServer();  // stops the shard threads (after their queued requests)
  ParameterServer(const ParameterServer&) = delete;
  ParameterServer& operator=(const ParameterServer&) = delete;

  int shards() const;
  int workers() const { return static_cast<int>(worker_devices_.size()); }
  // Worker i pulls the whole model into `params` (Flat, on worker i's device): every shard
  // queues its copy, ordered with events, and answers with its version. Blocks until every shard
  // has answered (the copies themselves are queued on the worker's device, not finished).
  // `count_bytes`: false for the pulls of evaluation, which are no part of training.
  std::vector<std::int64_t> pull(int worker, lenet::Params& params, bool count_bytes = true);
  // Worker i pushes `grads` (Flat, on its device; summed over its examples of a batch of
  // batch_size), computed on the versions `pulled`, from worker i's thread after the work that
  // makes the gradient is queued: push marks that point of the worker's stream with an event,
  // and the shards' copies wait for it. Returns at once; the shards apply it in turn. The worker
  // must not change `grads` until its next pull() has returned.
  void push(int worker, const lenet::Params& grads, const std::vector<std::int64_t>& pulled, int batch_size,
            float lr, int epoch);
  // Waits until every request so far is done (device work included); rethrows a shard's error.
  void drain();
  lenet::HostParams download();  // the master parameters, all shards (drains first)
  std::vector<PushRecord> records() const;  // every push applied so far, all shards
  std::vector<std::int64_t> versions() const;  // each shard's version
  Traffic traffic() const;

 private:
  const DeviceSet& devices_;
  std::vector<int> worker_devices_;
  // [k], worker i's device: "worker i's gradient is made". The server owns them: a push still
  // queued at a shard refers to its event after the worker has gone on (or finished).
  std::vector<std::unique_ptr<mgpu::Event>> ready_;
  std::vector<std::unique_ptr<ServerShard>> shards_;  // destroyed first: their threads use ready_
};

// ---- Training --------------------------------------------------------------------------------

struct Settings {
  Mode mode = Mode::Bsp;
  int staleness = 2;        // SSP's bound
  int straggler = -1;       // the slow worker, or -1
  double slowdown = 1.0;    // the straggler takes this many times as long per piece of work
};

// One piece of work: one shard of batch `batch` (of batch_size examples) = examples
// order[first .. first + count).
struct WorkItem {
  int batch = 0, first = 0, count = 0, batch_size = 0;
};
// An epoch's work: each batch cut into k pieces with chapter 02's shard_sizes, in batch order.
std::vector<WorkItem> epoch_work(int train_examples, int batch_size, int workers);

// What one worker did in one epoch.
struct WorkerStats {
  int items = 0;                 // pieces of work it computed
  double clock_wait_s = 0;       // blocked waiting for slower workers (Clocks::wait_turn)
  double straggler_sleep_s = 0;  // the extra time a straggler spends
};

// Runs one epoch: k worker threads take the items in order from a shared counter (a fast worker
// takes more of them; under BSP the barrier gives each worker exactly one per step), each
// pulling, computing on its replica, and pushing to `server`. data[i] and replicas[i] live on
// worker i's device; replicas must be Flat. `lr_of(batch)`: the rate of a batch's pushes.
// `progress`, when given, is called from this thread about every 100 ms while the workers run,
// with the items pushed so far and the epoch's item count.
std::vector<WorkerStats> run_epoch(ParameterServer& server, std::vector<mgpu::DeviceData>& data,
                                   std::vector<dp::Replica>& replicas, const std::vector<WorkItem>& items,
                                   const Settings& settings, int epoch, const std::function<float(int)>& lr_of,
                                   const std::function<void(std::size_t done, std::size_t items)>& progress = {});

}  // namespace ps
