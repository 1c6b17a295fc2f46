// Dynamic loss scaling, the rule PyTorch's torch.cuda.amp.GradScaler follows, written out.
//
// fp16 cannot hold a gradient of 2^-25 or less (it becomes 0) or of 65520 or more (inf). So
// the loss is multiplied by a scale S before the backward pass: every gradient is then S times
// larger, lifted out of the underflow range; the fp32 gradient is divided by S again before the
// SGD step, so the step is the same. Too large an S overflows somewhere. Nobody knows the right
// S in advance, so it is found while training:
//
//   after each step's backward pass, every gradient of every device is checked for inf/NaN;
//   found anywhere:  the step is skipped (the parameters stay as they were) and S *= backoff (1/2)
//   not found:       the step is taken, and after growth_interval clean steps in a row S *= growth (2)
//
// So S sits just below the largest scale that does not overflow, and a skipped step now and
// then is the price of finding it. PyTorch's defaults: S = 2^16, growth_interval 2000; this
// chapter uses 200, so that its plots show the scale move within a 10-epoch run (235 steps an epoch).
#pragma once
#include <string>

namespace mixed {

class LossScaler {
 public:
  struct Settings {
    float initial_scale = 65536.0f;  // 2^16, as GradScaler
    int growth_interval = 200;       // clean steps in a row before the scale grows
    float growth = 2.0f;
    float backoff = 0.5f;
  };
  explicit LossScaler(Settings s);  // refuses settings that could not work (names the value)
  LossScaler() : LossScaler(Settings{}) {}

  float scale() const { return scale_; }  // what the loss is multiplied by in this step

  // The step's verdict, once every device has checked its gradients (found_inf: on any device).
  // Returns true when the step must be skipped. Updates the scale for the next step.
  bool update(bool found_inf);

  long steps() const { return steps_; }
  long skipped() const { return skipped_; }
  int clean_in_a_row() const { return clean_in_a_row_; }

 private:
  Settings settings_;
  float scale_;
  int clean_in_a_row_ = 0;
  long steps_ = 0, skipped_ = 0;
};

}  // namespace mixed
