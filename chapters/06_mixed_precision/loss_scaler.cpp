#include "loss_scaler.h"

#include <cmath>

#include "common/check.h"
#include "common/exercise.h"  // the student copy's holes call mgpu::exercise_not_done

namespace mixed {

LossScaler::LossScaler(Settings s) : settings_(s), scale_(s.initial_scale) {
  if (!(s.initial_scale > 0) || !std::isfinite(s.initial_scale))
    throw mgpu::Error("LossScaler: the initial scale must be a positive finite number, got " +
                      std::to_string(s.initial_scale));
  if (s.growth_interval < 1)
    throw mgpu::Error("LossScaler: the growth interval must be at least 1 step, got " +
                      std::to_string(s.growth_interval));
  if (!(s.growth > 1) || !(s.backoff > 0 && s.backoff < 1))
    throw mgpu::Error("LossScaler: growth must be above 1 and backoff between 0 and 1");
}

bool LossScaler::update(bool found_inf) {
  ++steps_;
  // BEGIN EXERCISE ex06.loss_scaler_update
  if (found_inf) {  // this scale overflowed: skip the step, try a smaller one
    ++skipped_;
    scale_ *= settings_.backoff;
    clean_in_a_row_ = 0;
    return true;
  }
  if (++clean_in_a_row_ == settings_.growth_interval) {  // long enough without overflow: try larger
    scale_ *= settings_.growth;
    clean_in_a_row_ = 0;
  }
  return false;
  // END EXERCISE ex06.loss_scaler_update
}

}  // namespace mixed
