#include "cost_model.h"

#include <algorithm>

#include "timer.h"
#include "vector_ops.h"

namespace cost {

std::vector<Interconnect> published_interconnects(double alpha_s) {
  return {
      // 64 GB/s is both directions together; an add reads two floats and writes one.
      {"PCIe Gen4 x16 (A100 80GB PCIe)", alpha_s, 32e9, 1935e9 / 3,
       "NVIDIA A100 datasheet: PCIe Gen4 64 GB/s (both directions), HBM2e 1,935 GB/s"},
      {"NVLink 4 + NVSwitch (H100 SXM5)", alpha_s, 450e9, 3350e9 / 3,
       "NVIDIA H100 datasheet: NVLink 900 GB/s (both directions), HBM3 3.35 TB/s"},
  };
}

double naive_seconds(const Interconnect& c, int k, double bytes) {
  if (k == 1) return 0;
  const double gather = (k - 1) * (c.alpha_s + bytes / c.link_bytes_s + c.alpha_s + bytes / c.add_bytes_s);
  const double broadcast = c.alpha_s + (k - 1) * bytes / c.link_bytes_s;  // device 0's link, shared
  return gather + broadcast;
}

double ring_seconds(const Interconnect& c, int k, double bytes) {
  if (k == 1) return 0;
  const double chunk = bytes / k;
  return 2 * (k - 1) * (c.alpha_s + chunk / c.link_bytes_s) + (k - 1) * (c.alpha_s + chunk / c.add_bytes_s);
}

double naive_seconds(const SharedMemory& m, int k, double bytes) {
  const double copy = m.copy_alpha_s + bytes * m.copy_s_per_byte, add = m.add_alpha_s + bytes * m.add_s_per_byte;
  return (k - 1) * (2 * copy + add);
}

double ring_seconds(const SharedMemory& m, int k, double bytes) {
  // Each step handles every chunk once, but skips empty ones: with fewer elements than devices
  // only that many chunks cost anything.
  const double chunks = std::min<double>(k, bytes / sizeof(float));
  const double chunk = bytes / k;
  const double copy = m.copy_alpha_s + chunk * m.copy_s_per_byte, add = m.add_alpha_s + chunk * m.add_s_per_byte;
  return chunks * (k - 1) * (2 * copy + add);
}

SharedMemory calibrate(const mgpu::DeviceSet& devices) {
  if (devices.size() < 2) throw mgpu::Error("cost::calibrate needs two devices");
  const mgpu::Device &a = devices[0], &b = devices[1];
  constexpr std::size_t kLarge = std::size_t(16) << 20;  // 64 MB of floats: far beyond any cache
  // x on device a is what b copies from; y and z are b's own. The model's add is the one a ring
  // step makes: on the receiving device, over two of its own buffers (y += z).
  mgpu::Buffer<float> x(a, kLarge), y(b, kLarge), z(b, kLarge);
  x.zero();
  y.zero();
  z.zero();
  devices.synchronize();  // the zeroing is queued on two devices: both must finish before timing
  mgpu::SyncTimer timer(devices);
  // Seconds per run of f: the mean of `reps` runs, and of 5 such trials the fastest (the
  // machine's other work can only make a trial slower).
  auto seconds = [&](int reps, auto f) {
    f();
    double best = 1e30;
    for (int trial = 0; trial < 5; ++trial) {
      timer.start();
      for (int i = 0; i < reps; ++i) f();
      best = std::min(best, timer.stop_seconds() / reps);
    }
    return best;
  };
  auto copy = [&](std::size_t n) { mgpu::copy_peer(b, y.data(), a, x.data(), mgpu::Elements{n}); };
  auto add = [&](std::size_t n) { mgpu::add_into(b, y.data(), z.data(), static_cast<std::int64_t>(n)); };

  SharedMemory m;
  m.copy_alpha_s = seconds(400, [&] { copy(1); });
  m.add_alpha_s = seconds(400, [&] { add(1); });
  const double bytes = kLarge * sizeof(float);
  m.copy_s_per_byte = std::max(0.0, seconds(2, [&] { copy(kLarge); }) - m.copy_alpha_s) / bytes;
  m.add_s_per_byte = std::max(0.0, seconds(2, [&] { add(kLarge); }) - m.add_alpha_s) / bytes;
  return m;
}

}  // namespace cost
