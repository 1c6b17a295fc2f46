// Chapter 03's ring allreduce with the gradients on the wire in 16 bits: half the bytes.
//
// Every device turns its fp32 flat gradient bucket into 16-bit values (bf16 or fp16, the run's
// precision), the ring moves those, and every device turns the sum back into fp32. In the
// reduce-scatter each device adds an incoming chunk to its own copy of that chunk: both are
// converted to fp32, added, and the sum rounded to 16 bits once (add_encoded), so a chunk that
// goes round k devices is rounded k - 1 times on its way. That rounding is the accuracy cost
// (README: "16-bit gradients"); NCCL's bf16/fp16 sums round the same way, once per hop.
// PyTorch DDP's fp16_compress_hook / bf16_compress_hook do this exchange for DDP.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "../03_ring_allreduce/ring.h"  // chapter 03's ring and its chunks: the lesson is that ring in 16 bits
#include "common/collective.h"
#include "formats.h"

namespace mixed {

// A 16-bit exchange around any sum of 16-bit buffers: each data[i] (n fp32 values on
// devices[i]) encoded into wire[i] in `format` (bf16 or fp16), sum16 run on the wire buffers
// (it leaves the sum in every one), and the sum decoded back into data[i]. Ring16Allreduce is
// this around its ring (run16), Nccl16Allreduce around ncclAllReduce.
using Sum16 = std::function<void(const std::vector<std::uint16_t*>& wire)>;
void exchange16(const mgpu::DeviceSet& devices, Precision format, const std::vector<float*>& data,
                std::vector<mgpu::Buffer<std::uint16_t>>& wire, mgpu::Elements n, const Sum16& sum16);

class Ring16Allreduce : public mgpu::Collective {
 public:
  // `format`: BF16 or FP16. max_elements: the largest buffer run() will be given.
  Ring16Allreduce(const mgpu::DeviceSet& devices, Precision format, std::size_t max_elements);
  ~Ring16Allreduce() override;  // waits for the devices: queued copies may still use the buffers
  std::string name() const override { return "ring16"; }

  // data[i] (n fp32 values on devices[i]): afterwards every data[i] holds the sum, as it came
  // out of the 16-bit ring. Only queues work, as chapter 03's ring.
  void run(const std::vector<float*>& data, mgpu::Elements n) override;
  // The ring itself, on 16-bit values: wire[i] (n of them on devices[i]) ends holding the sum.
  void run16(const std::vector<std::uint16_t*>& wire, mgpu::Elements n);

 private:
  // One half of chapter 03's ring, k - 1 steps, on wire[i]'s 16-bit values, with its chunks and
  // its waits. add: the reduce-scatter, after which device i holds the complete sum of chunk
  // (i + 1) mod k (each incoming chunk added with add_encoded, through staging_[i]); otherwise
  // the all-gather, which passes those complete chunks round (each incoming chunk stored).
  void half(const std::vector<std::uint16_t*>& wire, mgpu::Elements n, bool add);
  void mark_ready();  // every device records its step_done_ event
  const mgpu::DeviceSet& devices_;
  Precision format_;
  std::size_t max_elements_;
  std::vector<mgpu::Buffer<std::uint16_t>> wire_;     // per device: its bucket in 16 bits
  std::vector<mgpu::Buffer<std::uint16_t>> staging_;  // per device: one incoming chunk
  std::vector<std::unique_ptr<mgpu::Event>> step_done_;
};

}  // namespace mixed
