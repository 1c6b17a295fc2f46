// The backend-specific half of device.h: the only file that allocates, copies and
// synchronizes. Everything else goes through these functions.
#include "device.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <sstream>

namespace mgpu {

std::string Device::name() const { return gpu >= 0 ? "cuda:" + std::to_string(gpu) : "cpu"; }

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

DeviceSet::DeviceSet(int k) {
  if (k < 1) throw Error("DeviceSet: need at least one device, got " + std::to_string(k));
  const int gpus = gpu_count();
  if (gpus == 0) throw Error("this is a cuda build but no GPU answers (cudaGetDeviceCount = 0); "
                             "configure with -DMGPU_BACKEND=cpu to run on the CPU");
  for (int i = 0; i < k; ++i) {
    Device d;
    d.index = i;
    d.gpu = i % gpus;
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

void* device_allocate(const Device& d, std::size_t bytes) {
  if (bytes == 0) return nullptr;
  activate(d);
  void* p = nullptr;
  MGPU_CHECK_CUDA(cudaMalloc(&p, bytes));
  return p;
}

void device_free(const Device& d, void* p) noexcept {
  if (!p) return;
  cudaSetDevice(d.gpu);
  cudaFree(p);
}

void copy_bytes_to_device(const Device& d, void* dst, const void* host_src, std::size_t bytes) {
  if (bytes == 0) return;
  activate(d);
  MGPU_CHECK_CUDA(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, d.stream));
  // The host buffer may be freed as soon as we return: wait until the copy has read it.
  MGPU_CHECK_CUDA(cudaStreamSynchronize(d.stream));
}

void copy_bytes_to_host(const Device& d, void* host_dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  activate(d);
  MGPU_CHECK_CUDA(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, d.stream));
  MGPU_CHECK_CUDA(cudaStreamSynchronize(d.stream));
}

void zero_bytes(const Device& d, void* p, std::size_t bytes) {
  if (bytes == 0) return;
  activate(d);
  MGPU_CHECK_CUDA(cudaMemsetAsync(p, 0, bytes, d.stream));
}

void copy_bytes_peer(const Device& to, void* dst, const Device& from, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  activate(to);
  MGPU_CHECK_CUDA(cudaMemcpyPeerAsync(dst, to.gpu, src, from.gpu, bytes, to.stream));
}

Event::Event() { MGPU_CHECK_CUDA(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming)); }
Event::~Event() { cudaEventDestroy(event_); }

void Event::record(const Device& d) {
  activate(d);
  MGPU_CHECK_CUDA(cudaEventRecord(event_, d.stream));
  gpu_ = d.gpu;
}

void Event::make_wait(const Device& d) {
  if (gpu_ < 0) throw Error("Event::make_wait before Event::record");
  activate(d);
  MGPU_CHECK_CUDA(cudaStreamWaitEvent(d.stream, event_, 0));
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
        if (status == cudaErrorPeerAccessAlreadyEnabled)
          (void)cudaGetLastError();  // enabled earlier in this process: fine
        else
          MGPU_CHECK_CUDA(status);
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

DeviceSet::DeviceSet(int k) {
  if (k < 1) throw Error("DeviceSet: need at least one device, got " + std::to_string(k));
  for (int i = 0; i < k; ++i) devices_.push_back(Device{i, -1});
}

DeviceSet::~DeviceSet() = default;

void activate(const Device&) {}
void synchronize(const Device&) {}  // cpu work is finished when the call returns

void* device_allocate(const Device&, std::size_t bytes) {
  if (bytes == 0) return nullptr;
  // 64-byte alignment: one cache line, and what AVX-512 loads like best.
  const std::size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded);
  if (!p) throw Error("out of host memory allocating " + std::to_string(bytes) + " bytes");
  return p;
}

void device_free(const Device&, void* p) noexcept { std::free(p); }

void copy_bytes_to_device(const Device&, void* dst, const void* host_src, std::size_t bytes) {
  if (bytes) std::memcpy(dst, host_src, bytes);
}

void copy_bytes_to_host(const Device&, void* host_dst, const void* src, std::size_t bytes) {
  if (bytes) std::memcpy(host_dst, src, bytes);
}

void zero_bytes(const Device&, void* p, std::size_t bytes) {
  if (bytes) std::memset(p, 0, bytes);
}

void copy_bytes_peer(const Device&, void* dst, const Device&, const void* src, std::size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
}

Event::Event() = default;
Event::~Event() = default;
void Event::record(const Device&) {}
void Event::make_wait(const Device&) {}

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
  return out.str();
}

void DeviceSet::synchronize() const {
  for (const Device& d : devices_) mgpu::synchronize(d);
}

}  // namespace mgpu
