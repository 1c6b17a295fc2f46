// What device.h declares: the only file that allocates, copies and synchronizes. Everything
// else goes through these functions. The first part is the same in both builds (who a device
// is, which memory it owns, whose work an event marks); then the cuda half and the cpu half.
#include "device.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>
#include <utility>

#include "profile.h"

#if !MGPU_CUDA
#include <omp.h>

#include <condition_variable>

#include "cpu_stream.h"
#endif

namespace mgpu {

std::string Device::name() const { return gpu >= 0 ? "cuda:" + std::to_string(gpu) : "cpu"; }

namespace {

// "device 1 (cuda:0)": how the checks below name a device.
std::string describe(const Device& d) { return "device " + std::to_string(d.index) + " (" + d.name() + ")"; }

// Every DeviceSet's devices get new ids, so devices of two sets never pass for each other.
int next_device_id() {
  static std::atomic<int> next{0};
  return next++;
}

// Which device owns each allocation: start address -> (size in bytes, owner). Both builds keep
// it, so the cpu build refuses a kernel or copy that would read another GPU's memory.
struct Allocation {
  std::size_t bytes;
  Device owner;
};
std::mutex allocations_mutex;
std::map<std::uintptr_t, Allocation>& allocations() {
  // Never destroyed: a buffer freed while the program exits must still find it.
  static auto* map = new std::map<std::uintptr_t, Allocation>;
  return *map;
}
// Allocations freed since their addresses were last handed out again: how a copy from a freed
// buffer is named as such rather than as "not any device's memory". Bounded: forgotten beyond.
std::map<std::uintptr_t, Allocation>& freed() {
  static auto* map = new std::map<std::uintptr_t, Allocation>;
  return *map;
}
constexpr std::size_t kFreedRemembered = 4096;

// The allocation of `map` that holds `address`, or map.end().
std::map<std::uintptr_t, Allocation>::const_iterator holding(const std::map<std::uintptr_t, Allocation>& map,
                                                             std::uintptr_t address) {
  auto it = map.upper_bound(address);  // the first allocation starting after address
  if (it == map.begin()) return map.end();
  --it;
  return address < it->first + it->second.bytes ? it : map.end();
}

void remember_allocation(const Device& d, void* p, std::size_t bytes) {
  const auto start = reinterpret_cast<std::uintptr_t>(p);
  const std::lock_guard<std::mutex> lock(allocations_mutex);
  allocations()[start] = Allocation{bytes, d};
  // The new allocation's addresses are live again: forget the freed ones it overlaps.
  auto& gone = freed();
  auto it = gone.lower_bound(start);
  if (it != gone.begin() && std::prev(it)->first + std::prev(it)->second.bytes > start) --it;
  while (it != gone.end() && it->first < start + bytes) it = gone.erase(it);
}

void forget_allocation(void* p) noexcept {
  const auto start = reinterpret_cast<std::uintptr_t>(p);
  const std::lock_guard<std::mutex> lock(allocations_mutex);
  auto it = allocations().find(start);
  if (it == allocations().end()) return;
  if (freed().size() >= kFreedRemembered) freed().clear();
  freed()[start] = it->second;
  allocations().erase(it);
}

}  // namespace

void check_owned(const Device& d, const void* p, std::size_t bytes, const char* call) {
  if (bytes == 0) return;
  const auto address = reinterpret_cast<std::uintptr_t>(p);
  const std::lock_guard<std::mutex> lock(allocations_mutex);
  const auto it = holding(allocations(), address);
  if (it == allocations().end()) {
    const auto was = holding(freed(), address);
    if (was != freed().end())
      throw Error(std::string(call) + ": " + describe(d) + " was given memory of a " +
                  std::to_string(was->second.bytes) + "-byte buffer of " + describe(was->second.owner) +
                  " that has been freed");
    throw Error(std::string(call) + ": " + describe(d) + " was given " + std::to_string(bytes) +
                " bytes that are not in any device's memory");
  }
  const auto& [start, a] = *it;
  if (a.owner.id != d.id)
    throw Error(std::string(call) + ": " + describe(d) + " touches memory of " + describe(a.owner) +
                "; work on a device may use only that device's memory (move data with copy_peer)");
  if (address + bytes > start + a.bytes)
    throw Error(std::string(call) + ": " + std::to_string(bytes) + " bytes from offset " +
                std::to_string(address - start) + " run past the end of a " + std::to_string(a.bytes) +
                "-byte buffer of " + describe(d));
}

DeviceSet::DeviceSet(int k) : DeviceSet(k, std::vector<int>{}, 0) {}

void Event::check_recorded(const char* call) const {
  if (!recorded_) throw Error(std::string("Event::") + call + " before Event::record");
}

void Event::record(const Device& d) {
  if (d.id != owner_.id)
    throw Error("Event::record: an event of " + describe(owner_) + " was recorded on " + describe(d) +
                "; an event marks only its own device's work (CUDA refuses an event and a stream of "
                "different GPUs)");
  queue_mark(d);
  recorded_ = true;
}

#if MGPU_CUDA

int gpu_count() {
  int n = 0;
  // No driver or no GPU is not an error here: it just means zero GPUs answer.
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky error so later calls start clean
    return 0;
  }
  return n;
}

