// The alpha-beta cost model of an allreduce of S bytes on k devices.
//
// Every transfer or add costs a fixed alpha (launching it, waiting for its turn) plus its
// bytes times a per-byte time beta = 1 / bandwidth. Two kinds of machine:
//
//   Links: each device has its own full-duplex link (bandwidth B each way) into a switch
//   that does not block (NVSwitch; a PCIe switch), and adds at its memory's speed A.
//     naive (chapter 02): device 0 receives k-1 buffers one after another on its one link
//       and adds each; then the k-1 others read the sum from device 0 over that same link:
//         T = (k-1)(alpha + S/B + alpha + S/A)  +  alpha + (k-1) S/B
//     ring: 2(k-1) steps, all links busy at once, each moving one chunk S/k; the first k-1
//       steps also add it:
//         T = 2(k-1)(alpha + S/(kB))  +  (k-1)(alpha + S/(kA))
//     The ring's bandwidth term is 2(k-1)/k * S/B, under 2 S/B for any k; the naive one
//     grows as 2(k-1) S/B. Both pay about 2(k-1) alphas (3(k-1) for the ring, with its adds).
//
//   Shared: the replicas live in one memory (the cpu build; several logical devices on one
//   GPU). Nothing runs in parallel across devices, so every operation is paid in full:
//     naive: (k-1) copies of S, (k-1) adds of S, (k-1) copies of S
//     ring:  k(k-1) adds and 2k(k-1) copies, each of S/k bytes (fewer when S/4 < k: empty
//            chunks are skipped)
//   The bytes are the same for both; the ring pays k times as many alphas. One memory cannot
//   show the ring's advantage: that needs links that can all be busy at once.
#pragma once
#include <string>
#include <vector>

#include "common/device.h"

namespace cost {

struct Interconnect {
  std::string name;       // "NVLink 4 + NVSwitch (H100 SXM5)"
  double alpha_s;         // seconds per transfer or add, whatever its size
  double link_bytes_s;    // B: bytes per second, each direction, per device
  double add_bytes_s;     // A: buffer bytes per second an add gets through (memory bandwidth / 3)
  std::string source;     // where B and the memory bandwidth come from
};

// The interconnects the README discusses, with their published figures.
std::vector<Interconnect> published_interconnects(double alpha_s);

double naive_seconds(const Interconnect& link, int k, double bytes);
double ring_seconds(const Interconnect& link, int k, double bytes);

// The shared-memory machine, with alpha and beta measured for copies and adds separately.
struct SharedMemory {
  double copy_alpha_s = 0, copy_s_per_byte = 0;
  double add_alpha_s = 0, add_s_per_byte = 0;
};
// Times single copies from device 0 to device 1 of `devices` and adds on device 1 over its own
// buffers (small ones for alpha, large ones for beta), and fits the model to them.
SharedMemory calibrate(const mgpu::DeviceSet& devices);

double naive_seconds(const SharedMemory& m, int k, double bytes);
double ring_seconds(const SharedMemory& m, int k, double bytes);

}  // namespace cost
