// Chapter 07: the schedules, the bubble's arithmetic, and the promise that LeNet split across
// devices (and pipelined, and replicated) computes what chapter 01's one device computes.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "../chapters/07_model_parallel/pipeline.h"
#include "common/random.h"
#include "helpers.h"
#include "model_parallel_checks.h"

namespace {

using pp::Op;
using pp::Schedule;
using testing::check_same_params;
using testing::one_device;
using testing::pipelined;
using testing::show;

pp::PipelineConfig config(std::vector<int> cuts, Schedule schedule, int m, int replicas = 1) {
  return testing::pipeline_config(std::move(cuts), schedule, m, replicas);
}

}  // namespace

TEST_CASE("schedules: GPipe and 1F1B run every micro-batch's forward, then its backward, once each") {
  // The textbook orders, written out for k = 2 stages and m = 4 micro-batches.
  CHECK(show(pp::stage_ops(Schedule::GPipe, 0, 2, 4)) == "F0 F1 F2 F3 B0 B1 B2 B3 ");
  CHECK(show(pp::stage_ops(Schedule::OneFOneB, 0, 2, 4)) == "F0 F1 B0 F2 B1 F3 B2 B3 ");
  CHECK(show(pp::stage_ops(Schedule::OneFOneB, 1, 2, 4)) == "F0 B0 F1 B1 F2 B2 F3 B3 ");
  CHECK(show(pp::stage_ops(Schedule::OneFOneB, 0, 4, 2)) == "F0 F1 B0 B1 ");
  CHECK(show(pp::stage_ops(Schedule::Naive, 1, 2, 1)) == "F0 B0 ");
  for (Schedule sched : {Schedule::GPipe, Schedule::OneFOneB})
    for (int k = 1; k <= 4; ++k)
      for (int m : {1, 2, 3, 4, 8, 16})
        for (int s = 0; s < k; ++s) {
          CAPTURE(pp::name_of(sched));
          CAPTURE(k);
          CAPTURE(m);
          CAPTURE(s);
          const std::vector<Op> ops = pp::stage_ops(sched, s, k, m);
          REQUIRE(ops.size() == std::size_t(2 * m));
          std::vector<int> forward_at(m, -1), backward_at(m, -1);
          for (int i = 0; i < 2 * m; ++i) (ops[i].kind == Op::Forward ? forward_at : backward_at)[ops[i].micro] = i;
          for (int j = 0; j < m; ++j) {
            CHECK(forward_at[j] >= 0);
            CHECK(backward_at[j] > forward_at[j]);
          }
          // The memory each keeps: all m for GPipe, at most k - s for 1F1B.
          CHECK(pp::peak_in_flight(ops) == (sched == Schedule::GPipe ? m : std::min(m, k - s)));
        }
  CHECK_THROWS_AS(pp::stage_ops(Schedule::Naive, 0, 2, 4), mgpu::Error);
}

TEST_CASE("bubble: the formula, and the prediction for stages of unequal cost") {
  CHECK(pp::bubble_formula(2, 1) == doctest::Approx(0.5));
  CHECK(pp::bubble_formula(2, 4) == doctest::Approx(0.2));
  CHECK(pp::bubble_formula(4, 16) == doctest::Approx(3.0 / 19));
  for (int k = 1; k <= 4; ++k)
    for (int m : {1, 2, 4, 8, 16}) {
      const std::vector<double> idle = pp::predicted_idle(std::vector<double>(k, 1.5e-3), m);
      REQUIRE(idle.size() == std::size_t(k));
      for (double x : idle) CHECK(x == doctest::Approx(pp::bubble_formula(k, m)));
    }
  // Stage 0 three times as slow as stage 1, 4 micro-batches: stage 0 idles 1/13 of a step, stage 1 9/13.
  const std::vector<double> idle = pp::predicted_idle({3.0, 1.0}, 4);
  REQUIRE(idle.size() == 2);
  CHECK(idle[0] == doctest::Approx(1.0 / 13));
  CHECK(idle[1] == doctest::Approx(9.0 / 13));
}

TEST_CASE("cuts: where LeNet may be split") {
  CHECK(pp::check_cuts({2}).empty());
  CHECK(pp::check_cuts({1, 2, 3}).empty());
  CHECK(pp::check_cuts({}).empty());
  CHECK_FALSE(pp::check_cuts({0}).empty());
  CHECK_FALSE(pp::check_cuts({4}).empty());
  CHECK_FALSE(pp::check_cuts({2, 2}).empty());
  CHECK_FALSE(pp::check_cuts({3, 1}).empty());
  CHECK(pp::stage_bounds({2}) == std::vector<int>{0, 2, 4});
  CHECK(pp::default_cuts(2) == std::vector<int>{2});
  CHECK_THROWS_AS(pp::default_cuts(5), mgpu::Error);
}