DeviceSet::DeviceSet(int k, const std::vector<int>& wanted, int) {
  if (k < 1) throw Error("DeviceSet: need at least one device, got " + std::to_string(k));
  const int gpus = gpu_count();
  if (gpus == 0) throw Error("this is a cuda build but no GPU answers (cudaGetDeviceCount = 0); "
                             "configure with -DMGPU_BACKEND=cpu to run on the CPU");
  std::vector<int> use = wanted;
  if (use.empty())
    for (int g = 0; g < gpus; ++g) use.push_back(g);
  for (int g : use)
    if (g < 0 || g >= gpus)
      throw Error("DeviceSet: there is no GPU " + std::to_string(g) + " (" + std::to_string(gpus) + " answer)");
  for (int i = 0; i < k; ++i) {
    Device d;
    d.index = i;
    d.gpu = use[i % use.size()];
    d.id = next_device_id();
    MGPU_CHECK_CUDA(cudaSetDevice(d.gpu));
    MGPU_CHECK_CUDA(cudaStreamCreateWithFlags(&d.stream, cudaStreamNonBlocking));
    MGPU_CHECK_CUBLAS(cublasCreate(&d.blas));
    MGPU_CHECK_CUBLAS(cublasSetStream(d.blas, d.stream));
    devices_.push_back(d);
  }
}

DeviceSet::~DeviceSet() {
  for (Device& d : devices_) {  // destructors must not throw: errors here are ignored
    cudaSetDevice(d.gpu);
    cudaStreamSynchronize(d.stream);
    cublasDestroy(d.blas);
    cudaStreamDestroy(d.stream);
  }
}

void activate(const Device& d) { MGPU_CHECK_CUDA(cudaSetDevice(d.gpu)); }

void synchronize(const Device& d) {
  activate(d);
  MGPU_CHECK_CUDA(cudaStreamSynchronize(d.stream));
}

// cudaErrorNotReady only means "not yet", but the runtime may also keep it as the thread's
// last error, which the next kernel launch (Thrust checks cudaGetLastError) would then report
// as its own failure. Clear it, and nothing else.
static bool finished(cudaError_t status, const char* call, const char* file, int line) {
  if (status == cudaErrorNotReady) {
    if (cudaPeekAtLastError() == cudaErrorNotReady) (void)cudaGetLastError();
    return false;
  }
  check_cuda(status, call, file, line);
  return true;
}

bool idle(const Device& d) {
  activate(d);
  return finished(cudaStreamQuery(d.stream), "cudaStreamQuery(d.stream)", __FILE__, __LINE__);
}

void* device_allocate(const Device& d, std::size_t bytes) {
  if (bytes == 0) return nullptr;
  activate(d);
  void* p = nullptr;
  MGPU_CHECK_CUDA(cudaMalloc(&p, bytes));
  remember_allocation(d, p, bytes);
  return p;
}

