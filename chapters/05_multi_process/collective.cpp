#include "collective.h"

#include <exception>
#include <memory>
#include <thread>
#include <vector>

#include "common/check.h"
#include "common/exercise.h"  // the student copy's holes call mgpu::exercise_not_done
#if MGPU_CUDA && MGPU_HAVE_NCCL
#include "common/nccl.h"
#endif
#include "common/timer.h"
#include "common/trace.h"

namespace mp {

const char* collective_name(CollectiveKind c) { return c == CollectiveKind::Nccl ? "nccl" : "mpi"; }

bool nccl_available() {
#if MGPU_CUDA && MGPU_HAVE_NCCL
  return true;
#else
  return false;
#endif
}

Slice layer_slice(int layer) {
  // W and b are neighbours in the flat bucket: the slice runs from W's start to the next
  // layer's, the padding after each included (it stays zero: summing it costs a few floats).
  const std::int64_t begin = lenet::offset_of(2 * layer), end = lenet::offset_of(2 * layer + 2);
  return {static_cast<std::size_t>(begin), mgpu::Elements{static_cast<std::size_t>(end - begin)}};
}

namespace {

// The whole flat bucket: the 129,068 gradients and the alignment padding, 129,216 floats.
mgpu::Elements whole_bucket() { return mgpu::Elements{static_cast<std::size_t>(lenet::flat_count())}; }

}  // namespace

void BucketAllreduce::start_layer(lenet::Params& g, int layer) {
  if (layer != lenet::kLayers - 1 - started_)
    throw mgpu::Error("BucketAllreduce: layer " + std::to_string(layer) + " started out of order (expected " +
                      std::to_string(lenet::kLayers - 1 - started_) + ")");
  const Slice s = layer_slice(layer);
  const double begin = mgpu::steady_seconds();
  collective_.start({g.flat() + s.offset}, s.count);
  // The host's side of the overlap, for a traced step (mgpu::trace costs a test while nobody records).
  if (mgpu::tracing()) mgpu::trace("start_layer(" + std::to_string(layer) + ")", begin, mgpu::steady_seconds());
  ++started_;
}

void BucketAllreduce::finish(lenet::Params& g) {
  const int started = started_;
  started_ = 0;
  if (started != 0 && started != lenet::kLayers)
    throw mgpu::Error("BucketAllreduce: " + std::to_string(started) + " of " + std::to_string(lenet::kLayers) +
                      " layers were started before finish()");
  const double begin = mgpu::steady_seconds();
  if (started == 0)
    collective_.run({g.flat()}, whole_bucket());
  else
    collective_.finish();
  mgpu::trace("finish", begin, mgpu::steady_seconds());
}

namespace {

// This rank's one buffer: a collective between processes is handed exactly one per call.
float* only_buffer(const mgpu::DeviceBuffers& buffers, const char* who) {
  if (buffers.size() != 1)
    throw mgpu::Error(std::string(who) + ": one buffer per process expected, got " + std::to_string(buffers.size()));
  return buffers[0];
}

// --- mpi ----------------------------------------------------------------------------------
// MPI_Allreduce and MPI_Iallreduce, in place, on host memory. MPI makes progress on a
// non-blocking collective only inside MPI calls (there is no progress thread by default), so
// start() also tests the requests already started: each call lets MPI move them along.
class MpiRequests {
 public:
  void start_sum(const World& w, float* host, mgpu::Elements n) {
    requests_.emplace_back();
    MGPU_CHECK_MPI(MPI_Iallreduce(MPI_IN_PLACE, host, mpi_count(n), MPI_FLOAT, MPI_SUM, w.comm, &requests_.back()));
    int all_done = 0;
    MGPU_CHECK_MPI(MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &all_done, MPI_STATUSES_IGNORE));
  }
  void wait_all() {
    MGPU_CHECK_MPI(MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE));
    requests_.clear();
  }

 private:
  std::vector<MPI_Request> requests_;
};