TEST_CASE("split training: 2 stages, every cut, give chapter 01's parameters") {
  mgpu::Rng rng(3);
  const int batch = 24, steps = 3;
  const mgpu::LabeledImages set = testing::random_set(batch * steps, rng);
  const lenet::HostParams want = one_device(set, batch, steps, 0.1f);
  for (int cut : {1, 2, 3}) {
    CAPTURE(cut);
    check_same_params(pipelined(config({cut}, Schedule::Naive, 1), set, batch, steps, 0.1f), want,
                      "cut " + std::to_string(cut));
  }
}

TEST_CASE("pipelines: GPipe and 1F1B with m = 1, 2, 4 (and 3 stages, 4 stages) give chapter 01's parameters") {
  mgpu::Rng rng(4);
  const int batch = 26, steps = 3;  // 26 = 7 + 7 + 6 + 6 with m = 4: micro-batches of unequal size
  const mgpu::LabeledImages set = testing::random_set(batch * steps, rng);
  const lenet::HostParams want = one_device(set, batch, steps, 0.1f);
  for (Schedule sched : {Schedule::GPipe, Schedule::OneFOneB})
    for (const std::vector<int>& cuts :
         {std::vector<int>{}, std::vector<int>{2}, std::vector<int>{1, 3}, std::vector<int>{1, 2, 3}})
      for (int m : {1, 2, 3, 4}) {
        const std::string what = std::string(pp::name_of(sched)) + " k=" + std::to_string(cuts.size() + 1) +
                                 " m=" + std::to_string(m);
        CAPTURE(what);
        check_same_params(pipelined(config(cuts, sched, m), set, batch, steps, 0.1f), want, what);
      }
}

TEST_CASE("hybrid: 2 stages x 2 replicas, gradients summed per stage, give chapter 01's parameters") {
  mgpu::Rng rng(5);
  const int batch = 30, steps = 3;
  const mgpu::LabeledImages set = testing::random_set(batch * steps, rng);
  const lenet::HostParams want = one_device(set, batch, steps, 0.1f);
  for (Schedule sched : {Schedule::GPipe, Schedule::OneFOneB}) {
    CAPTURE(pp::name_of(sched));
    check_same_params(pipelined(config({2}, sched, 2, 2), set, batch, steps, 0.1f), want, "hybrid");
  }
}

TEST_CASE("evaluation through the pipeline agrees with chapter 01's, and the metrics add up") {
  mgpu::Rng rng(6);
  const mgpu::LabeledImages set = testing::random_set(50, rng);
  const lenet::HostParams init = lenet::init_params(7, 0.1f);
  pp::Pipeline pipeline(config({1, 3}, Schedule::OneFOneB, 4), init, 16);
  const double got = pipeline.evaluate(set, 16);
  mgpu::DeviceSet one(1);
  lenet::Params p = lenet::upload_params(one[0], init);
  lenet::Lanes lanes = lenet::make_lanes(one[0], 16);
  const mgpu::DeviceImages images(one[0], set);
  CHECK(got == doctest::Approx(lenet::evaluate_accuracy(one[0], p, lanes, images)));
  // Training metrics: every example's loss counted once, on the last stage.
  pipeline.set_training_data(set);
  std::vector<int> order(set.count);
  for (int i = 0; i < set.count; ++i) order[i] = i;
  pipeline.set_order(order);
  pipeline.reset_metrics();
  pipeline.step(0, 16, 0.1f);
  pipeline.step(16, 16, 0.1f);
  const auto [loss, hits] = pipeline.read_metrics();
  // The same two steps by chapter 01's code on one device: the same loss sum and hit count
  // (a pipeline that counted an example twice, or on every stage, would show it here).
  std::array<double, 2> want{};
  one_device(set, 16, 2, 0.1f, &want);
  CHECK(loss == doctest::Approx(want[0]).epsilon(1e-5));
  CHECK(hits == want[1]);
}