void device_free(const Device& d, void* p) noexcept {
  if (!p) return;
  forget_allocation(p);
  cudaSetDevice(d.gpu);
  cudaFree(p);
}

void copy_bytes_to_device(const Device& d, void* dst, const void* host_src, std::size_t bytes) {
  if (bytes == 0) return;
  check_owned(d, dst, bytes, "copy_bytes_to_device");
  activate(d);
  MGPU_CHECK_CUDA(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, d.stream));
  // The host buffer may be freed as soon as we return: wait until the copy has read it.
  MGPU_CHECK_CUDA(cudaStreamSynchronize(d.stream));
}

void copy_bytes_to_host(const Device& d, void* host_dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  check_owned(d, src, bytes, "copy_bytes_to_host");
  activate(d);
  MGPU_CHECK_CUDA(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, d.stream));
  MGPU_CHECK_CUDA(cudaStreamSynchronize(d.stream));
}

void zero_bytes(const Device& d, void* p, std::size_t bytes) {
  if (bytes == 0) return;
  check_owned(d, p, bytes, "zero_bytes");
  activate(d);
  KernelProfile* profile = KernelProfile::of(d);
  const int call = profile ? profile->begin("memset", 0, double(bytes)) : -1;
  MGPU_CHECK_CUDA(cudaMemsetAsync(p, 0, bytes, d.stream));
  if (profile) profile->end(call);
}

void copy_bytes_peer(const Device& to, void* dst, const Device& from, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  check_owned(to, dst, bytes, "copy_peer (destination)");
  check_owned(from, src, bytes, "copy_peer (source)");
  activate(to);
  MGPU_CHECK_CUDA(cudaMemcpyPeerAsync(dst, to.gpu, src, from.gpu, bytes, to.stream));
}

void copy_bytes_to_host_async(const Device& d, void* host_dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  check_owned(d, src, bytes, "copy_bytes_to_host_async");
  activate(d);
  MGPU_CHECK_CUDA(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, d.stream));
}

void* host_allocate(std::size_t bytes) {
  if (bytes == 0) return nullptr;
  void* p = nullptr;
  MGPU_CHECK_CUDA(cudaMallocHost(&p, bytes));
  return p;
}

void host_free(void* p) noexcept {
  if (p) cudaFreeHost(p);  // waits for the copies that may still write it
}

int lanes_per_device(const Device&) { return 1; }

SideStream::SideStream(const Device& d) : device_(d) {
  activate(d);
  MGPU_CHECK_CUDA(cudaStreamCreateWithFlags(&device_.stream, cudaStreamNonBlocking));
  MGPU_CHECK_CUBLAS(cublasCreate(&device_.blas));
  MGPU_CHECK_CUBLAS(cublasSetStream(device_.blas, device_.stream));
}

SideStream::~SideStream() {  // no throwing here
  cudaSetDevice(device_.gpu);
  cudaStreamSynchronize(device_.stream);
  cublasDestroy(device_.blas);
  cudaStreamDestroy(device_.stream);
}

CapturedWork::CapturedWork(const Device& d, std::function<void()> queue_work) : device_(d) {
  activate(d);
  // Thread-local capture: only this thread's calls are checked (a cudaMalloc or a synchronize
  // inside queue_work is an error that names itself); other threads may use their GPUs meanwhile.
  MGPU_CHECK_CUDA(cudaStreamBeginCapture(d.stream, cudaStreamCaptureModeThreadLocal));
  cudaGraph_t graph = nullptr;
  try {
    queue_work();
  } catch (...) {
    cudaStreamEndCapture(d.stream, &graph);  // leave the stream usable, then report the error
    if (graph) cudaGraphDestroy(graph);
    throw;
  }
  MGPU_CHECK_CUDA(cudaStreamEndCapture(d.stream, &graph));
  const cudaError_t instantiated = cudaGraphInstantiate(&graph_, graph, 0);
  cudaGraphDestroy(graph);  // the executable graph keeps what it needs
  MGPU_CHECK_CUDA(instantiated);
}

CapturedWork::~CapturedWork() {
  if (graph_) cudaGraphExecDestroy(graph_);
}

