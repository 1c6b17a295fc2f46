// The plumbing every chapter's training shares: the epoch loop (common/train_loop.h), the
// probes a measured step is given (common/probe.h) and the menu collectives are made from
// (common/collective.h). A fake chapter stands in for a real one: it records what the loop
// hands it, so the loop's contract is checked without training anything.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <memory>
#include <string>
#include <vector>

#include "common/batches.h"
#include "common/check.h"
#include "common/collective.h"
#include "common/device.h"
#include "common/probe.h"
#include "common/timer.h"
#include "common/train_loop.h"
#include "common/vector_ops.h"
#include "captured_output.h"  // stdout_of
#if !MGPU_CUDA
#include "common/cpu_stream.h"  // a held device: work queued on its stream waits for a gate
#endif
#include "temp_dir.h"

namespace {

// What the loop told a fake chapter, in the order it told it.
struct Seen {
  std::vector<std::string> calls;  // "start 0", "step 0.3", "sync", "metrics", "test", "ended 1"
  std::vector<std::vector<int>> orders;  // each epoch's order
  std::vector<mgpu::BatchOf> batches;
};

// A chapter whose loss sum is 2 per example and which gets every second example right, and
// whose test accuracy is 0.5 + epoch / 100.
mgpu::EpochLoop fake_chapter(Seen& seen, int examples) {
  mgpu::EpochLoop loop;
  auto epoch_now = std::make_shared<int>(0);
  loop.start_epoch = [&seen, epoch_now](int epoch, const std::vector<int>& order) {
    *epoch_now = epoch;
    seen.calls.push_back("start " + std::to_string(epoch));
    seen.orders.push_back(order);
  };
  loop.step = [&seen](const mgpu::BatchOf& b) {
    seen.calls.push_back("step " + std::to_string(b.epoch) + "." + std::to_string(b.index));
    seen.batches.push_back(b);
  };
  loop.synchronize = [&seen] { seen.calls.push_back("sync"); };
  loop.train_metrics = [&seen, examples] {
    seen.calls.push_back("metrics");
    return mgpu::LossAndHits{2.0 * examples, examples / 2.0};
  };
  loop.test_accuracy = [&seen, epoch_now] {
    seen.calls.push_back("test");
    return 0.5 + *epoch_now / 100.0;
  };
  loop.epoch_ended = [&seen](const mgpu::EpochRecord& r) { seen.calls.push_back("ended " + std::to_string(r.epoch)); };
  return loop;
}

mgpu::Options options(int epochs, int batch_size) {
  mgpu::Options o;
  o.epochs = epochs;
  o.batch_size = batch_size;
  o.lr = 0.5f;
  o.seed = 7;
  return o;
}

}  // namespace

TEST_CASE("train_epochs: each epoch's order, then its batches in order, timed between two waits") {
  Seen seen;
  const mgpu::Options o = options(2, 40);
  const std::vector<mgpu::EpochRecord> records = mgpu::train_epochs(o, 100, 40, fake_chapter(seen, 100), nullptr);

  // Per epoch: wait, order, 3 steps (40 + 40 + 20), wait, metrics, test, ended.
  const std::vector<std::string> epoch0 = {"sync",     "start 0", "step 0.0", "step 0.1", "step 0.2",
                                           "sync",     "metrics", "test",     "ended 1"};
  REQUIRE(seen.calls.size() == 2 * epoch0.size());
  CHECK(std::equal(epoch0.begin(), epoch0.end(), seen.calls.begin()));
  CHECK(seen.calls[9 + 1] == "start 1");
  CHECK(seen.calls.back() == "ended 2");

  // The orders are ShuffledBatches' for this seed: the same as a chapter drawing them itself.
  mgpu::ShuffledBatches batches(100, 40, o.seed);
  for (int epoch = 0; epoch < 2; ++epoch) {
    batches.start_epoch(epoch);
    CHECK(seen.orders[epoch] == batches.order());
  }
  REQUIRE(seen.batches.size() == 6);
  CHECK(seen.batches[0].first == 0);
  CHECK(seen.batches[1].first == 40);
  CHECK(seen.batches[2].first == 80);
  CHECK(seen.batches[2].size == 20);  // the remainder
  for (const mgpu::BatchOf& b : seen.batches) CHECK(b.lr == 0.5f);

  REQUIRE(records.size() == 2);
  CHECK(records[0].epoch == 1);
  CHECK(records[1].epoch == 2);
  CHECK(records[0].train_loss == doctest::Approx(2.0));
  CHECK(records[0].train_acc == doctest::Approx(0.5));
  CHECK(records[0].test_acc == doctest::Approx(0.5));
  CHECK(records[1].test_acc == doctest::Approx(0.51));
  CHECK(records[0].seconds >= 0);
}

