// The cpu build's half of device.h: a device is host memory and a stream of its own, a worker
// thread that runs the device's queued work on its share of the cores (common/cpu_stream.h).
// Copies are memcpys queued on a stream, and an event is a count of marks that streams pass.
// The checks and the ownership table are in device_common.cpp, the same for both builds; CMake
// compiles this file only in the cpu build (device_cuda.cpp is the cuda build's half), so
// nothing here needs an #if.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <sstream>
#include <utility>

#include "cpu_stream.h"
#include "device_common.h"
#include "memory.h"  // out_of_memory
#include "profile.h"

namespace mgpu {

// A cpu::Stream, written into d.stream: a worker with `threads` OpenMP threads of its own. The
// destructor waits for the stream's work (dropping its errors: it must not throw), then the
// Stream's own destructor stops the worker.
class OwnedStream {
 public:
  OwnedStream(Device& d, int threads, std::uint64_t chaos_salt) : stream_(threads, chaos_salt) {
    d.stream = &stream_;
  }
  ~OwnedStream() { stream_.wait_quietly(); }
  OwnedStream(const OwnedStream&) = delete;
  OwnedStream& operator=(const OwnedStream&) = delete;

 private:
  cpu::Stream stream_;
};

int gpu_count() { return 0; }
std::vector<std::string> gpu_names() { return {}; }

namespace {

// A job that SLURM gave GPUs, running a cpu build: configured with `auto` on a machine where no
// GPU answers (a cluster's login node), the build chose the cpu backend, and the job would train
// on the CPUs beside its idle GPUs without a word. Refused, saying why and what to build.
void refuse_if_slurm_gave_gpus() {
  for (const char* name : {"SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "SLURM_GPUS_ON_NODE"}) {
    const char* value = std::getenv(name);
    if (value && *value && std::strcmp(value, "0") != 0)
      throw Error(std::string("this is a cpu build, and SLURM gave this job GPUs (") + name + "=" + value +
                  "): it would train on the CPUs beside them. Configure a build with -DMGPU_BACKEND=cuda (with "
                  "the default, auto, a machine where no GPU answers, such as a login node, makes a cpu build) "
                  "and run that");
  }
}

}  // namespace

DeviceSet::DeviceSet(int k, const std::vector<int>&, int cpu_threads) {
  check_device_count(k);
  refuse_if_slurm_gave_gpus();
  // The cores are divided among the devices, as evenly as they go; every device gets at least one.
  const int cores = cpu_threads > 0 ? cpu_threads : omp_get_max_threads();
  for (int i = 0; i < k; ++i) {
    const int share = std::max(1, cores / k + (i < cores % k ? 1 : 0));
    Device d{i, -1, next_device_id()};
    streams_.push_back(std::make_unique<OwnedStream>(d, share, static_cast<std::uint64_t>(d.id)));
    devices_.push_back(d);
  }
}

DeviceSet::~DeviceSet() = default;  // each OwnedStream runs what is queued, then stops its worker

std::string DeviceSet::mapping() const {
  std::ostringstream out;
  for (const Device& d : devices_) {
    const int threads = lanes_per_device(d);
    out << "device " << d.index << " -> " << d.name() << " (host memory, a stream and " << threads << " thread"
        << (threads > 1 ? "s" : "") << " of its own)\n";
  }
  // How the OpenMP threads wait at a barrier (common/openmp_waits.h: passive unless chosen).
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  out << "OpenMP threads wait at barriers: OMP_WAIT_POLICY=" << (policy ? policy : "(the runtime's default)") << "\n";
  if (kGpuMapping) out << "kernels cut as on a GPU, one call per output element (MGPU_GPU_MAPPING; slow, for tests)\n";
  if (const auto seed = cpu::chaos_seed())
    out << "chaos mode (MGPU_CHAOS=" << *seed << "): every queued operation starts after a random delay\n";
  return out.str();
}

cpu::Stream& cpu::stream_of(const Device& d) {
  if (!d.stream) throw Error(describe(d) + " was not made by a DeviceSet: it has no stream");
  return *d.stream;
}
using cpu::stream_of;

void activate(const Device&) {}
void synchronize(const Device& d) { stream_of(d).wait(); }
bool idle(const Device& d) { return stream_of(d).idle(); }
int lanes_per_device(const Device& d) { return stream_of(d).threads(); }

namespace {
// `bytes` on a 64-byte boundary (one cache line, and what AVX-512 loads like best), or an
// mgpu::Error saying that `what` could not be allocated, with the figures (out_of_memory).
void* aligned_or_refused(std::size_t bytes, const std::string& what) {
  void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (!p) throw Error(out_of_memory(what, bytes));
  return p;
}
}  // namespace

void* device_allocate(const Device& d, std::size_t bytes) {
  if (bytes == 0) return nullptr;
  void* p = aligned_or_refused(bytes, "a buffer for cpu device " + std::to_string(d.index));
  remember_allocation(d, p, bytes);
  return p;
}

void device_free(const Device&, void* p) noexcept {
  if (!p) return;
  forget_allocation(p);
  // A copy or kernel queued on any device may still read it (cudaFree waits for the GPU too).
  cpu::wait_for_all_streams();
  std::free(p);
}

void* host_allocate(std::size_t bytes) {
  if (bytes == 0) return nullptr;
  return aligned_or_refused(bytes, "a host buffer");
}

void host_free(void* p) noexcept {
  if (!p) return;
  cpu::wait_for_all_streams();  // an asynchronous copy may still write it
  std::free(p);
}

// Uploads and downloads are queued like everything else, and the host then waits for them:
// the host memory may be reused (or read) as soon as the call returns.
void copy_bytes_to_device(const Device& d, void* dst, const void* host_src, std::size_t bytes) {
  if (bytes == 0) return;
  check_owned(d, dst, bytes, "copy_bytes_to_device");
  stream_of(d).submit([=] { std::memcpy(dst, host_src, bytes); });
  stream_of(d).wait();
}

void copy_bytes_to_host(const Device& d, void* host_dst, const void* src, std::size_t bytes) {
  copy_bytes_to_host_async(d, host_dst, src, bytes);
  if (bytes > 0) stream_of(d).wait();
}

void copy_bytes_to_host_async(const Device& d, void* host_dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  check_owned(d, src, bytes, "copy_bytes_to_host");
  stream_of(d).submit([=] { std::memcpy(host_dst, src, bytes); });
}

void zero_bytes(const Device& d, void* p, std::size_t bytes) {
  if (bytes == 0) return;
  check_owned(d, p, bytes, "zero_bytes");
  KernelProfile* profile = KernelProfile::of(d);
  const int call = profile ? profile->begin("memset", 0, double(bytes)) : -1;
  stream_of(d).submit([=] { run_timed(profile, call, [&] { std::memset(p, 0, bytes); }); });
}

void copy_bytes_peer(const Device& to, void* dst, const Device& from, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  check_owned(to, dst, bytes, "copy_peer (destination)");
  check_owned(from, src, bytes, "copy_peer (source)");
  // Queued on the destination: it reads the source when `to` gets there, whatever `from` is
  // doing then. Only an event that `to` waits for makes that "after from's work".
  stream_of(to).submit([=] { std::memcpy(dst, src, bytes); });
}

SideStream::SideStream(const Device& d)
    : device_(d), stream_(std::make_unique<OwnedStream>(device_, 1, static_cast<std::uint64_t>(d.id) + 0x5eed)) {}

SideStream::~SideStream() = default;  // the OwnedStream waits for the stream's work

CapturedWork::CapturedWork(const Device& d, std::function<void()> queue_work)
    : device_(d), queue_work_(std::move(queue_work)) {}

CapturedWork::~CapturedWork() = default;

void CapturedWork::replay() { queue_work_(); }

void Timestamp::record(const Device& d) {
  device_ = d;
  seconds_ = std::make_shared<double>(-1.0);
  stream_of(d).submit_marker([slot = seconds_] {
    *slot = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  });
}

// An event's marks: record() queues mark number `recorded` on its device; the worker sets
// `passed` to it when it gets there. make_wait() captures the number recorded so far, as
// cudaStreamWaitEvent waits for the most recent record at the time of the call.
struct cpu::EventMarks {
  std::mutex mutex;
  std::condition_variable changed;
  std::uint64_t recorded = 0;  // host side: marks queued
  std::uint64_t passed = 0;    // device side: marks reached
  std::uint64_t last_recorded() {
    const std::lock_guard<std::mutex> lock(mutex);
    return recorded;
  }
  void wait_for(std::uint64_t mark) {
    std::unique_lock<std::mutex> lock(mutex);
    changed.wait(lock, [&] { return passed >= mark; });
  }
};

Event::Event(const Device& owner) : owner_(owner), event_(std::make_shared<cpu::EventMarks>()) {
  check_event_owner(owner);
}

Event::~Event() = default;  // the queued marks and waits keep the marks alive

void Event::queue_mark(const Device& d) {
  std::uint64_t mark;
  {
    const std::lock_guard<std::mutex> lock(event_->mutex);
    mark = ++event_->recorded;
  }
  stream_of(d).submit_marker([marks = event_, mark] {
    {
      const std::lock_guard<std::mutex> lock(marks->mutex);
      marks->passed = std::max(marks->passed, mark);
    }
    marks->changed.notify_all();
  });
}

void Event::make_wait(const Device& d) {
  check_recorded("make_wait");
  stream_of(d).submit_marker([marks = event_, mark = event_->last_recorded()] { marks->wait_for(mark); });
}

bool Event::done() const {
  check_recorded("done");
  const std::lock_guard<std::mutex> lock(event_->mutex);
  return event_->passed >= event_->recorded;
}

void Event::synchronize() const {
  check_recorded("synchronize");
  event_->wait_for(event_->last_recorded());
}

std::string enable_peer_access(const DeviceSet& devices) {
  return "peer access: the " + std::to_string(devices.size()) +
         " devices share the host's memory; a peer copy is a memcpy queued on the destination device\n";
}

}  // namespace mgpu
