// Chapter 03: chapter 02's training with a faster allreduce. Trains LeNet on k devices
// (--devices, default 2) twice from the same start and the same batches: with chapter 02's
// allreduce, then with the ring over one flat gradient bucket; plots both curves; then times
// one step's allreduce three ways (per tensor, one flat bucket, ring).
//   build/bin/03_ring_allreduce [--devices 2] [--epochs 10] [-b 256] [--lr 0.2] ...
#include <cstdio>
#include <memory>
#include <vector>

#include "common/cli.h"  // parse_command_line: the flags every chapter shares
#include "common/device.h"  // DeviceSet, Buffer, Event: what a device is in either build
#include "common/program.h"  // start_program, load_data, run_or_report: what every program does
#include "compare.h"  // train_each, print_step_times: the ways to sum, side by side
#include "ring.h"  // RingAllreduce: reduce-scatter + all-gather around a ring

// One ring allreduce of LeNet's flat gradient bucket (129,216 floats), step by step, as the devices ran it: each
// device's span in each step. Spans of one step that overlap are copies proceeding at once.
void print_ring_timeline(const mgpu::DeviceSet& devices) {
  const int k = devices.size();
  if (k == 1) return;
  const std::size_t n = lenet::flat_count();
  std::vector<mgpu::Buffer<float>> buckets;
  std::vector<float*> data;
  for (int i = 0; i < k; ++i) {
    buckets.emplace_back(devices[i], n);
    buckets.back().zero();
    data.push_back(buckets.back().data());
  }
  ring::RingAllreduce ring(devices, n);
  ring.timeline(data, mgpu::Elements{n});  // a first run warms up (first touch of the buffers)
  const std::vector<ring::RingAllreduce::StepSpan> spans = ring.timeline(data, mgpu::Elements{n});
  std::printf("\none ring allreduce of the flat bucket as the devices ran it (ms from its start; each device "
              "copies in a chunk, and adds it in the reduce-scatter):\n");
  for (int step = 0; step < 2 * (k - 1); ++step) {
    std::printf("  step %d (%s)", step + 1, step < k - 1 ? "reduce-scatter" : "all-gather");
    for (const auto& s : spans)
      if (s.step == step) std::printf("  device %d %.3f-%.3f", s.device, s.began * 1e3, s.ended * 1e3);
    std::printf("\n");
  }
}

int main(int argc, char** argv) {
  mgpu::start_program(argv);  // first: line-buffered output; it may start the program again (see its header)
  const mgpu::ChapterInfo chapter{"03_ring_allreduce",
                                  "data-parallel LeNet with a ring allreduce over one flat gradient bucket",
                                  /*default_devices=*/2, /*max_devices=*/1024};
  const mgpu::Options o = mgpu::parse_command_line(argc, argv, chapter);
  return mgpu::run_or_report(chapter.name, [&] {
    const mgpu::DeviceSet devices(o.devices);
    std::printf("backend %s, %d logical devices\n%s%s", mgpu::kBackendName, o.devices, devices.mapping().c_str(),
                mgpu::enable_peer_access(devices).c_str());
    const mgpu::FashionMnist data = mgpu::load_data(o);

    // The three ways to sum one step's gradients, each made for these devices.
    mgpu::CollectiveMenu menu;
    dp::add_collectives(menu, devices);    // "naive"
    ring::add_collectives(menu, devices);  // "ring"
    const lenet::Layout per_tensor = lenet::Layout::PerTensor, flat = lenet::Layout::Flat;
    std::vector<ring::GradientSum> ways;
    ways.push_back({"chapter 02: 8 tensors via device 0", "naive", per_tensor,
                    menu.make("naive", dp::largest_gradient_sum(per_tensor))});
    ways.push_back({"chapter 02 allreduce, 1 flat bucket", "naive_flat", flat,
                    menu.make("naive", dp::largest_gradient_sum(flat))});
    ways.push_back({"ring, 1 flat bucket", "ring", flat, menu.make("ring", dp::largest_gradient_sum(flat))});

    // Train with the first and the last: the curves should match (same start, same batches).
    ring::train_each(devices, data, o, chapter, {&ways.front(), &ways.back()});
    ring::print_step_times(devices, data, o, ways);
    print_ring_timeline(devices);
    return 0;
  });
}