void sum_now(const World& w, float* host, mgpu::Elements n) {
  MGPU_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, host, mpi_count(n), MPI_FLOAT, MPI_SUM, w.comm));
}

// MPI sums a host copy of the gradients (pinned on GPUs, so that copies to it are asynchronous).
// run(): copy it all down, sum, copy it back. With overlap, each started slice is copied down
// on a second stream as soon as backward has produced it (an event orders the copy after the
// layer's kernels, without the host waiting) into the next free part of the host copy, and its
// MPI_Iallreduce starts once the copy is done; finish() waits for the sums and copies each slice
// back up on the compute stream. The same code runs in both builds: a cpu device's work is
// queued too, so the host must wait for backward before MPI may read its gradients, exactly as
// on a GPU.
class MpiAllreduce : public mgpu::Collective {
 public:
  MpiAllreduce(const World& w, const mgpu::Device& d, std::size_t max_elements)
      : world_(w), device_(d), copier_(d), host_(max_elements) {}
  std::string name() const override { return "mpi"; }
  void synchronize(const mgpu::Device& d) override {
    mgpu::synchronize(copier_.device());
    mgpu::synchronize(d);
  }

  void run(const mgpu::DeviceBuffers& buffers, mgpu::Elements n) override {
    float* data = only_buffer(buffers, "MpiAllreduce");
    check_fits(0, n);
    mgpu::copy_bytes_to_host(device_, host_.data(), data, bytes(n));  // waits for backward
    sum_now(world_, host_.data(), n);
    mgpu::copy_bytes_to_device(device_, data, host_.data(), bytes(n));
  }
  void start(const mgpu::DeviceBuffers& buffers, mgpu::Elements n) override {
    float* data = only_buffer(buffers, "MpiAllreduce");
    const std::size_t used = slices_.empty() ? 0 : slices_.back().host_offset + slices_.back().count.count;
    check_fits(used, n);
    const std::size_t i = slices_.size();
    if (i == ready_.size()) {  // events of this rank's device (either stream may record them), kept for later steps
      ready_.push_back(std::make_unique<mgpu::Event>(device_));
      copied_.push_back(std::make_unique<mgpu::Event>(device_));
    }
    const mgpu::Device& copier = copier_.device();
    ready_[i]->record(device_);  // backward has queued this slice's kernels up to here
    ready_[i]->make_wait(copier);
    mgpu::copy_bytes_to_host_async(copier, host_.data() + used, data, bytes(n));
    copied_[i]->record(copier);
    slices_.push_back({data, used, n});
    start_copied(/*wait=*/false);
  }
  void finish() override {
    start_copied(/*wait=*/true);
    const double begin = mgpu::steady_seconds();
    requests_.wait_all();
    mgpu::trace("MPI_Waitall", begin, mgpu::steady_seconds());
    for (const SliceCopy& s : slices_)
      mgpu::copy_bytes_to_device(device_, s.device, host_.data() + s.host_offset, bytes(s.count));
    slices_.clear();
    summing_ = 0;
  }

 private:
  struct SliceCopy {
    float* device;            // where the slice lives on the device
    std::size_t host_offset;  // where its copy lives in host_
    mgpu::Elements count;
  };
  static std::size_t bytes(mgpu::Elements n) { return n.count * sizeof(float); }
  void check_fits(std::size_t used, mgpu::Elements n) const {
    if (used + n.count > host_.size())
      throw mgpu::Error("MpiAllreduce: " + std::to_string(used + n.count) + " floats exceed the " +
                        std::to_string(host_.size()) + " it was made for");
  }
  // Starts the MPI sums of the slices whose copy has arrived, in the order they were started
  // (every rank must issue them in the same order); with `wait`, waits for every copy.
  void start_copied(bool wait) {
    for (; summing_ < slices_.size(); ++summing_) {
      if (wait) {
        copied_[summing_]->synchronize();
      } else if (!copied_[summing_]->done()) {
        return;
      }
      const SliceCopy& s = slices_[summing_];
      const double begin = mgpu::steady_seconds();
      requests_.start_sum(world_, host_.data() + s.host_offset, s.count);
      mgpu::trace("MPI sum " + std::to_string(summing_ + 1) + " started", begin, mgpu::steady_seconds());
    }
  }