TEST_CASE("activation memory: GPipe keeps m micro-batches per stage, 1F1B at most k - s") {
  const int batch = 64;
  pp::Pipeline gpipe(config({1, 2, 3}, Schedule::GPipe, 8), lenet::init_params(1), batch);
  pp::Pipeline onefoneb(config({1, 2, 3}, Schedule::OneFOneB, 8), lenet::init_params(1), batch);
  for (int s = 0; s < 4; ++s) {
    CAPTURE(s);
    CHECK(gpipe.slots(s) == 8);
    CHECK(onefoneb.slots(s) == 4 - s);
    CHECK(gpipe.activation_bytes(s) == onefoneb.activation_bytes(s) / std::size_t(4 - s) * 8);
  }
  // Stage 0 of a 4-stage LeNet holds conv1's tensors: images 784, col1 9 x 676, h1 20 x 676,
  // p1 3380 floats per image; 8 images per micro-batch (64 / 8), plus 8 labels.
  CHECK(gpipe.activation_bytes(0) == std::size_t(8) * (8 * (784 + 9 * 676 + 20 * 676 + 3380) * 4 + 8 * 4));
}

TEST_CASE("timeline: every forward and backward of every stage, in an order the data allows") {
  mgpu::Rng rng(8);
  const int batch = 32, m = 4;
  const mgpu::LabeledImages set = testing::random_set(batch, rng);
  std::vector<pp::Span> spans;
  pipelined(config({2}, Schedule::GPipe, m), set, batch, 1, 0.1f, &spans);
  for (int s = 0; s < 2; ++s)
    for (int j = 0; j < m; ++j) {
      CAPTURE(s);
      CAPTURE(j);
      auto find = [&](int stage, char kind) {
        return std::find_if(spans.begin(), spans.end(),
                            [&](const pp::Span& x) { return x.stage == stage && x.kind == kind && x.micro == j; });
      };
      const auto f = find(s, 'F'), b = find(s, 'B');
      REQUIRE(f != spans.end());
      REQUIRE(b != spans.end());
      CHECK(f->begin <= f->end);
      CHECK(f->end <= b->begin);
      if (s == 1) CHECK(find(0, 'F')->end <= f->begin);      // stage 1 starts after stage 0 sent j
      if (s == 0) CHECK(find(1, 'B')->end <= b->begin);      // and the gradient comes back first
    }
  const pp::Bubble bubble = pp::measure_bubble(spans, 2, m);
  for (int s = 0; s < 2; ++s) {
    CHECK(bubble.busy[s] > 0);
    CHECK(bubble.busy[s] <= 1.0);
  }
}

TEST_CASE("measure_bubble: busy, idle, stage time and step length of hand-made timelines") {
  // Two steps of 2 stages, 2 micro-batches, replica 0 (a replica 1 span must be ignored).
  // Step 0 lasts 10 s: stage 0 computes 1+1 (F) + 2+2 (B) = 6 s, stage 1 computes 1+1 + 1+1 = 4 s;
  // a 'W' (waiting) and a 'C' (copy) span count toward the step's length, not toward busy.
  // Step 1 lasts 5 s: stage 0 computes 5 s, stage 1 computes 1 s.
  using S = pp::Span;
  const std::vector<S> spans = {
      {0, 0, 0, 'F', 0, 0, 1}, {0, 0, 0, 'F', 1, 1, 2}, {0, 0, 0, 'B', 1, 5, 7}, {0, 0, 0, 'B', 0, 7, 9},
      {0, 0, 1, 'C', 0, 1, 1.5}, {0, 0, 1, 'F', 0, 2, 3}, {0, 0, 1, 'F', 1, 3, 4},
      {0, 0, 1, 'B', 1, 4, 5}, {0, 0, 1, 'B', 0, 5, 6}, {0, 0, 1, 'W', -1, 6, 10},
      {0, 1, 0, 'F', 0, 0, 100},  // replica 1: not counted
      {1, 0, 0, 'F', 0, 20, 22}, {1, 0, 0, 'B', 0, 22, 25}, {1, 0, 1, 'F', 0, 22, 23}};
  const pp::Bubble b = pp::measure_bubble(spans, 2, 2);
  CHECK(b.step_seconds == doctest::Approx((10.0 + 5.0) / 2));
  CHECK(b.busy[0] == doctest::Approx((6.0 / 10 + 5.0 / 5) / 2));
  CHECK(b.busy[1] == doctest::Approx((4.0 / 10 + 1.0 / 5) / 2));
  CHECK(b.idle[0] == doctest::Approx(1 - b.busy[0]));
  CHECK(b.idle[1] == doctest::Approx(1 - b.busy[1]));
  CHECK(b.stage_time[0] == doctest::Approx((6.0 / 2 + 5.0 / 2) / 2));  // per micro-batch, mean over steps
  CHECK(b.stage_time[1] == doctest::Approx((4.0 / 2 + 1.0 / 2) / 2));
  CHECK_THROWS_AS(pp::measure_bubble({}, 2, 2), mgpu::Error);  // no step at all
}
