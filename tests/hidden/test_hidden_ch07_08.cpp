// The hidden cases of chapters 07 and 08: the properties the visible tests check, on inputs
// those tests never use. Chapter 07: 1F1B's order written out for every stage count up to 4 and
// up to 12 micro-batches, peak_in_flight on orders no schedule makes, more micro-batches than
// stages in micro-batches of unequal size, a 3-stage hybrid, a pipeline under random delays, and
// the bubble of three and four unequal stages. Chapter 08: clocks of four workers whose slowest
// finishes, pulls and pushes through four and five shards, SSP with four workers and a
// straggler, and the staleness histogram of three shards. A solution that is right passes them
// as it passes the visible ones; one written to fit the visible tests (two stages, two shards,
// the micro-batch counts it was shown) does not.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "../../chapters/07_model_parallel/pipeline.h"
#include "../../chapters/08_parameter_server/parameter_server.h"
#include "../../chapters/08_parameter_server/train.h"
#include "common/random.h"
#include "data_parallel_checks.h"
#include "helpers.h"
#include "model_parallel_checks.h"
#include "parameter_server_checks.h"

namespace {

using namespace std::chrono_literals;
using pp::Op;
using pp::Schedule;

// ---- Chapter 07 ------------------------------------------------------------------------------

// 1F1B on stage s of k, m micro-batches, as the textbook writes it: w = min(m, k - 1 - s)
// forwards, then m - w pairs "forward, backward", then the w backwards left.
std::string one_f_one_b(int s, int k, int m) {
  std::vector<Op> ops;
  const int w = std::min(m, k - 1 - s);
  for (int j = 0; j < w; ++j) ops.push_back({Op::Forward, j});
  for (int i = 0; i < m - w; ++i) {
    ops.push_back({Op::Forward, w + i});
    ops.push_back({Op::Backward, i});
  }
  for (int j = m - w; j < m; ++j) ops.push_back({Op::Backward, j});
  return testing::show(ops);
}

}  // namespace

TEST_CASE("hidden schedules: 1F1B's and GPipe's orders for k = 1..4 and m = 1..12; peak_in_flight of hand-made orders") {
  for (int k = 1; k <= 4; ++k)
    for (int m = 1; m <= 12; ++m)
      for (int s = 0; s < k; ++s) {
        CAPTURE(k);
        CAPTURE(m);
        CAPTURE(s);
        CHECK(testing::show(pp::stage_ops(Schedule::OneFOneB, s, k, m)) == one_f_one_b(s, k, m));
        std::vector<Op> gpipe;
        for (int j = 0; j < m; ++j) gpipe.push_back({Op::Forward, j});
        for (int j = 0; j < m; ++j) gpipe.push_back({Op::Backward, j});
        CHECK(testing::show(pp::stage_ops(Schedule::GPipe, s, k, m)) == testing::show(gpipe));
      }
  const Op::Kind F = Op::Forward, B = Op::Backward;
  CHECK(pp::peak_in_flight({}) == 0);
  CHECK(pp::peak_in_flight({{F, 0}, {B, 0}, {F, 1}, {B, 1}, {F, 2}, {B, 2}}) == 1);
  CHECK(pp::peak_in_flight({{F, 0}, {F, 1}, {B, 1}, {F, 2}, {F, 3}, {B, 0}, {B, 2}, {B, 3}}) == 3);
  CHECK(pp::peak_in_flight({{F, 0}, {F, 1}, {F, 2}, {B, 2}, {B, 1}, {F, 3}, {F, 4}, {B, 0}, {B, 3}, {B, 4}}) == 3);
}