void CapturedWork::replay() {
  activate(device_);
  MGPU_CHECK_CUDA(cudaGraphLaunch(graph_, device_.stream));
}

void Timestamp::record(const Device& d) {
  device_ = d;
  seconds_ = std::make_shared<double>(-1.0);
  // The host function gets its own reference to the slot: this Timestamp may be gone by then.
  auto* slot = new std::shared_ptr<double>(seconds_);
  activate(d);
  MGPU_CHECK_CUDA(cudaLaunchHostFunc(
      d.stream,
      [](void* p) {
        auto* s = static_cast<std::shared_ptr<double>*>(p);
        **s = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
        delete s;
      },
      slot));
}

Event::Event(const Device& owner) : owner_(owner) {
  if (owner.id < 0) throw Error("Event: " + describe(owner) + " was not made by a DeviceSet");
  activate(owner);  // a CUDA event belongs to the GPU that is current when it is created
  MGPU_CHECK_CUDA(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
}

void Event::queue_mark(const Device& d) {
  activate(d);
  MGPU_CHECK_CUDA(cudaEventRecord(event_, d.stream));
}

Event::~Event() {
  cudaSetDevice(owner_.gpu);
  cudaEventDestroy(event_);
}

void Event::make_wait(const Device& d) {
  check_recorded("make_wait");
  activate(d);
  MGPU_CHECK_CUDA(cudaStreamWaitEvent(d.stream, event_, 0));
}

bool Event::done() const {
  check_recorded("done");
  return finished(cudaEventQuery(event_), "cudaEventQuery(event_)", __FILE__, __LINE__);
}

void Event::synchronize() const {
  check_recorded("synchronize");
  MGPU_CHECK_CUDA(cudaEventSynchronize(event_));
}

std::string enable_peer_access(const DeviceSet& devices) {
  std::vector<int> gpus;  // the physical GPUs in use, each once
  for (int i = 0; i < devices.size(); ++i)
    if (std::find(gpus.begin(), gpus.end(), devices[i].gpu) == gpus.end()) gpus.push_back(devices[i].gpu);
  std::ostringstream out;
  out << "peer access (row reads column directly; '-' = same GPU, 'no' = staged through the host):\n     ";
  for (int g : gpus) out << " cuda:" << g;
  out << "\n";
  for (int a : gpus) {
    out << "cuda:" << a;
    for (int b : gpus) {
      if (a == b) {
        out << "      -";
        continue;
      }
      int can = 0;
      MGPU_CHECK_CUDA(cudaDeviceCanAccessPeer(&can, a, b));
      if (can) {
        MGPU_CHECK_CUDA(cudaSetDevice(a));
        const cudaError_t status = cudaDeviceEnablePeerAccess(b, 0);
        if (status == cudaErrorPeerAccessAlreadyEnabled) {
          (void)cudaGetLastError();  // enabled earlier in this process: fine
        } else if (status == cudaErrorTooManyPeers) {
          // A GPU can map at most 8 peers at once: beyond that, copies are staged by the driver.
          (void)cudaGetLastError();
          can = 0;
        } else {
          MGPU_CHECK_CUDA(status);
        }
      }
      out << (can ? "    yes" : "     no");
    }
    out << "\n";
  }
  if (gpus.size() == 1)
    out << "(all " << devices.size() << " devices share one GPU: every peer copy is a copy within it)\n";
  return out.str();
}

#else  // cpu backend: a device is host memory and a stream (common/cpu_stream.h)

int gpu_count() { return 0; }

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
  if (k < 1) throw Error("DeviceSet: need at least one device, got " + std::to_string(k));
  refuse_if_slurm_gave_gpus();
  // The cores are divided among the devices, as evenly as they go; every device gets at least one.
  const int cores = cpu_threads > 0 ? cpu_threads : omp_get_max_threads();
  for (int i = 0; i < k; ++i) {
    const int share = std::max(1, cores / k + (i < cores % k ? 1 : 0));
    Device d{i, -1, next_device_id()};
    streams_.push_back(std::make_unique<cpu::Stream>(share, static_cast<std::uint64_t>(d.id)));
    d.stream = streams_.back().get();
    devices_.push_back(d);
  }
}