TEST_CASE("train_epochs: warm-up rates, a resumed start, a process's time made the run's") {
  Seen seen;
  mgpu::Options o = options(3, 50);
  o.warmup_epochs = 2;
  mgpu::EpochLoop loop = fake_chapter(seen, 100);
  loop.epoch_seconds = [](double) { return 42.0; };  // as chapter 05's slowest rank
  const std::vector<mgpu::EpochRecord> records = mgpu::train_epochs(o, 100, 50, loop, nullptr, /*first_epoch=*/1);

  REQUIRE(records.size() == 2);  // epochs 2 and 3 of 3
  CHECK(records[0].epoch == 2);
  CHECK(records[0].seconds == 42.0);
  REQUIRE(seen.batches.size() == 4);
  CHECK(seen.batches[0].epoch == 1);
  for (const mgpu::BatchOf& b : seen.batches)
    CHECK(b.lr == mgpu::learning_rate_at(o, b.epoch, b.index, 2));
  CHECK(seen.batches[0].lr < o.lr);   // still warming up in epoch 1
  CHECK(seen.batches[3].lr == o.lr);  // done by epoch 2
}

TEST_CASE("train_epochs: a chapter that walks its batches itself (run_epoch) reports its progress") {
  Seen seen;
  mgpu::EpochLoop loop = fake_chapter(seen, 100);
  loop.step = nullptr;
  int epochs_run = 0;
  loop.run_epoch = [&](int epoch, const mgpu::ShuffledBatches& batches, const std::function<void(int)>& progress) {
    CHECK(epoch == epochs_run++);
    CHECK(batches.count() == 4);
    for (int b = 1; b <= batches.count(); ++b) progress(b);  // no log: nothing to show, nothing fails
  };
  CHECK(mgpu::train_epochs(options(2, 25), 100, 25, loop, nullptr).size() == 2);
  CHECK(epochs_run == 2);
}

TEST_CASE("train_epochs: the log gets every epoch's line and row") {
  testing::TempDir out;
  Seen seen;
  mgpu::Options o = options(2, 50);
  o.out = out.path.string();
  mgpu::TrainingLog log("01_lenet", "loop_test", o, {}, 1, 100);
  mgpu::train_epochs(o, 100, 50, fake_chapter(seen, 100), &log);
  REQUIRE(log.records().size() == 2);
  CHECK(log.records()[1].test_acc == doctest::Approx(0.51));
}

#if !MGPU_CUDA
TEST_CASE("train_epochs: the progress line counts the batches the devices have finished, not those queued") {
  // The device runs nothing until the epoch's last step opens a gate: the three steps before it
  // return at once, their work still queued. Counting queued batches would show 1/4 and 2/4.
  testing::TempDir out;
  Seen seen;
  mgpu::Options o = options(2, 25);
  o.out = out.path.string();
  o.print_every = 1;  // under ctest stdout is not a terminal: a plain line each time a batch is done
  mgpu::DeviceSet devices(1);
  const mgpu::Device& d = devices[0];
  std::atomic<bool> gate{false};
  mgpu::EpochLoop loop = fake_chapter(seen, 100);
  loop.devices = {d};
  loop.step = [&](const mgpu::BatchOf& b) {
    if (b.index == 0) {
      gate = false;
      d.stream->submit([&gate] {
        while (!gate) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      });
    }
    if (b.index == 3) {
      gate = true;
      mgpu::synchronize(d);  // all four finished before the progress line is drawn
    }
  };
  loop.synchronize = [&] { devices.synchronize(); };
  mgpu::TrainingLog log("01_lenet", "finished_batches", o, {}, 1, 100);
  const std::string text = testing::stdout_of([&] { mgpu::train_epochs(o, 100, 25, loop, &log); });
  CAPTURE(text);
  // While the device was held nothing was finished, so nothing was shown; after the last step
  // three batches are finished for certain (the fourth's mark was queued after the wait, and may
  // or may not have passed when the line is drawn).
  for (const char* queued : {"batch 1/4", "batch 2/4"}) CHECK(text.find(queued) == std::string::npos);
  for (const char* epoch : {"  epoch 1/2  batch ", "  epoch 2/2  batch "}) {
    const std::size_t at = text.find(epoch);
    REQUIRE(at != std::string::npos);
    const std::string shown = text.substr(at + std::string(epoch).size(), 3);
    CHECK((shown == "3/4" || shown == "4/4"));
  }
}
#endif

