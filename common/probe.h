// Measuring a step without writing it twice. A training step tells a probe where its phases
// end; the probe it trains with does nothing, and a timed or traced run passes the same step a
// probe that waits for the devices and reads the clock (PhaseTimer), or stamps the devices'
// streams (StreamStamps). So the step that is measured is the step that trains: a change to one
// cannot leave the other behind.
//
//   void train_step(..., mgpu::StepProbe& probe = mgpu::no_probe()) {
//     compute_gradients(...);   probe.phase_done("compute");
//     allreduce(...);           probe.phase_done("allreduce");
//     sgd(...);                 probe.phase_done("update");
//   }
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "device.h"

namespace mgpu {

class StepProbe {
 public:
  virtual ~StepProbe() = default;
  // The step has queued (or, on the host, done) its phase `phase`; the next phase starts now.
  virtual void phase_done(const std::string& phase) { (void)phase; }
  // Inside a phase: the step is about to queue device `device`'s share of it / has queued it.
  virtual void device_began(int device) { (void)device; }
  virtual void device_ended(int device) { (void)device; }
  // A moment inside a phase worth seeing on a timeline ("layer 3 complete"); nobody waits for it.
  virtual void moment(const std::string& what) { (void)what; }
};

// The probe a step trains with: it does nothing.
StepProbe& no_probe();

// Times a step's phases: at every phase's end it waits for the devices (synchronize) and reads
// the clock, so each phase's time is its own (the waits also keep the phases from overlapping,
// as they do in training: for measuring only). Inside a phase, device i's share is stamped on its
// stream (device_began/ended, when the step tells them), in seconds from the phase's start:
// shares that overlap ran at the same time; shares that follow each other took turns.
class PhaseTimer : public StepProbe {
 public:
  struct Phase {
    std::string name;
    double seconds = 0;  // summed over the steps timed
    std::vector<double> device_began, device_ended;  // [device], summed; empty if never told
  };
  // devices: those the step's device_began/ended numbers name (may be empty).
  PhaseTimer(std::function<void()> synchronize, std::vector<const Device*> devices = {});
  // Starts (or restarts) the clock: call before each step, with the devices idle or not.
  void start_step();
  void phase_done(const std::string& phase) override;
  void device_began(int device) override;
  void device_ended(int device) override;
  const std::vector<Phase>& phases() const { return phases_; }  // in the order the step named them
  const Phase* phase(const std::string& name) const;  // nullptr for a phase never seen
  double seconds(const std::string& name) const;      // 0 for a phase never seen

 private:
  double synchronized_now() const;
  std::function<void()> synchronize_;
  std::vector<const Device*> devices_;
  std::vector<Phase> phases_;
  double phase_start_ = 0;
  std::vector<Timestamp> began_, ended_;  // this phase's stamps, [device]
  std::vector<bool> stamped_;
};

// Stamps one device's stream at every phase end and moment, with the host's clock beside it,
// without waiting for anything: a traced step runs as it trains. spans() reads them after the
// step (Timestamp::seconds waits for each stamp).
class StreamStamps : public StepProbe {
 public:
  struct Span {
    std::string what;
    double begin_s = 0, end_s = 0;  // on steady_seconds()' clock
  };
  // start_s: when the step began (the device idle).
  StreamStamps(const Device& d, double start_s) : d_(d), start_s_(start_s) {}
  void phase_done(const std::string& phase) override;
  void moment(const std::string& what) override;
  // Each phase from the previous phase's end to its own (on the device's stream), then each
  // moment as a span of zero length.
  std::vector<Span> spans() const;

 private:
  const Device& d_;
  double start_s_;
  std::vector<std::pair<std::string, Timestamp>> phases_, moments_;
};

}  // namespace mgpu