TEST_CASE("hidden pipelines: more micro-batches than stages, of unequal size, 3 and 4 stages, a 3-stage hybrid") {
  mgpu::Rng rng(707);
  const int batch = 29, steps = 2;  // 29 = 4 x 6 + 5 with m = 5, 5 + 6 x 4 with m = 7
  const mgpu::LabeledImages set = testing::random_set(batch * steps, rng);
  const lenet::HostParams want = testing::one_device(set, batch, steps, 0.2f, nullptr, 11);
  struct Shape {
    std::vector<int> cuts;
    int m;
  };
  for (Schedule sched : {Schedule::GPipe, Schedule::OneFOneB})
    for (const Shape& c : {Shape{{2, 3}, 5}, Shape{{2, 3}, 7}, Shape{{1, 2}, 6}, Shape{{1, 2, 3}, 5}}) {
      const std::string what = std::string(pp::name_of(sched)) + " k=" + std::to_string(c.cuts.size() + 1) +
                               " m=" + std::to_string(c.m);
      CAPTURE(what);
      testing::check_same_params(
          testing::pipelined(testing::pipeline_config(c.cuts, sched, c.m), set, batch, steps, 0.2f, nullptr, 11), want,
          what);
    }
  // 3 stages x 2 replicas (6 devices), 1F1B with 3 micro-batches a replica: 29 = 15 + 14.
  testing::check_same_params(
      testing::pipelined(testing::pipeline_config({1, 2}, Schedule::OneFOneB, 3, 2), set, batch, steps, 0.2f, nullptr,
                         11),
      want, "hybrid 3 x 2");
}

TEST_CASE("hidden timeline: 1F1B on 3 stages and 5 micro-batches, every span in an order the data allows") {
  mgpu::Rng rng(77);
  const int batch = 25, m = 5, k = 3;
  const mgpu::LabeledImages set = testing::random_set(batch, rng);
  std::vector<pp::Span> spans;
  testing::pipelined(testing::pipeline_config({1, 2}, Schedule::OneFOneB, m), set, batch, 1, 0.1f, &spans);
  auto find = [&](int stage, char kind, int j) {
    return std::find_if(spans.begin(), spans.end(),
                        [&](const pp::Span& x) { return x.stage == stage && x.kind == kind && x.micro == j; });
  };
  for (int s = 0; s < k; ++s)
    for (int j = 0; j < m; ++j) {
      CAPTURE(s);
      CAPTURE(j);
      const auto f = find(s, 'F', j), b = find(s, 'B', j);
      REQUIRE(f != spans.end());
      REQUIRE(b != spans.end());
      CHECK(f->begin <= f->end);
      CHECK(f->end <= b->begin);
      if (s > 0) CHECK(find(s - 1, 'F', j)->end <= f->begin);      // the activation came from the stage before
      if (s < k - 1) CHECK(find(s + 1, 'B', j)->end <= b->begin);  // the gradient from the stage after
    }
  const pp::Bubble bubble = pp::measure_bubble(spans, k, m);
  for (int s = 0; s < k; ++s) {
    CHECK(bubble.busy[s] > 0);
    CHECK(bubble.busy[s] <= 1.0);
  }
}

TEST_CASE("hidden evaluation: a 4-stage 1F1B pipeline of 5 micro-batches, a test set that no chunk divides") {
  mgpu::Rng rng(708);
  const mgpu::LabeledImages set = testing::random_set(53, rng);
  const lenet::HostParams init = lenet::init_params(12, 0.1f);
  pp::Pipeline pipeline(testing::pipeline_config({1, 2, 3}, Schedule::OneFOneB, 5), init, 20);
  mgpu::DeviceSet one(1);
  lenet::Params p = lenet::upload_params(one[0], init);
  lenet::Lanes lanes = lenet::make_lanes(one[0], 20);
  const mgpu::DeviceImages images(one[0], set);
  CHECK(pipeline.evaluate(set, 20) == doctest::Approx(lenet::evaluate_accuracy(one[0], p, lanes, images)));
}

TEST_CASE("hidden pipelines under random delays: every stage's wait is needed (run with MGPU_CHAOS set)") {
  mgpu::Rng rng(709);
  const int batch = 18, steps = 3;
  const mgpu::LabeledImages set = testing::random_set(batch * steps, rng);
  const lenet::HostParams want = testing::one_device(set, batch, steps, 0.1f);
  for (Schedule sched : {Schedule::GPipe, Schedule::OneFOneB}) {
    CAPTURE(pp::name_of(sched));
    testing::check_same_params(testing::pipelined(testing::pipeline_config({1, 3}, sched, 4), set, batch, steps, 0.1f),
                               want, "3 stages");
    testing::check_same_params(testing::pipelined(testing::pipeline_config({2}, sched, 3, 2), set, batch, steps, 0.1f),
                               want, "hybrid 2 x 2");
  }
}

