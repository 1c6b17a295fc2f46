// Devices and the memory that lives on them.
//
// A program asks for k logical devices. In the cuda build each is placed on a GPU,
// round-robin (logical i -> GPU i % gpu_count()), with its own stream and cuBLAS handle,
// so a machine with one GPU still runs 2- and 4-device code. In the cpu build a device is
// memory on the host and a stream of its own: a worker thread that runs the device's queued
// work in order, on the device's share of the cores (common/cpu_stream.h). Either way, a
// kernel or a copy is queued and the call returns at once; the host waits only in
// synchronize(), in downloads and uploads, and in Event::synchronize().
//
// Buffer<T> is an array of T on one device. Sizes are element counts everywhere; the
// only place that turns them into bytes is inside the functions declared here.
//
// One header, three files behind it: device_common.cpp holds what both builds do the same way
// (the table of which device owns which memory, the checks and their messages), and the build
// compiles one of device_cuda.cpp and device_cpu.cpp, the backend's half.
//
// Three of CUDA's rules are checked here in BOTH builds, so that the cpu build (which CI runs)
// refuses what would fail on GPUs:
//   - an Event belongs to one device and may be recorded only on that device's streams;
//   - a kernel or copy on device d touches only memory allocated on d (a peer copy reads its
//     source device's memory: that is what it is for). Memory moves between devices by
//     copy_peer, never by a kernel reading another device's buffer. (This repository never
//     lets one GPU's kernels read another's memory, even where peer access would allow it.)
//   - memory is used only while it is allocated: a copy from a freed buffer is refused, naming it.
// The checks cost one lookup in a table of allocations per copy, memset and GEMM (not per
// element): too little to measure, so they are always on.
#pragma once
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend.h"
#include "check.h"

namespace mgpu {

struct Device;

// What a device's handles are in each backend: the one place in this header that depends on the
// build. The classes below hold these types, so each of them reads the same in both builds.
#if MGPU_CUDA
using StreamHandle = cudaStream_t;    // a CUDA stream on the device's GPU
using BlasHandle = cublasHandle_t;    // cuBLAS, bound to that stream
using EventHandle = cudaEvent_t;      // a CUDA event, created on its device's GPU
using GraphHandle = cudaGraphExec_t;  // a recorded CUDA graph, ready to launch
#else
namespace cpu {
class Stream;       // common/cpu_stream.h: a queue of work and the worker thread that runs it
struct EventMarks;  // common/device_cpu.cpp: the marks an event queued and those passed
// d's stream; throws, naming d, for a device that no DeviceSet made (it has none).
Stream& stream_of(const Device& d);
}  // namespace cpu
using StreamHandle = cpu::Stream*;
using BlasHandle = std::nullptr_t;  // OpenBLAS takes no handle: there is never one
// Shared with the marks and waits queued on streams, which may run after the Event is gone.
using EventHandle = std::shared_ptr<cpu::EventMarks>;
using GraphHandle = std::nullptr_t;  // nothing is recorded: replay() queues the work again
#endif

struct Device {
  int index = 0;                  // logical device, 0..k-1
  int gpu = -1;                   // physical GPU ordinal (cuda build); -1 in the cpu build
  int id = -1;                    // unique in this process (DeviceSet assigns it): who owns an event or a buffer
  StreamHandle stream = nullptr;  // all of this device's work is queued here
  BlasHandle blas = nullptr;      // cuda: bound to `stream`; cpu: none
  std::string name() const;       // "cuda:0" or "cpu"
};

// A stream that a DeviceSet or a SideStream made and owns, and what `stream` and `blas` of its
// Device point to (cuda: a CUDA stream and a cuBLAS handle; cpu: a cpu::Stream). Each backend's
// file defines it; destroying one waits for the stream's work, then frees it.
class OwnedStream;

// GPUs that answer (always 0 in the cpu build).
int gpu_count();
// Their names, by ordinal ("NVIDIA H100 80GB HBM3"); none in the cpu build. For a run's record
// of the machine (report.h).
std::vector<std::string> gpu_names();

// Owns k logical devices: streams and handles are created here and destroyed with it.
class DeviceSet {
 public:
  // Logical device i on GPU i % gpu_count() (cuda build).
  explicit DeviceSet(int k);
  // Logical device i on GPU gpus[i % gpus.size()] (cuda build; chapter 05 gives each process
  // the one GPU its local rank picks). The cpu build ignores `gpus` and divides `cpu_threads`
  // cores among the k devices (0: all this process may use, omp_get_max_threads()); with more
  // devices than cores, each device gets one thread and they take turns, as GPUs shared do.
  DeviceSet(int k, const std::vector<int>& gpus, int cpu_threads = 0);
  ~DeviceSet();
  DeviceSet(const DeviceSet&) = delete;
  DeviceSet& operator=(const DeviceSet&) = delete;