  World world_;
  mgpu::Device device_;
  mgpu::SideStream copier_;        // the same device, a second stream for the copies down
  mgpu::HostBuffer<float> host_;   // [max_elements]: the host copy of what is summed
  std::vector<SliceCopy> slices_;  // started since the last finish(), in order
  std::size_t summing_ = 0;        // slices_[0 .. summing_) have their MPI sum started
  std::vector<std::unique_ptr<mgpu::Event>> ready_, copied_;  // per slice: backward done, copy down done
  MpiRequests requests_;
};

// --- nccl ---------------------------------------------------------------------------------
#if MGPU_CUDA && MGPU_HAVE_NCCL

// The NCCL bootstrap: the 128 bytes every rank must pass to ncclCommInitRank, made once on
// rank 0 and sent to the others over MPI. Every rank must call it.
ncclUniqueId unique_id_from_rank0(const World& w) {
  // BEGIN EXERCISE ex05.bootstrap
  ncclUniqueId id{};
  if (w.rank == 0) MGPU_CHECK_NCCL(ncclGetUniqueId(&id));
  broadcast_from_rank0(w, &id, sizeof id);
  return id;
  // END EXERCISE ex05.bootstrap
}

// One NCCL communicator over all ranks, one GPU per rank. Without overlap, ncclAllReduce runs
// on the rank's compute stream after backward. With overlap, each layer's ncclAllReduce runs
// on a second stream as soon as an event says backward has produced it, while the compute
// stream goes on with the earlier layers; finish() makes the compute stream wait for the last
// sum, so the SGD step follows it, and the host never waits.
class NcclRankAllreduce : public mgpu::Collective {
 public:
  NcclRankAllreduce(const World& w, const mgpu::Device& d)
      : device_(d), comm_stream_(d), summed_(d), exceptions_before_(std::uncaught_exceptions()) {
    const ncclUniqueId id = unique_id_from_rank0(w);  // every rank must call this: it is an MPI_Bcast
    mgpu::activate(d);
    MGPU_CHECK_NCCL(ncclCommInitRank(&comm_, w.size, id, w.rank));
  }
  std::string name() const override { return "nccl"; }
  // When an error on this rank unwinds the stack, the other ranks may never join another
  // collective: waiting for them (ncclCommFinalize) could wait forever, so the communicator is
  // aborted instead, before main() reports the error and calls MPI_Abort.
  ~NcclRankAllreduce() override {  // no throwing here
    const bool unwinding = std::uncaught_exceptions() > exceptions_before_;
    cudaSetDevice(device_.gpu);
    if (comm_ && !unwinding) cudaStreamSynchronize(comm_stream_.device().stream);
    mgpu::close_communicator(comm_, unwinding);
  }  // then comm_stream_ waits for what is left on it and is destroyed
  // Polls rather than blocks, so that an error NCCL detects on its own (a network failure, a
  // peer that aborted) is reported instead of waited on forever.
  void synchronize(const mgpu::Device& d) override {
    wait_watching_nccl(comm_stream_.device());
    wait_watching_nccl(d);
  }

  void run(const mgpu::DeviceBuffers& buffers, mgpu::Elements n) override {
    mgpu::allreduce(comm_, device_, only_buffer(buffers, "NcclRankAllreduce"), n, ncclSum);
  }
  void start(const mgpu::DeviceBuffers& buffers, mgpu::Elements n) override {
    float* data = only_buffer(buffers, "NcclRankAllreduce");
    if (started_ == ready_.size()) ready_.push_back(std::make_unique<mgpu::Event>(device_));  // kept for later steps
    mgpu::Event& ready = *ready_[started_++];
    ready.record(device_);  // backward has queued this slice's kernels up to here
    ready.make_wait(comm_stream_.device());
    mgpu::allreduce(comm_, comm_stream_.device(), data, n, ncclSum);
  }
  void finish() override {
    summed_.record(comm_stream_.device());
    summed_.make_wait(device_);
    started_ = 0;
  }

