// A per-kernel profile of the work one device does: every kernel (for_each_index and
// for_each_span functors), GEMM and memset queued on the device's stream (not a SideStream's)
// while a KernelProfile for it is alive is timed, and table() groups the calls by name:
//
//   kernel            calls   time (us)   share   GFLOP/s    GB/s
//   gemm 50x648x500 NN    1       412.3    21.5%     78.6
//   Col2im                1        97.1     5.1%               27.4
//
// How a call is timed is backend-specific, and this is the one place that knows it:
//   cuda: a CUDA event is recorded on the device's stream before and after the kernel; the
//         GPU writes the two times when it gets there, so the host's launch time is not counted
//   cpu:  the device's worker reads the clock around the operation as it runs it. Lanes
//         (chapter 01) run at once on several cores, so their times add up to more than the
//         wall time of the step: the share column is a share of the work, not of the wall time.
// Profiling adds a little work per call (two events, or two clock reads): use it to find where
// the time goes, not to measure the step's speed.
#pragma once
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "device.h"

namespace mgpu {

struct KernelStats {
  std::string name;
  int calls = 0;
  double seconds = 0;  // summed over the calls
  double flops = 0;    // summed; 0 where not counted
  double bytes = 0;    // summed bytes read and written; 0 where not counted
};

class KernelProfile {
 public:
  explicit KernelProfile(const Device& d);  // starts timing d's kernels (one profile at a time)
  ~KernelProfile();                         // stops
  KernelProfile(const KernelProfile&) = delete;
  KernelProfile& operator=(const KernelProfile&) = delete;

  // Waits for d, then one row per kernel name, the longest total time first.
  std::vector<KernelStats> table();

  // For the code that queues kernels (parallel.h, gemm.cpp, device_cuda.cpp, device_cpu.cpp):
  // the profile timing d, or nullptr (the usual case: one comparison, nothing else).
  static KernelProfile* of(const Device& d);
  // cuda: begin() records the start event, end() the end event, around the launch.
  // cpu: begin() before queueing, then the worker calls took(call, seconds) as it runs it.
  int begin(const std::string& name, double flops, double bytes);
  void end(int call);
  void took(int call, double seconds);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// cpu backend: what the device's worker runs for a queued operation. Runs op(); when the
// operation is being profiled (profile != nullptr), reports how long it took as call `call`.
template <class Op>
void run_timed(KernelProfile* profile, int call, Op&& op) {
  if (!profile) {
    op();
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  op();
  profile->took(call, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
}

// The table, with each kernel's achieved GFLOP/s and GB/s, and every share of the total.
std::string format_profile(const std::vector<KernelStats>& rows);

// A kernel's name for the profile: its functor's type, without namespaces and without the
// wrapper for_each_span adds ("lenet::(anonymous namespace)::Im2col" -> "Im2col").
std::string kernel_name_of(const char* mangled_type_name);

}  // namespace mgpu