TEST_CASE("hidden bubble: three and four stages of unequal cost, one micro-batch and several") {
  // Stages of 1, 2 and 3 units, 2 micro-batches: the step is 9 units.
  std::vector<double> idle = pp::predicted_idle({1.0, 2.0, 3.0}, 2);
  REQUIRE(idle.size() == 3);
  CHECK(idle[0] == doctest::Approx(7.0 / 9));
  CHECK(idle[1] == doctest::Approx(5.0 / 9));
  CHECK(idle[2] == doctest::Approx(3.0 / 9));
  // One micro-batch: each stage works once in a step as long as all of them together.
  idle = pp::predicted_idle({1.0, 2.0, 3.0}, 1);
  REQUIRE(idle.size() == 3);
  CHECK(idle[0] == doctest::Approx(5.0 / 6));
  CHECK(idle[2] == doctest::Approx(3.0 / 6));
  // Four stages, the slowest second, 3 micro-batches: a step of 19 units.
  idle = pp::predicted_idle({2.0, 5.0, 1.0, 1.0}, 3);
  REQUIRE(idle.size() == 4);
  CHECK(idle[0] == doctest::Approx(13.0 / 19));
  CHECK(idle[1] == doctest::Approx(4.0 / 19));
  CHECK(idle[2] == doctest::Approx(16.0 / 19));
  CHECK(idle[3] == doctest::Approx(16.0 / 19));
}

// ---- Chapter 08 ------------------------------------------------------------------------------

TEST_CASE("hidden clocks: four workers, bound 2; the slowest finishing lets the others go; the time waited adds up") {
  ps::Clocks clocks(4, 2);
  for (int i = 0; i < 3; ++i) clocks.tick(0);  // worker 0 at 3, the others at 0
  CHECK_FALSE(testing::returns_within(clocks, 0, 150ms, [&] {
    for (int w = 1; w < 4; ++w) clocks.tick(w);  // all at 1: worker 0 is 2 ahead
  }));
  CHECK(testing::returns_within(clocks, 0, 2000ms, [] {}));
  for (int i = 0; i < 2; ++i) clocks.tick(1), clocks.tick(2);  // workers 1 and 2 at 3, worker 3 at 1
  CHECK(testing::returns_within(clocks, 1, 2000ms, [] {}));    // 2 ahead of worker 3
  clocks.tick(1);                                               // 3 ahead of worker 3
  CHECK_FALSE(testing::returns_within(clocks, 1, 150ms, [&] { clocks.finish(3); }));
  CHECK(testing::returns_within(clocks, 1, 2000ms, [] {}));  // the slowest still running is at 3
  CHECK(testing::returns_within(clocks, 3, 2000ms, [] {}));  // a finished worker is never held
  // Workers 0 and 1 were each held about 150 ms, and that time is counted; worker 2 never waited.
  CHECK(clocks.waited_seconds(0) > 0.05);
  CHECK(clocks.waited_seconds(1) > 0.05);
  CHECK(clocks.waited_seconds(2) < 0.05);
  // Bound 3: three ahead is allowed, four is not.
  ps::Clocks three(2, 3);
  for (int i = 0; i < 3; ++i) three.tick(1);
  CHECK(testing::returns_within(three, 1, 2000ms, [] {}));
  three.tick(1);
  CHECK_FALSE(testing::returns_within(three, 1, 150ms, [&] { three.tick(0); }));
}

