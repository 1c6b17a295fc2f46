// How much memory a run may still allocate, asked before it allocates: a run that needs more than
// there is should say so, with the figures, not swap, be killed, or fail minutes in with a bare
// std::bad_alloc.
#pragma once
#include <cstddef>
#include <exception>
#include <string>

#include "device.h"

namespace mgpu {

// Bytes an allocation can get, and where the figure comes from (for messages).
struct MemoryAvailable {
  std::size_t bytes = 0;
  std::string source;
};

// Host memory: MemAvailable from /proc/meminfo (or else all physical memory), and no more than
// the address space this process may still map (RLIMIT_AS, what `ulimit -v` sets). A cgroup's
// own limit (a container's) is not looked at.
MemoryAvailable host_memory_available();

// GPU `gpu`'s free memory (cudaMemGetInfo). Cuda build only.
MemoryAvailable gpu_memory_available(int gpu);

// Why `devices` cannot each hold `bytes_per_device` more ("" if they can): devices that share a
// memory (every cpu device shares the host's; logical devices share their GPU's) need it
// together. `what` names the run in the message ("ResNet-18 at --width 512, 256 images a
// device"), `advice` says what to change.
std::string memory_refusal(const DeviceSet& devices, std::size_t bytes_per_device, const std::string& what,
                           const std::string& advice);

// OpenBLAS, the cpu build's matrix products, maps a buffer of about 128 MB for each product
// computing at once (one per call, whatever its threads; it reuses those it has), and about 256 MB
// as it starts; and Debian's OpenBLAS 0.3.21 retries a mapping that fails forever
// (OpenMathLib/OpenBLAS#5289): under an ulimit -v without room for them a program would hang.
// The sizes, measured on that OpenBLAS with VmSize:
inline constexpr std::size_t kBlasBufferBytes = std::size_t(136) << 20;   // one product's buffer, and its pages around
inline constexpr std::size_t kBlasStartupBytes = std::size_t(320) << 20;  // start-up's 256 MB, and a margin

// One product's claim on that room, for as long as it runs. Under a finite limit, a product that
// makes more products compute at once than ever before first asks for the room of one buffer
// more (by mapping it untouchable and giving it back), and where there is none throws
// mgpu::Error naming the room needed, the room left and what to do; behind that check a thread
// watches for a product stuck in OpenBLAS all the same (memory.cpp). Free where the address
// space is unlimited. common/gemm.cpp makes one around every product; the programs' start asks
// for kBlasStartupBytes (common/program.cpp).
class BlasRoom {
 public:
  BlasRoom();
  ~BlasRoom();
  BlasRoom(const BlasRoom&) = delete;
  BlasRoom& operator=(const BlasRoom&) = delete;

 private:
  bool counted_ = false;  // false where the address space is unlimited
};

// "12.3 GiB", "8192.0 MiB"
std::string gib(double bytes);
std::string mib(double bytes);

// What a failed allocation of `bytes` for `what` ("a buffer for cpu device 0") says: out of
// memory, how much was asked and how much this process could still get, and what to shrink.
// The cpu backend's device_allocate throws it (the cuda backend's names the GPU's free memory
// instead); error_text says the same for a bare std::bad_alloc.
std::string out_of_memory(const std::string& what, std::size_t bytes);

// What a program prints for an exception that ended it: its what(), but for std::bad_alloc,
// whose what() says only "std::bad_alloc", a sentence: out of memory, and how much this process
// could still get (host_memory_available: the machine's, or ulimit -v's, whichever is less).
std::string error_text(const std::exception& e);

}  // namespace mgpu