DeviceSet::~DeviceSet() {
  for (const auto& s : streams_) s->wait_quietly();  // then each stream stops its worker
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

void* device_allocate(const Device& d, std::size_t bytes) {
  if (bytes == 0) return nullptr;
  void* p = host_allocate(bytes);
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
  // 64-byte alignment: one cache line, and what AVX-512 loads like best.
  const std::size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded);
  if (!p) throw Error("out of host memory allocating " + std::to_string(bytes) + " bytes");
  return p;
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
    : device_(d), stream_(std::make_unique<cpu::Stream>(1, static_cast<std::uint64_t>(d.id) + 0x5eed)) {
  device_.stream = stream_.get();
}

SideStream::~SideStream() { stream_->wait_quietly(); }

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
struct Event::Marks {
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

Event::Event(const Device& owner) : owner_(owner), marks_(std::make_shared<Marks>()) {
  if (owner.id < 0) throw Error("Event: " + describe(owner) + " was not made by a DeviceSet");
}

Event::~Event() = default;  // queued marks and waits keep marks_ alive

void Event::queue_mark(const Device& d) {
  std::uint64_t mark;
  {
    const std::lock_guard<std::mutex> lock(marks_->mutex);
    mark = ++marks_->recorded;
  }
  stream_of(d).submit_marker([marks = marks_, mark] {
    {
      const std::lock_guard<std::mutex> lock(marks->mutex);
      marks->passed = std::max(marks->passed, mark);
    }
    marks->changed.notify_all();
  });
}

void Event::make_wait(const Device& d) {
  check_recorded("make_wait");
  stream_of(d).submit_marker([marks = marks_, mark = marks_->last_recorded()] { marks->wait_for(mark); });
}

bool Event::done() const {
  check_recorded("done");
  const std::lock_guard<std::mutex> lock(marks_->mutex);
  return marks_->passed >= marks_->recorded;
}

void Event::synchronize() const {
  check_recorded("synchronize");
  marks_->wait_for(marks_->last_recorded());
}

std::string enable_peer_access(const DeviceSet& devices) {
  return "peer access: the " + std::to_string(devices.size()) +
         " devices share the host's memory; a peer copy is a memcpy queued on the destination device\n";
}

#endif

// Both builds: the stream has passed the mark once the device has done what came before it.
double Timestamp::seconds() const {
  if (!seconds_) throw Error("Timestamp::seconds before Timestamp::record");
  synchronize(device_);
  return *seconds_;
}

std::string DeviceSet::mapping() const {
  std::ostringstream out;
  for (const Device& d : devices_) {
    out << "device " << d.index << " -> " << d.name();
    if (d.gpu < 0) {
      const int threads = lanes_per_device(d);
      out << " (host memory, a stream and " << threads << " thread" << (threads > 1 ? "s" : "") << " of its own)";
    } else {
      // The first device placed on this GPU (round-robin or an explicit list, as chapter 05's).
      for (const Device& earlier : devices_) {
        if (earlier.index >= d.index) break;
        if (earlier.gpu == d.gpu) {
          out << " (shared with device " << earlier.index << ")";
          break;
        }
      }
    }
    out << "\n";
  }
#if !MGPU_CUDA
  // How the OpenMP threads wait at a barrier (common/openmp_waits.h: passive unless chosen).
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  out << "OpenMP threads wait at barriers: OMP_WAIT_POLICY=" << (policy ? policy : "(the runtime's default)") << "\n";
  if (kGpuMapping) out << "kernels cut as on a GPU, one call per output element (MGPU_GPU_MAPPING; slow, for tests)\n";
  if (const auto seed = cpu::chaos_seed())
    out << "chaos mode (MGPU_CHAOS=" << *seed << "): every queued operation starts after a random delay\n";
#endif
  return out.str();
}

void DeviceSet::synchronize() const {
  for (const Device& d : devices_) mgpu::synchronize(d);
}

}  // namespace mgpu