TEST_CASE("hidden shards: pulls and pushes through 5 shards (ASP) and 4 shards (BSP, two steps), 3 workers") {
  mgpu::Rng rng(808);
  const mgpu::LabeledImages set = testing::random_set(6, rng);
  const lenet::HostParams init = lenet::init_params(13, 0.1f);
  {  // ASP, 5 shards: every pull exact; the pushes applied in the order 2, 0, 1, each counted stale by the others
    testing::Rig rig(5, 3, ps::Mode::Asp, set, 2, init);
    std::vector<std::vector<std::int64_t>> pulled;
    for (int i = 0; i < 3; ++i) {
      dp::Replica& r = rig.replicas[i];
      mgpu::fill(*r.device, r.params.flat(), lenet::flat_count(), -7e30f);
      pulled.push_back(rig.server->pull(i, r.params));
      CHECK(pulled.back() == std::vector<std::int64_t>(5, 0));
      const lenet::HostParams got = r.params.download();
      for (int t = 0; t < lenet::kParamTensors; ++t) CHECK(got[t] == init[t]);
    }
    std::vector<float> want = testing::flat_of(init);
    const float lr = 0.3f;
    const int n = 9;
    for (int i : {2, 0, 1}) {
      const std::vector<float> g = testing::random_floats(lenet::flat_count(), rng);
      testing::set_gradient(rig.replicas[i], g);
      rig.server->push(i, rig.replicas[i].grads, pulled[i], n, lr, 1);
      for (std::size_t j = 0; j < want.size(); ++j) want[j] -= lr / n * g[j];
    }
    const std::vector<float> got = testing::flat_of(rig.server->download());
    CHECK(testing::count_far(got, testing::without_padding(want), 1e-6f) == 0);
    CHECK(rig.server->versions() == std::vector<std::int64_t>(5, 3));
    std::vector<std::int64_t> staleness(3, -1);  // by worker, on shard 4
    for (const ps::PushRecord& p : rig.server->records())
      if (p.shard == 4) staleness[p.worker] = p.staleness();
    CHECK(staleness == std::vector<std::int64_t>{1, 2, 0});
  }
  {  // BSP, 4 shards, two steps: each shard steps once per step, by the sum of its three pushes
    testing::Rig rig(4, 3, ps::Mode::Bsp, set, 2, init);
    std::vector<float> want = testing::flat_of(init);
    const float lr = 0.4f;
    const int n = 6;
    for (int step = 0; step < 2; ++step) {
      std::vector<std::vector<std::int64_t>> pulled;
      for (int i = 0; i < 3; ++i) pulled.push_back(rig.server->pull(i, rig.replicas[i].params));
      for (int i = 0; i < 3; ++i) {
        CHECK(pulled[i] == std::vector<std::int64_t>(4, step));
        const std::vector<float> g = testing::random_floats(lenet::flat_count(), rng);
        testing::set_gradient(rig.replicas[i], g);
        rig.server->push(i, rig.replicas[i].grads, pulled[i], n, lr, 1);
        for (std::size_t j = 0; j < want.size(); ++j) want[j] -= lr / n * g[j];
        rig.server->drain();
        CHECK(rig.server->versions() == std::vector<std::int64_t>(4, i < 2 ? step : step + 1));
      }
    }
    const std::vector<float> got = testing::flat_of(rig.server->download());
    CHECK(testing::count_far(got, testing::without_padding(want), 1e-5f) == 0);
    for (const ps::PushRecord& p : rig.server->records()) CHECK(p.staleness() == 0);
  }
}

TEST_CASE("hidden pull: 2 and 4 shards, 3 workers: every slice exact, with version 0, its bytes counted once") {
  mgpu::Rng rng(83);
  const mgpu::LabeledImages set = testing::random_set(9, rng);
  const lenet::HostParams want = lenet::init_params(19, 0.1f);
  const double model_bytes = double(lenet::flat_count()) * sizeof(float);
  for (int s : {2, 4}) {
    CAPTURE(s);
    testing::Rig rig(s, 3, ps::Mode::Asp, set, 3, want);
    for (int i = 0; i < 3; ++i) {
      dp::Replica& r = rig.replicas[i];
      mgpu::fill(*r.device, r.params.flat(), lenet::flat_count(), -7.0f);  // poison: the pull must overwrite it
      CHECK(rig.server->pull(i, r.params) == std::vector<std::int64_t>(s, 0));
      const lenet::HostParams got = r.params.download();
      for (int t = 0; t < lenet::kParamTensors; ++t) CHECK(got[t] == want[t]);
    }
    rig.server->drain();
    CHECK(rig.server->traffic().pulled == std::int64_t(3 * model_bytes));
    CHECK(rig.server->traffic().pushed == 0);
  }
}

