// Summing the gradients over all ranks: the one collective of a training step, the chapter's
// one backend-specific place (besides rank_device.cpp). Both collectives are mgpu::Collectives
// (common/collective.h), each handed this rank's one buffer:
//
//   nccl (cuda build with NCCL): rank 0 makes an ncclUniqueId, MPI_Bcast hands it to every
//        rank, every rank joins with ncclCommInitRank; ncclAllReduce runs on the GPU.
//   mpi  (cpu build; cuda build with --collective mpi): MPI_Allreduce on host memory. The
//        gradients are staged through a host copy (device -> host, sum, host -> device), in
//        both builds the same way; on GPUs this also works for several ranks on one GPU,
//        where NCCL refuses to run.
//
// The gradients are chapter 03's flat bucket (lenet::Layout::Flat). BucketAllreduce hands it
// to the collective in one of two ways:
//   no overlap  backward computes every layer; finish(g) sums the whole bucket in one call.
//   overlap     backward calls start_layer(g, l) as soon as layer l is complete (3, then 2, 1,
//               0; lenet::GradientReady), which starts summing that slice of the bucket
//               without waiting (Collective::start); finish(g) then waits for the four sums
//               before the SGD step (Collective::finish). This is DDP's bucketed overlap, with
//               one bucket per layer.
#pragma once
#include <memory>
#include <string>

#include "../01_lenet/lenet.h"  // chapter 01's LeNet: its flat bucket, layer by layer
#include "common/collective.h"
#include "common/device.h"
#include "world.h"

namespace mp {

enum class CollectiveKind { Nccl, Mpi };
const char* collective_name(CollectiveKind c);  // "nccl" or "mpi"
bool nccl_available();                          // a cuda build that found NCCL

// Where layer l's two tensors (W, b) sit in the flat bucket: from offset_of(2l) to
// offset_of(2l + 2), the padding after each included.
struct Slice {
  std::size_t offset;
  mgpu::Elements count;
};
Slice layer_slice(int layer);

// One step's flat gradient bucket g summed over all ranks by `collective`: in one call, or
// layer by layer as backward completes them.
class BucketAllreduce {
 public:
  explicit BucketAllreduce(mgpu::Collective& collective) : collective_(collective) {}
  // Starts summing layer `layer`'s slice of g over all ranks and returns without waiting.
  // Layers must come 3, 2, 1, 0: every rank must start the same collectives in the same order.
  void start_layer(lenet::Params& g, int layer);
  // Afterwards every element of g is the sum over all ranks (for the work queued on the
  // device from now on): the started layers' sums finished, or, if none was started, the
  // whole bucket summed in one call.
  void finish(lenet::Params& g);
  mgpu::Collective& collective() { return collective_; }

 private:
  mgpu::Collective& collective_;
  int started_ = 0;  // layers started this step
};

// nccl where this build has NCCL, else mpi.
CollectiveKind default_collective();

// The collective a run uses. NCCL cannot run with two ranks on one GPU: when any rank shares
// its GPU, a default choice (explicitly = false) becomes mpi and *note says why, while an
// explicit --collective nccl is refused with the reason. Every rank must call it (the ranks
// decide together, so they never disagree).
CollectiveKind choose_collective(const World& w, CollectiveKind wanted, bool explicitly, int ranks_per_gpu,
                                std::string* note);

// Adds this chapter's collectives, for this rank of `w` on device d (which `ranks_per_gpu` ranks
// share), to a program's menu (common/collective.h): "mpi", and "nccl" (in a cuda build with
// NCCL; it refuses to be made on a shared GPU). w and d must outlive what the menu makes.
// The run's choice is made from collective_name(choose_collective(...)).
void add_collectives(mgpu::CollectiveMenu& menu, const World& w, const mgpu::Device& d, int ranks_per_gpu);

}  // namespace mp