  int size() const { return static_cast<int>(devices_.size()); }
  const Device& operator[](int i) const { return devices_.at(i); }
  const std::vector<Device>& all() const { return devices_; }  // devices 0 .. size() - 1
  // One line per logical device: "device 1 -> cuda:0 (shared with device 0)".
  std::string mapping() const;
  void synchronize() const;

 private:
  std::vector<Device> devices_;
  std::vector<std::unique_ptr<OwnedStream>> streams_;  // devices_[i].stream (and .blas)
};

void activate(const Device& d);     // make d current for the calls that follow (cudaSetDevice)
void synchronize(const Device& d);  // wait for all work queued on d
// Whether d has finished all work queued on it so far, without waiting (cudaStreamQuery).
bool idle(const Device& d);
// How many lanes of work device d runs at once: one per core of its share on a CPU, where each
// core works through its own chunks of a batch (see lenet::Lanes); one on a GPU, whose
// parallelism is inside each kernel.
int lanes_per_device(const Device& d);

// A second stream on a device (CUDA: another stream on the same GPU), for work that should not
// queue behind the device's main stream: chapter 05 copies gradients to the host on one while
// backward goes on. device() is the same device (same id, same memory, its events may be
// recorded there) with this stream. (cpu: a worker of its own with one thread, as a GPU's copy
// engine works beside its cores.) The destructor waits for the stream's work.
class SideStream {
 public:
  explicit SideStream(const Device& d);
  ~SideStream();
  SideStream(const SideStream&) = delete;
  SideStream& operator=(const SideStream&) = delete;
  const Device& device() const { return device_; }

 private:
  Device device_;
  std::unique_ptr<OwnedStream> stream_;  // device_.stream (and .blas)
};

// Throws, naming `call`, unless [p, p + bytes) lies inside one allocation made on d. Every
// copy below checks its pointers; kernels that take pointers check them too (add_into, gemm).
void check_owned(const Device& d, const void* p, std::size_t bytes, const char* call);

// How much device memory a run's buffers take, counted where every Buffer is allocated and freed
// (device_allocate, device_free): the bytes device d's buffers hold now, and the most they held at
// once since the last reset_device_memory_peaks(). It is what PyTorch's
// torch.cuda.max_memory_allocated() counts, tensors' bytes: not the CUDA context, not cuBLAS's
// own workspace, not what nvidia-smi shows (which adds those and the allocator's cache). The same
// count in both builds, so the cpu build measures what a run will ask of a GPU.
struct DeviceMemory {
  std::size_t held = 0, peak = 0;
};
DeviceMemory device_memory(const Device& d);
// Every device's peak becomes what it holds now: a run that starts measuring counts the buffers it
// already has (its model) and everything it allocates after.
void reset_device_memory_peaks();
// The largest peak of any one device since the last reset: what one device (one GPU, for a
// device alone on it) must hold for the run.
std::size_t peak_device_bytes();

// Untyped primitives behind Buffer<T>; `bytes` is always count * sizeof(T), computed there.
void* device_allocate(const Device& d, std::size_t bytes);
void device_free(const Device& d, void* p) noexcept;
void copy_bytes_to_device(const Device& d, void* dst, const void* host_src, std::size_t bytes);
void copy_bytes_to_host(const Device& d, void* host_dst, const void* src, std::size_t bytes);
// The same, queued: returns at once, and host_dst may be read only after an event recorded on d
// after this call is done (cuda: host_dst must be a HostBuffer, or the copy is not asynchronous).
void copy_bytes_to_host_async(const Device& d, void* host_dst, const void* src, std::size_t bytes);
void zero_bytes(const Device& d, void* p, std::size_t bytes);
// Queued on dst's stream: copies `bytes` from src (on device `from`) to dst (on device `to`).
// cuda: cudaMemcpyPeerAsync, direct over NVLink/PCIe where peer access is enabled, staged
// through the host by the driver where it is not. cpu: memcpy.
void copy_bytes_peer(const Device& to, void* dst, const Device& from, const void* src, std::size_t bytes);

// A count of elements. Copies between devices take one of these, never a byte count, so a
// call cannot confuse the two: bytes are computed in exactly one place, copy_peer().
struct Elements {
  std::size_t count;
};

// A point in one device's stream of work that other devices can wait for, so that devices
// are ordered with each other without the host waiting for any of them. An event belongs to
// the device it was made for (CUDA creates it on that GPU) and can mark only that device's
// work: record() on any other device is refused, in both builds. Any device may wait for it.
// (cpu: record queues a mark on the device's stream; make_wait queues, on the waiting device's
// stream, an operation that blocks that device's worker until the mark has been passed.)
class Event {
 public:
  explicit Event(const Device& owner);
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  // Marks "everything queued on d so far". d must be the owner (or the owner's device with
  // another stream, as chapter 05's copy and NCCL streams are).
  void record(const Device& d);
  void make_wait(const Device& d);  // work queued on d from now on starts after that mark
  bool done() const;                // has the marked work finished? (the host does not wait)
  void synchronize() const;         // the host waits for the marked work
 private:
  void check_recorded(const char* call) const;
  void queue_mark(const Device& d);  // the backend's half of record()
  Device owner_;
  bool recorded_ = false;
  EventHandle event_ = nullptr;  // cuda: the CUDA event; cpu: its marks
};

// When a device's stream reached a point of its queue, on the host's steady clock, so that the
// times of different devices can be compared and drawn on one timeline (chapter 02's profile).
// cpu: the worker reads the clock as it passes the mark; cuda: a host function queued on the
// stream (cudaLaunchHostFunc) does, so only profiling code should use it.
class Timestamp {
 public:
  void record(const Device& d);
  double seconds() const;  // waits for the mark; seconds on std::chrono::steady_clock
 private:
  Device device_{};
  std::shared_ptr<double> seconds_;  // written by the stream, when it passes the mark
};

// One device's work, recorded once and then queued again with one call: a CUDA graph. A
// training step of fixed shape queues the same few dozen kernels every time, and on a GPU each
// launch costs the host microseconds; captured as a graph, the whole step is one launch and the
// GPU runs its kernels back to back (chapter 01's README, "CUDA graphs").
//   cuda: stream capture. What `queue_work` queues on d's stream is recorded, not run
//         (cudaStreamBeginCapture ... EndCapture, cudaGraphInstantiate); replay() launches the
//         recorded graph on d's stream. Everything the work reads is fixed at capture: the same
//         buffers, the same scalars (a learning rate, a batch size).
//   cpu:  queueing costs no launch, so there is nothing to record: replay() calls queue_work
//         again. The same code runs on both backends and gives the same arithmetic.
// So queue_work must queue the same work every time it is called: it may capture values and
// buffers, never variables that change between replays.
class CapturedWork {
 public:
  CapturedWork(const Device& d, std::function<void()> queue_work);
  ~CapturedWork();
  CapturedWork(const CapturedWork&) = delete;
  CapturedWork& operator=(const CapturedWork&) = delete;
  void replay();  // queues the recorded work on d; the host does not wait
 private:
  Device device_;
  std::function<void()> queue_work_;  // cpu: what replay() calls
  GraphHandle graph_ = nullptr;       // cuda: what replay() launches
};

// Asks every pair of physical GPUs whether one can read the other's memory directly, enables
// peer access both ways wherever it is allowed, and returns the matrix as text to print.
std::string enable_peer_access(const DeviceSet& devices);

// Host memory that a device copies to and from asynchronously (cuda: page-locked with
// cudaMallocHost; cpu: ordinary aligned memory). Not a device's memory: kernels cannot use it.
void* host_allocate(std::size_t bytes);
void host_free(void* p) noexcept;

template <class T>
class HostBuffer {
 public:
  explicit HostBuffer(std::size_t count)
      : count_(count), data_(static_cast<T*>(host_allocate(count * sizeof(T)))) {}
  ~HostBuffer() { host_free(data_); }
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  T* data() { return data_; }
  std::size_t size() const { return count_; }

