// The one interface every gradient sum in this repository implements: a collective is handed
// one buffer per device and leaves the element-wise sum in all of them. It knows nothing of the
// model: a trainer decides what to hand it (a whole flat gradient bucket, one tensor at a time,
// one layer's slice), a benchmark hands it test buffers. nccl-tests' harness treats its
// collectives the same way: every one fills the same few functions and the harness owns the rest.
//
//   chapter 02  dp::Allreduce           d2l's allreduce: sum on device 0, copy back
//   chapter 03  ring::RingAllreduce     reduce-scatter + all-gather around a ring
//   chapter 04  nccl::NcclAllreduce     ncclAllReduce from one process, one GPU per device
//   chapter 05  mp::MpiAllreduce, mp::NcclRankAllreduce   one process per device (this process's
//                                       one buffer), with start()/finish() for the overlap
//   chapter 06  mixed::Ring16Allreduce, mixed::Nccl16Allreduce   the same sums with 16 bits on the wire
#pragma once
#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include "common/device.h"

namespace mgpu {

// buffers[i] lives on the collective's i-th device. A collective between processes is handed
// this process's buffers only (chapter 05: one).
using DeviceBuffers = std::vector<float*>;

// Chunk c of n elements cut into k: n / k each, one more for the first n % k chunks (as
// shard_sizes, but a chunk may be empty: n may be smaller than k). How chapter 03's ring cuts a
// buffer (taught there), and chapter 06's 16-bit ring and chapter 08's server shards after it.
struct Chunk {
  std::size_t begin = 0, count = 0;
};
inline Chunk chunk_of(Elements n, int k, int c) {
  const std::size_t base = n.count / k, extra = n.count % k, uc = static_cast<std::size_t>(c);
  return Chunk{uc * base + std::min(uc, extra), base + (uc < extra ? 1 : 0)};
}

class Collective {
 public:
  virtual ~Collective() = default;
  Collective() = default;
  Collective(const Collective&) = delete;
  Collective& operator=(const Collective&) = delete;

  // A short name for tables, plots and file names: "naive", "ring", "nccl", "mpi", "ring16", ...
  virtual std::string name() const = 0;

  // Every buffers[i] (n floats) ends holding result_scale() times the element-wise sum over all
  // the buffers (and, between processes, over every process's). The sum is ready for the work
  // queued on each buffer's device after run() returns; a collective whose work is queued on the
  // devices' streams returns without waiting for it.
  virtual void run(const DeviceBuffers& buffers, Elements n) = 0;

  // 1 for a sum; 1/k for an average of k (NCCL's ncclAvg): a trainer's SGD step divides it out.
  virtual float result_scale() const { return 1.0f; }

  // The same sum in two halves, so that a trainer can start summing one slice of its gradients
  // while the next is still being computed (chapter 05's overlap): start() may return before
  // the slice is summed; after finish() every slice started since the last finish() is summed,
  // as run() would leave it. Slices must be started in the same order in every process. A
  // collective that only queues work on the devices' streams is already asynchronous: for it,
  // start() is run() and finish() has nothing to wait for.
  virtual void start(const DeviceBuffers& buffers, Elements n) { run(buffers, n); }
  virtual void finish() {}

  // Waits until device d has done all its queued work. A collective between processes watches
  // for its own errors meanwhile: a peer that failed must not leave this process waiting forever.
  virtual void synchronize(const Device& d) { mgpu::synchronize(d); }
};

}  // namespace mgpu