TEST_CASE("train_epochs: the result line's peak_mib is the most one device's buffers held while it trained") {
  testing::TempDir out;
  mgpu::Options o = options(2, 50);
  o.out = out.path.string();
  mgpu::DeviceSet devices(2);
  mgpu::Buffer<float> model(devices[0], 1 << 18);  // 1 MiB held before training: counted
  {
    mgpu::Buffer<float> before(devices[1], 4 << 20);  // 16 MiB freed before training: not counted
  }
  mgpu::TrainingLog log("01_lenet", "peak_test", o, {}, 2, 100);
  CHECK(log.result_line().find(" peak_mib=none") != std::string::npos);  // nothing measured yet
  Seen seen;
  mgpu::EpochLoop loop = fake_chapter(seen, 100);
  loop.step = [&devices](const mgpu::BatchOf& b) {
    // Device 0: 2 MiB for a moment in every step, 3 MiB in one of them; device 1: 1 MiB.
    mgpu::Buffer<float> activations(devices[0], std::size_t(b.index == 1 ? 3 : 2) << 18);
    mgpu::Buffer<float> other(devices[1], 1 << 18);
  };
  mgpu::train_epochs(o, 100, 50, loop, &log);
  CHECK(mgpu::device_memory(devices[0]).held == std::size_t(1) << 20);  // the model: the steps' buffers are gone
  CHECK(mgpu::device_memory(devices[0]).peak == std::size_t(4) << 20);  // model + the largest step's
  CHECK(mgpu::device_memory(devices[1]).peak == std::size_t(1) << 20);
  CHECK(mgpu::peak_device_bytes() == std::size_t(4) << 20);
  CHECK(log.result_line().find(" peak_mib=4.0") != std::string::npos);
  // A reset starts from what is held now.
  mgpu::reset_device_memory_peaks();
  CHECK(mgpu::device_memory(devices[0]).peak == std::size_t(1) << 20);
}

TEST_CASE("train_epochs: a loop missing a part is refused, naming it") {
  Seen seen;
  const mgpu::Options o = options(1, 10);
  mgpu::EpochLoop no_test = fake_chapter(seen, 10);
  no_test.test_accuracy = nullptr;
  CHECK_THROWS_WITH_AS(mgpu::train_epochs(o, 10, 10, no_test, nullptr), "train_epochs: the loop has no test_accuracy",
                       mgpu::Error);
  mgpu::EpochLoop both = fake_chapter(seen, 10);
  both.run_epoch = [](int, const mgpu::ShuffledBatches&, const std::function<void(int)>&) {};
  CHECK_THROWS_WITH_AS(mgpu::train_epochs(o, 10, 10, both, nullptr),
                       "train_epochs: give the loop either step or run_epoch, not both or neither", mgpu::Error);
  CHECK(seen.calls.empty());  // refused before anything ran
}

TEST_CASE("PhaseTimer: each phase's time and each device's share, in the order the step named them") {
  const mgpu::DeviceSet devices(2);
  mgpu::Buffer<float> a(devices[0], 1 << 16), b(devices[1], 1 << 16);
  int waits = 0;
  mgpu::PhaseTimer timer(
      [&] {
        devices.synchronize();
        ++waits;
      },
      {&devices[0], &devices[1]});
  for (int step = 0; step < 3; ++step) {
    timer.start_step();
    timer.phase_done("split");
    for (int i = 0; i < 2; ++i) {
      timer.device_began(i);
      mgpu::fill(devices[i], (i ? b : a).data(), 1 << 16, 1.0f);
      timer.device_ended(i);
    }
    timer.phase_done("compute");
  }
  CHECK(waits == 3 * 3);  // a wait at each step's start and at each phase's end
  REQUIRE(timer.phases().size() == 2);
  CHECK(timer.phases()[0].name == "split");
  CHECK(timer.phases()[0].device_began.empty());  // no device was stamped in it
  const mgpu::PhaseTimer::Phase& compute = timer.phases()[1];
  CHECK(compute.name == "compute");
  CHECK(compute.seconds > 0);
  CHECK(timer.seconds("compute") == compute.seconds);
  CHECK(timer.seconds("no such phase") == 0);
  CHECK(timer.phase("compute") == &compute);
  CHECK(timer.phase("no such phase") == nullptr);
  REQUIRE(compute.device_began.size() == 2);
  for (int i = 0; i < 2; ++i) {
    CHECK(compute.device_began[i] >= 0);
    CHECK(compute.device_ended[i] >= compute.device_began[i]);
    CHECK(compute.device_ended[i] <= compute.seconds + 1e-6);  // inside its phase
  }
}

