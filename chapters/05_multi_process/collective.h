// Summing the gradients over all ranks: the one collective of a training step, the chapter's
// one backend-specific place (besides rank_device.cpp).
//
//   nccl (cuda build with NCCL): rank 0 makes an ncclUniqueId, MPI_Bcast hands it to every
//        rank, every rank joins with ncclCommInitRank; ncclAllReduce runs on the GPU.
//   mpi  (cpu build; cuda build with --collective mpi): MPI_Allreduce on host memory. The
//        gradients are staged through a host copy (device -> host, sum, host -> device), in
//        both builds the same way; on GPUs this also works for several ranks on one GPU,
//        where NCCL refuses to run.
//
// The gradients are chapter 03's flat bucket (lenet::Layout::Flat). A step uses it in one of
// two ways:
//   no overlap  backward computes every layer; finish(g) sums the whole bucket in one call.
//   overlap     backward calls start_layer(g, l) as soon as layer l is complete (3, then 2, 1,
//               0; lenet::GradientReady), which starts summing that slice of the bucket
//               without waiting; finish(g) then waits for the four sums before the SGD step.
//               This is DDP's bucketed overlap, with one bucket per layer.
#pragma once
#include <functional>
#include <memory>
#include <string>

#include "../01_lenet/lenet.h"
#include "common/device.h"
#include "world.h"

namespace mp {

enum class Collective { Nccl, Mpi };
const char* collective_name(Collective c);  // "nccl" or "mpi"
bool nccl_available();                      // a cuda build that found NCCL

// Where layer l's two tensors (W, b) sit in the flat bucket: from offset_of(2l) to
// offset_of(2l + 2), the padding after each included.
struct Slice {
  std::size_t offset;
  mgpu::Elements count;
};
Slice layer_slice(int layer);

class GradientAllreduce {
 public:
  virtual ~GradientAllreduce() = default;
  GradientAllreduce() = default;
  GradientAllreduce(const GradientAllreduce&) = delete;
  GradientAllreduce& operator=(const GradientAllreduce&) = delete;

  // Starts summing layer `layer` of the bucket g over all ranks and returns without waiting.
  // Layers must come 3, 2, 1, 0: every rank must start the same collectives in the same order.
  void start_layer(lenet::Params& g, int layer);
  // Afterwards every element of g is the sum over all ranks. (NCCL: for the work queued on the
  // device's stream from now on, the host does not wait; MPI: the host waits for the sums.)
  void finish(lenet::Params& g);
  // Waits until the device has done all queued work, watching for errors of the collective.
  virtual void synchronize(const mgpu::Device& d) { mgpu::synchronize(d); }

  // Profiling (chapter 05's overlap timeline): the collective notes what its host thread did
  // and when (seconds on mgpu::steady_seconds' clock); an empty function (the usual case)
  // notes nothing. The MPI collective notes when each layer's sum starts and the wait for them.
  using HostNote = std::function<void(const std::string& what, double begin_s, double end_s)>;
  void note_with(HostNote note) { note_ = std::move(note); }

 protected:
  virtual void reduce_bucket(lenet::Params& g) = 0;  // all of g at once, in one call
  virtual void start(lenet::Params& g, int layer) = 0;  // non-blocking, one layer's slice
  virtual void wait_started(lenet::Params& g) = 0;  // all layers started this step are summed
  void note(const std::string& what, double begin_s, double end_s) const {
    if (note_) note_(what, begin_s, end_s);
  }

 private:
  int started_ = 0;  // layers started this step
  HostNote note_;
};

// nccl where this build has NCCL, else mpi.
Collective default_collective();

// The collective a run uses. NCCL cannot run with two ranks on one GPU: when any rank shares
// its GPU, a default choice (explicitly = false) becomes mpi and *note says why, while an
// explicit --collective nccl is refused with the reason. Every rank must call it (the ranks
// decide together, so they never disagree).
Collective choose_collective(const World& w, Collective wanted, bool explicitly, int ranks_per_gpu,
                            std::string* note);

// The collective `kind` for this rank of `w`, on device d (which `ranks_per_gpu` ranks share).
std::unique_ptr<GradientAllreduce> make_allreduce(Collective kind, const World& w, const mgpu::Device& d,
                                                  int ranks_per_gpu);

}  // namespace mp