TEST_CASE("hidden straggler: BSP with 4 workers and the last one slow: the same work each, every step waits for it") {
  testing::check_bsp_waits_for_straggler(/*shards=*/2, /*workers=*/4, /*straggler=*/3, /*batch=*/16, /*steps=*/5,
                                         /*seed=*/84);
}

TEST_CASE("hidden bsp: 4 workers and 3 shards train as chapter 02 does, with another batch") {
  mgpu::Rng rng(809);
  const int batch = 22, steps = 3;
  const mgpu::LabeledImages set = testing::random_set(batch * steps, rng);
  mgpu::DeviceSet one(1);
  dp::Allreduce single(one, dp::largest_gradient_sum(lenet::Layout::Flat));
  const lenet::HostParams want = testing::train_steps(one, single, lenet::Layout::Flat, set, batch, steps, 0.3f)[0];
  const testing::EpochRun r = testing::run_steps(3, 4, ps::Settings{}, set, batch, steps, 0.3f);
  testing::check_same_training(r.params, want, lenet::init_params(7, 0.1f), "bsp, k = 4, s = 3");
  CHECK(r.versions == std::vector<std::int64_t>(3, steps));
  for (const ps::WorkerStats& w : r.stats) CHECK(w.items == steps);
}

TEST_CASE("hidden ssp: bound 2, 4 workers, 2 shards and a straggler: every push once, none staler than the bound") {
  mgpu::Rng rng(810);
  const int batch = 16, steps = 6, k = 4, bound = 2;
  const mgpu::LabeledImages set = testing::random_set(batch * steps, rng);
  ps::Settings settings;
  settings.mode = ps::Mode::Ssp;
  settings.staleness = bound;
  settings.straggler = 3;
  settings.slowdown = 5;
  const testing::EpochRun r = testing::run_steps(2, k, settings, set, batch, steps, 0.1f);
  CHECK(r.versions == std::vector<std::int64_t>(2, k * steps));  // one update per push, on each shard
  REQUIRE(r.records.size() == std::size_t(2 * k * steps));
  for (const ps::PushRecord& p : r.records) {
    CHECK(p.staleness() >= 0);
    CHECK(p.staleness() <= (k - 1) * (2 * bound + 1));
  }
  // No fast worker got more than bound + 1 pieces ahead of the straggler.
  for (int i = 0; i < 3; ++i) CHECK(r.stats[i].items - r.stats[3].items <= bound + 1);
}

TEST_CASE("hidden staleness_histogram: three shards, three epochs, a gap in the values") {
  auto push = [](int shard, int epoch, std::int64_t pulled, std::int64_t applied) {
    ps::PushRecord r;
    r.shard = shard, r.epoch = epoch, r.pulled = pulled, r.applied = applied;
    return r;
  };
  std::vector<ps::PushRecord> records;
  for (int shard = 0; shard < 3; ++shard) {
    records.push_back(push(shard, 1, 0, 0));
    records.push_back(push(shard, 2, 3, 7));
    records.push_back(push(shard, 3, 9, 9));
    records.push_back(push(shard, 3, 8, 9));
  }
  records.push_back(push(2, 3, 0, 5));  // another shard's record only: not a push of shard 0's count
  CHECK(ps::staleness_histogram(records) == std::vector<std::int64_t>{2, 1, 0, 0, 1});
  CHECK(ps::staleness_histogram(records, 2) == std::vector<std::int64_t>{0, 0, 0, 0, 1});
  CHECK(ps::staleness_histogram(records, 3) == std::vector<std::int64_t>{1, 1});
}