TEST_CASE("PhaseTimer: a device it does not time, or an end without a beginning, is refused") {
  const mgpu::DeviceSet devices(1);
  mgpu::PhaseTimer timer([&] { devices.synchronize(); }, {&devices[0]});
  CHECK_THROWS_WITH_AS(timer.device_began(1), "PhaseTimer: device 1 is not one of the 1 it times", mgpu::Error);
  CHECK_THROWS_WITH_AS(timer.device_ended(0), "PhaseTimer: device_ended(0) without its device_began", mgpu::Error);
}

TEST_CASE("StreamStamps: phases follow each other from the step's start; moments have no length") {
  const mgpu::DeviceSet devices(1);
  mgpu::Buffer<float> a(devices[0], 1 << 16);
  devices.synchronize();
  mgpu::StreamStamps stamps(devices[0], mgpu::steady_seconds());
  mgpu::fill(devices[0], a.data(), 1 << 16, 2.0f);
  stamps.phase_done("fill");
  stamps.moment("filled");
  mgpu::fill(devices[0], a.data(), 1 << 16, 3.0f);
  stamps.phase_done("fill again");
  const std::vector<mgpu::StreamStamps::Span> spans = stamps.spans();
  REQUIRE(spans.size() == 3);
  CHECK(spans[0].what == "fill");
  CHECK(spans[1].what == "fill again");
  CHECK(spans[1].begin_s == spans[0].end_s);
  CHECK(spans[1].end_s >= spans[1].begin_s);
  CHECK(spans[2].what == "filled");
  CHECK(spans[2].begin_s == spans[2].end_s);
  CHECK(spans[2].begin_s >= spans[0].begin_s);
}

TEST_CASE("no_probe: the step's default probe does nothing, whatever it is told") {
  mgpu::StepProbe& p = mgpu::no_probe();
  p.phase_done("x");
  p.device_began(99);
  p.device_ended(99);
  p.moment("y");
  CHECK(&p == &mgpu::no_probe());
}

namespace {

// A collective that only says who it is and how large it was made.
class Named : public mgpu::Collective {
 public:
  Named(std::string name, std::size_t max) : name_(std::move(name)), max_(max) {}
  std::string name() const override { return name_ + ":" + std::to_string(max_); }
  void run(const mgpu::DeviceBuffers&, mgpu::Elements) override {}

 private:
  std::string name_;
  std::size_t max_;
};

}  // namespace

TEST_CASE("CollectiveMenu: makes the one its name says, for the size asked; refuses names it lacks") {
  mgpu::CollectiveMenu menu;
  menu.add("naive", [](std::size_t n) { return std::make_unique<Named>("naive", n); });
  menu.add("ring", [](std::size_t n) { return std::make_unique<Named>("ring", n); });
  CHECK(menu.has("ring"));
  CHECK_FALSE(menu.has("nccl"));
  CHECK(menu.names() == std::vector<std::string>{"naive", "ring"});
  CHECK(menu.make("ring", 1000)->name() == "ring:1000");
  CHECK(menu.make("naive", 8)->name() == "naive:8");
  CHECK_THROWS_WITH_AS(menu.make("nccl", 8), "no collective named 'nccl' in this program (it has: naive, ring)",
                       mgpu::Error);
  CHECK_THROWS_WITH_AS(menu.add("ring", [](std::size_t n) { return std::make_unique<Named>("again", n); }),
                       "CollectiveMenu: 'ring' is on the menu already", mgpu::Error);
  CHECK_THROWS_WITH_AS(mgpu::CollectiveMenu{}.make("ring", 1), "no collective named 'ring' in this program (it has: none)",
                       mgpu::Error);
}
