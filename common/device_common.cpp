// The half of device.h that is the same in both builds: who a device is, which memory it owns,
// whose work an event marks, and the messages that say so. The backend's half (allocating,
// copying, streams, events) is device_cuda.cpp or device_cpu.cpp, whichever the build compiles;
// keeping the checks here means both builds refuse exactly the same things, in the same words.
#include "device_common.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <iterator>
#include <map>
#include <mutex>

namespace mgpu {

std::string Device::name() const { return gpu >= 0 ? "cuda:" + std::to_string(gpu) : "cpu"; }

std::string describe(const Device& d) { return "device " + std::to_string(d.index) + " (" + d.name() + ")"; }

void check_device_count(int k) {
  if (k < 1) throw Error("DeviceSet: need at least one device, got " + std::to_string(k));
}

void check_event_owner(const Device& owner) {
  if (owner.id < 0) throw Error("Event: " + describe(owner) + " was not made by a DeviceSet");
}

int next_device_id() {
  static std::atomic<int> next{0};
  return next++;
}

namespace {

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
// Bytes held and the peak since the last reset, per device id (under allocations_mutex).
std::map<int, DeviceMemory>& memory_by_device() {
  static auto* map = new std::map<int, DeviceMemory>;
  return *map;
}

// The allocation of `map` that holds `address`, or map.end().
std::map<std::uintptr_t, Allocation>::const_iterator holding(const std::map<std::uintptr_t, Allocation>& map,
                                                             std::uintptr_t address) {
  auto it = map.upper_bound(address);  // the first allocation starting after address
  if (it == map.begin()) return map.end();
  --it;
  return address < it->first + it->second.bytes ? it : map.end();
}

}  // namespace

void remember_allocation(const Device& d, void* p, std::size_t bytes) {
  const auto start = reinterpret_cast<std::uintptr_t>(p);
  const std::lock_guard<std::mutex> lock(allocations_mutex);
  allocations()[start] = Allocation{bytes, d};
  DeviceMemory& m = memory_by_device()[d.id];
  m.held += bytes;
  m.peak = std::max(m.peak, m.held);
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
  memory_by_device()[it->second.owner.id].held -= it->second.bytes;
  if (freed().size() >= kFreedRemembered) freed().clear();
  freed()[start] = it->second;
  allocations().erase(it);
}

DeviceMemory device_memory(const Device& d) {
  const std::lock_guard<std::mutex> lock(allocations_mutex);
  const auto it = memory_by_device().find(d.id);
  return it == memory_by_device().end() ? DeviceMemory{} : it->second;
}

void reset_device_memory_peaks() {
  const std::lock_guard<std::mutex> lock(allocations_mutex);
  for (auto& [id, m] : memory_by_device()) m.peak = m.held;
}

std::size_t peak_device_bytes() {
  const std::lock_guard<std::mutex> lock(allocations_mutex);
  std::size_t most = 0;
  for (const auto& [id, m] : memory_by_device()) most = std::max(most, m.peak);
  return most;
}

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

void DeviceSet::synchronize() const {
  for (const Device& d : devices_) mgpu::synchronize(d);
}

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

// Both builds: the stream has passed the mark once the device has done what came before it.
double Timestamp::seconds() const {
  if (!seconds_) throw Error("Timestamp::seconds before Timestamp::record");
  synchronize(device_);
  return *seconds_;
}

}  // namespace mgpu
