// What a device is in the cpu build: a stream, as on a GPU. Only common/device_cpu.cpp,
// common/parallel.h, common/gemm.cpp (and the device tests) include this file; chapters never
// use it directly.
//
// Each cpu device has a worker thread that runs the device's queue of work in order, with its
// share of the machine's cores as OpenMP threads. Queuing a kernel, a copy, a memset, an event
// record or an event wait returns at once, as cudaLaunchKernel and cudaMemcpyAsync do; the
// host waits only where CUDA's host would (a synchronize, a download). So k cpu devices compute
// at the same time, and a missing event wait gives a wrong answer here as it does on GPUs.
//
// Chaos mode: with MGPU_CHAOS=<seed> in the environment, every queued operation (and every
// lane of a device's lanes) first sleeps a random 0-200 microseconds, drawn from the seed. Work
// that is ordered by events still comes out right; work that only happened to be in order
// usually does not. The tests run the multi-device suites under several seeds.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace mgpu::cpu {

// The seed of chaos mode, or nothing when MGPU_CHAOS is unset or empty. A value that is not a
// whole number throws mgpu::Error naming it. Read once per process.
std::optional<std::uint64_t> chaos_seed();

class Stream {
 public:
  // `threads`: the OpenMP threads this device's kernels and lanes use. `chaos_salt` makes the
  // delays of different streams differ under one seed.
  Stream(int threads, std::uint64_t chaos_salt);
  ~Stream();  // runs what is queued, then stops the worker; errors are dropped
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  // Queues work and returns (it blocks only while kMaxQueued operations are waiting, as a GPU's
  // launch queue fills). After a failed operation the stream skips further work, as a CUDA
  // context does after a kernel fault, until the host sees the error in wait().
  // Inside for_each_lane (see run_lanes) work is added to the lane being recorded instead.
  void submit(std::function<void()> work);
  // Queues an event's record or wait: it runs even after an error, so that no other device
  // waits forever for a mark that was skipped. Refused inside for_each_lane.
  void submit_marker(std::function<void()> mark);
  // The host waits until everything queued so far has run, then rethrows the stream's first
  // error (every later wait rethrows it too). Refused inside for_each_lane.
  void wait();
  void wait_quietly() noexcept;  // the same without rethrowing: for destructors
  bool idle() const;             // has everything queued so far run?
  int threads() const { return threads_; }

 private:
  struct State;
  State* state_;  // the queue, the worker and its error
  int threads_;
};

// for_each_lane's cpu half: record_lane(l) is called on the host for lane = 0..lanes-1, and the
// work it queues on `s` is kept per lane; then the lanes are queued on s as ONE operation, which
// runs them at once, one OpenMP thread each (inside a lane, kernels run on that thread alone).
// Nothing else may be queued, and no host wait may happen, while a lane is being recorded.
void run_lanes(Stream& s, int lanes, const std::function<void(int lane)>& record_lane);

// The host waits for every stream of every device in this process (a freed buffer may still be
// read by a queued copy on any device, as cudaFree waits for the GPU). Never throws.
void wait_for_all_streams() noexcept;

}  // namespace mgpu::cpu
