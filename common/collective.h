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
//
// A program makes the collective its user names (--allreduce ring) from a CollectiveMenu (below):
// each chapter adds the collectives it teaches, by name, and the program asks for one.
#pragma once
#include <algorithm>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <utility>
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

// The collectives a program can make, by name: the one way every program makes one. Each chapter
// adds those it teaches, made for the devices (or, between processes, the rank) it is given:
//   dp::add_collectives      "naive"             chapter 02
//   ring::add_collectives    "ring"              chapter 03
//   nccl::add_collectives    "nccl", "nccl_avg"  chapter 04 (builds with NCCL)
//   mp::add_collectives      "mpi", "nccl"       chapter 05 (this process's one buffer)
//   mixed::add_collectives   "ring16", "nccl16"  chapter 06
// and the program chooses: menu.make("ring", elements).
class CollectiveMenu {
 public:
  // Makes the collective for buffers of up to max_elements elements (some need no staging and
  // ignore it).
  using Maker = std::function<std::unique_ptr<Collective>(std::size_t max_elements)>;
  // Throws mgpu::Error for a name already on the menu.
  void add(const std::string& name, Maker make);
  bool has(const std::string& name) const;
  // Throws mgpu::Error naming the collectives on the menu for a name that is not one of them.
  std::unique_ptr<Collective> make(const std::string& name, std::size_t max_elements) const;
  std::vector<std::string> names() const;  // in the order they were added

 private:
  std::vector<std::pair<std::string, Maker>> makers_;
};

}  // namespace mgpu