 private:
  void wait_watching_nccl(const mgpu::Device& s) {
    while (!mgpu::idle(s)) {
      ncclResult_t async = ncclSuccess;
      MGPU_CHECK_NCCL_COMM(ncclCommGetAsyncError(comm_, &async), comm_);
      if (async != ncclSuccess) {
        // NCCL's advice: a communicator with an asynchronous error is aborted, not waited on.
        // The error is read (and thrown) first: it describes the communicator.
        try {
          MGPU_CHECK_NCCL_COMM(async, comm_);
        } catch (...) {
          mgpu::close_communicator(comm_, /*abort=*/true);
          throw;
        }
      }
      // Spin, giving the core away between polls. A sleep here would round every wait up to
      // its length, and the profile would time the sleep rather than the allreduce.
      std::this_thread::yield();
    }
  }

  mgpu::Device device_;
  mgpu::SideStream comm_stream_;  // the same GPU, the stream the overlapped sums run on
  ncclComm_t comm_ = nullptr;
  std::vector<std::unique_ptr<mgpu::Event>> ready_;  // per started slice: "its gradient is computed"
  std::size_t started_ = 0;                          // slices started since the last finish()
  mgpu::Event summed_;                               // "every started sum is done"
  int exceptions_before_;                          // std::uncaught_exceptions() when made
};

#endif  // MGPU_CUDA && MGPU_HAVE_NCCL

}  // namespace

CollectiveKind default_collective() { return nccl_available() ? CollectiveKind::Nccl : CollectiveKind::Mpi; }

CollectiveKind choose_collective(const World& w, CollectiveKind wanted, bool explicitly, int ranks_per_gpu,
                                std::string* note) {
  // BEGIN EXERCISE ex05.bootstrap
  // Decided together: one rank on a GPU of its own and another sharing one must still agree.
  const int most_sharing = static_cast<int>(max_over_ranks(w, ranks_per_gpu));
  if (wanted != CollectiveKind::Nccl || most_sharing <= 1) return wanted;
  const std::string why = std::to_string(most_sharing) +
                          " ranks share a GPU, and NCCL refuses two ranks of one communicator on one GPU";
  if (explicitly)
    throw mgpu::Error("--collective nccl: " + why + "; start at most one rank per GPU, or use --collective mpi");
  if (note) *note = why + ": the gradients are summed with MPI, staged through the host (one rank per GPU uses NCCL)";
  return CollectiveKind::Mpi;
  // END EXERCISE ex05.bootstrap
}

void add_collectives(mgpu::CollectiveMenu& menu, const World& w, const mgpu::Device& d, int ranks_per_gpu) {
  menu.add("mpi", [&w, &d](std::size_t max_elements) { return std::make_unique<MpiAllreduce>(w, d, max_elements); });
#if MGPU_CUDA && MGPU_HAVE_NCCL
  menu.add("nccl", [&w, &d, ranks_per_gpu](std::size_t) -> std::unique_ptr<mgpu::Collective> {
    // choose_collective() has already refused this for an explicit request; this is the last guard.
    if (ranks_per_gpu > 1)
      throw mgpu::Error(std::to_string(ranks_per_gpu) + " ranks share " + d.name() +
                        ", and NCCL refuses two ranks of one communicator on one GPU; start at most one rank per "
                        "GPU, or use --collective mpi");
    return std::make_unique<NcclRankAllreduce>(w, d);
  });
#else
  (void)ranks_per_gpu;
#endif
}

}  // namespace mp