 private:
  std::size_t count_;
  T* data_;
};

template <class T>
class Buffer {
 public:
  Buffer() = default;
  Buffer(const Device& d, std::size_t count)
      : device_(d), count_(count), data_(static_cast<T*>(device_allocate(d, count * sizeof(T)))) {}
  ~Buffer() { device_free(device_, data_); }
  Buffer(Buffer&& o) noexcept { swap(o); }
  Buffer& operator=(Buffer&& o) noexcept {
    swap(o);
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  T* data() { return data_; }
  const T* data() const { return data_; }
  std::size_t size() const { return count_; }
  const Device& device() const { return device_; }

  void zero() { zero_bytes(device_, data_, count_ * sizeof(T)); }
  void upload(const T* host, std::size_t count) {
    if (count > count_) throw Error("Buffer::upload: " + std::to_string(count) +
                                    " elements do not fit in " + std::to_string(count_));
    copy_bytes_to_device(device_, data_, host, count * sizeof(T));
  }
  void upload(const std::vector<T>& host) { upload(host.data(), host.size()); }
  std::vector<T> download() const {
    std::vector<T> host(count_);
    copy_bytes_to_host(device_, host.data(), data_, count_ * sizeof(T));
    return host;
  }

 private:
  void swap(Buffer& o) noexcept {
    std::swap(device_, o.device_);
    std::swap(count_, o.count_);
    std::swap(data_, o.data_);
  }
  Device device_{};
  std::size_t count_ = 0;
  T* data_ = nullptr;
};

// Copies n elements from src on device `from` to dst on device `to`; queued on `to`.
template <class T>
void copy_peer(const Device& to, T* dst, const Device& from, const T* src, Elements n) {
  // n.count * sizeof(T): the one place a peer copy's element count becomes bytes.
  copy_bytes_peer(to, dst, from, src, n.count * sizeof(T));
}

}  // namespace mgpu
