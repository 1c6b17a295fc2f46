// The cuda build's half of device.h: a device is a GPU's stream and a cuBLAS handle, memory is
// cudaMalloc's, and every copy, memset, event and graph is the CUDA runtime's own. The checks
// and the ownership table are in device_common.cpp, the same for both builds; CMake compiles
// this file only in the cuda build (device_cpu.cpp is the cpu build's half), so nothing here
// needs an #if.
#include <algorithm>
#include <chrono>
#include <memory>
#include <sstream>

#include "device_common.h"
#include "memory.h"  // gib, mib
#include "profile.h"

namespace mgpu {

// A CUDA stream on d's GPU and a cuBLAS handle bound to it, written into d.stream and d.blas.
// The destructor waits for the stream's work, then destroys both; it must not throw, so its
// errors are ignored.
class OwnedStream {
 public:
  explicit OwnedStream(Device& d) : gpu_(d.gpu) {
    MGPU_CHECK_CUDA(cudaSetDevice(gpu_));
    MGPU_CHECK_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    MGPU_CHECK_CUBLAS(cublasCreate(&blas_));
    MGPU_CHECK_CUBLAS(cublasSetStream(blas_, stream_));
    d.stream = stream_;
    d.blas = blas_;
  }
  ~OwnedStream() {
    cudaSetDevice(gpu_);
    cudaStreamSynchronize(stream_);
    cublasDestroy(blas_);
    cudaStreamDestroy(stream_);
  }
  OwnedStream(const OwnedStream&) = delete;
  OwnedStream& operator=(const OwnedStream&) = delete;

 private:
  int gpu_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
};

int gpu_count() {
  int n = 0;
  // No driver or no GPU is not an error here: it just means zero GPUs answer.
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky error so later calls start clean
    return 0;
  }
  return n;
}

std::vector<std::string> gpu_names() {
  std::vector<std::string> names;
  for (int gpu = 0; gpu < gpu_count(); ++gpu) {
    cudaDeviceProp p{};
    names.push_back(cudaGetDeviceProperties(&p, gpu) == cudaSuccess ? p.name : "unknown");
  }
  return names;
}

DeviceSet::DeviceSet(int k, const std::vector<int>& wanted, int) {
  check_device_count(k);
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
    streams_.push_back(std::make_unique<OwnedStream>(d));
    devices_.push_back(d);
  }
}

DeviceSet::~DeviceSet() = default;  // each OwnedStream waits for its stream, then destroys it

std::string DeviceSet::mapping() const {
  std::ostringstream out;
  for (const Device& d : devices_) {
    out << "device " << d.index << " -> " << d.name();
    // The first device placed on this GPU (round-robin or an explicit list, as chapter 05's).
    for (const Device& earlier : devices_) {
      if (earlier.index >= d.index) break;
      if (earlier.gpu == d.gpu) {
        out << " (shared with device " << earlier.index << ")";
        break;
      }
    }
    out << "\n";
  }
  return out.str();
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

int lanes_per_device(const Device&) { return 1; }

void* device_allocate(const Device& d, std::size_t bytes) {
  if (bytes == 0) return nullptr;
  activate(d);
  void* p = nullptr;
  const cudaError_t status = cudaMalloc(&p, bytes);
  if (status == cudaErrorMemoryAllocation) {  // said with the sizes, as the cpu build says it
    cudaGetLastError();                        // (not sticky: the next call must not see it)
    std::size_t free = 0, total = 0;
    cudaMemGetInfo(&free, &total);
    throw Error("out of memory on GPU " + std::to_string(d.gpu) + ": a buffer of " + mib(double(bytes)) +
                " for device " + std::to_string(d.index) + " could not be allocated; the GPU has " +
                gib(double(free)) + " free of " + gib(double(total)) +
                ": a smaller run (--batch-size, --width, fewer --devices on that GPU) needs less");
  }
  MGPU_CHECK_CUDA(status);
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

SideStream::SideStream(const Device& d) : device_(d), stream_(std::make_unique<OwnedStream>(device_)) {}

SideStream::~SideStream() = default;  // the OwnedStream waits for the stream's work

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
  check_event_owner(owner);
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

}  // namespace mgpu
