// What device.h declares: the only file that allocates, copies and synchronizes. Everything
// else goes through these functions. The first part is the same in both builds (who a device
// is, which memory it owns, whose work an event marks); then the cuda half and the cpu half.
#include "device.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>

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

void remember_allocation(const Device& d, void* p, std::size_t bytes) {
  const std::lock_guard<std::mutex> lock(allocations_mutex);
  allocations()[reinterpret_cast<std::uintptr_t>(p)] = Allocation{bytes, d};
}

void forget_allocation(void* p) noexcept {
  const std::lock_guard<std::mutex> lock(allocations_mutex);
  allocations().erase(reinterpret_cast<std::uintptr_t>(p));
}

}  // namespace

void check_owned(const Device& d, const void* p, std::size_t bytes, const char* call) {
  if (bytes == 0) return;
  const auto address = reinterpret_cast<std::uintptr_t>(p);
  const std::lock_guard<std::mutex> lock(allocations_mutex);
  auto it = allocations().upper_bound(address);  // the first allocation starting after p
  const bool inside = it != allocations().begin() && address < std::prev(it)->first + std::prev(it)->second.bytes;
  if (!inside)
    throw Error(std::string(call) + ": " + describe(d) + " was given " + std::to_string(bytes) +
                " bytes that are not in any device's memory");
  const auto& [start, a] = *std::prev(it);
  if (a.owner.id != d.id)
    throw Error(std::string(call) + ": " + describe(d) + " touches memory of " + describe(a.owner) +
                "; work on a device may use only that device's memory (move data with copy_peer)");
  if (address + bytes > start + a.bytes)
    throw Error(std::string(call) + ": " + std::to_string(bytes) + " bytes from offset " +
                std::to_string(address - start) + " run past the end of a " + std::to_string(a.bytes) +
                "-byte buffer of " + describe(d));
}

DeviceSet::DeviceSet(int k) : DeviceSet(k, std::vector<int>{}) {}

void Event::check_recorded(const char* call) const {
  if (!recorded_) throw Error(std::string("Event::") + call + " before Event::record");
}

void Event::record(const Device& d) {
  if (d.id != owner_.id)
    throw Error("Event::record: an event of " + describe(owner_) + " was recorded on " + describe(d) +
                "; an event marks only its own device's work (CUDA refuses an event and a stream of "
                "different GPUs)");
#if MGPU_CUDA
  activate(d);
  MGPU_CHECK_CUDA(cudaEventRecord(event_, d.stream));
#endif
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

DeviceSet::DeviceSet(int k, const std::vector<int>& wanted) {
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
  MGPU_CHECK_CUDA(cudaMemsetAsync(p, 0, bytes, d.stream));
}

void copy_bytes_peer(const Device& to, void* dst, const Device& from, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  check_owned(to, dst, bytes, "copy_peer (destination)");
  check_owned(from, src, bytes, "copy_peer (source)");
  activate(to);
  MGPU_CHECK_CUDA(cudaMemcpyPeerAsync(dst, to.gpu, src, from.gpu, bytes, to.stream));
}

Event::Event(const Device& owner) : owner_(owner) {
  if (owner.id < 0) throw Error("Event: " + describe(owner) + " was not made by a DeviceSet");
  activate(owner);  // a CUDA event belongs to the GPU that is current when it is created
  MGPU_CHECK_CUDA(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
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

#else  // cpu backend: a device is a replica in host memory

int gpu_count() { return 0; }

DeviceSet::DeviceSet(int k, const std::vector<int>&) {
  if (k < 1) throw Error("DeviceSet: need at least one device, got " + std::to_string(k));
  for (int i = 0; i < k; ++i) devices_.push_back(Device{i, -1, next_device_id()});
}

DeviceSet::~DeviceSet() = default;

void activate(const Device&) {}
void synchronize(const Device&) {}  // cpu work is finished when the call returns
bool idle(const Device&) { return true; }

void* device_allocate(const Device& d, std::size_t bytes) {
  if (bytes == 0) return nullptr;
  // 64-byte alignment: one cache line, and what AVX-512 loads like best.
  const std::size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded);
  if (!p) throw Error("out of host memory allocating " + std::to_string(bytes) + " bytes");
  remember_allocation(d, p, bytes);
  return p;
}

void device_free(const Device&, void* p) noexcept {
  if (!p) return;
  forget_allocation(p);
  std::free(p);
}

void copy_bytes_to_device(const Device& d, void* dst, const void* host_src, std::size_t bytes) {
  if (bytes == 0) return;
  check_owned(d, dst, bytes, "copy_bytes_to_device");
  std::memcpy(dst, host_src, bytes);
}

void copy_bytes_to_host(const Device& d, void* host_dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  check_owned(d, src, bytes, "copy_bytes_to_host");
  std::memcpy(host_dst, src, bytes);
}

void zero_bytes(const Device& d, void* p, std::size_t bytes) {
  if (bytes == 0) return;
  check_owned(d, p, bytes, "zero_bytes");
  std::memset(p, 0, bytes);
}

void copy_bytes_peer(const Device& to, void* dst, const Device& from, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  check_owned(to, dst, bytes, "copy_peer (destination)");
  check_owned(from, src, bytes, "copy_peer (source)");
  std::memcpy(dst, src, bytes);
}

Event::Event(const Device& owner) : owner_(owner) {
  if (owner.id < 0) throw Error("Event: " + describe(owner) + " was not made by a DeviceSet");
}
Event::~Event() = default;
void Event::make_wait(const Device&) { check_recorded("make_wait"); }
bool Event::done() const {
  check_recorded("done");
  return true;
}
void Event::synchronize() const { check_recorded("synchronize"); }

std::string enable_peer_access(const DeviceSet& devices) {
  return "peer access: the " + std::to_string(devices.size()) +
         " devices are replicas in host memory; a peer copy is a memcpy\n";
}

#endif

std::string DeviceSet::mapping() const {
  std::ostringstream out;
  for (const Device& d : devices_) {
    out << "device " << d.index << " -> " << d.name();
    if (d.gpu < 0) {
      out << " (a replica in host memory)";
    } else {
      // Round-robin: the first device placed on this GPU is the one with index == gpu.
      if (d.index != d.gpu) out << " (shared with device " << d.gpu << ")";
    }
    out << "\n";
  }
#if !MGPU_CUDA
  // How the OpenMP threads wait at a barrier (common/openmp_waits.h: passive unless chosen).
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  out << "OpenMP threads wait at barriers: OMP_WAIT_POLICY=" << (policy ? policy : "(the runtime's default)") << "\n";
#endif
  return out.str();
}

void DeviceSet::synchronize() const {
  for (const Device& d : devices_) mgpu::synchronize(d);
}

}  // namespace mgpu
