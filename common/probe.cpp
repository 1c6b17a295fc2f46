#include "probe.h"

#include <algorithm>
#include <utility>

#include "check.h"
#include "timer.h"

namespace mgpu {

StepProbe& no_probe() {
  static StepProbe nothing;
  return nothing;
}

PhaseTimer::PhaseTimer(std::function<void()> synchronize, std::vector<const Device*> devices)
    : synchronize_(std::move(synchronize)),
      devices_(std::move(devices)),
      began_(devices_.size()),
      ended_(devices_.size()),
      stamped_(devices_.size(), false) {}

double PhaseTimer::synchronized_now() const {
  synchronize_();
  return steady_seconds();
}

void PhaseTimer::start_step() { phase_start_ = synchronized_now(); }

void PhaseTimer::device_began(int device) {
  if (device < 0 || device >= static_cast<int>(devices_.size()))
    throw Error("PhaseTimer: device " + std::to_string(device) + " is not one of the " +
                std::to_string(devices_.size()) + " it times");
  began_[device].record(*devices_[device]);
  stamped_[device] = true;
}

void PhaseTimer::device_ended(int device) {
  if (device < 0 || device >= static_cast<int>(devices_.size()) || !stamped_[device])
    throw Error("PhaseTimer: device_ended(" + std::to_string(device) + ") without its device_began");
  ended_[device].record(*devices_[device]);
}

void PhaseTimer::phase_done(const std::string& phase) {
  const double now = synchronized_now();
  auto it = std::find_if(phases_.begin(), phases_.end(), [&](const Phase& p) { return p.name == phase; });
  if (it == phases_.end()) it = phases_.insert(phases_.end(), Phase{phase, 0, {}, {}});
  it->seconds += now - phase_start_;
  for (std::size_t i = 0; i < devices_.size(); ++i) {
    if (!stamped_[i]) continue;
    it->device_began.resize(devices_.size(), 0.0);
    it->device_ended.resize(devices_.size(), 0.0);
    it->device_began[i] += began_[i].seconds() - phase_start_;
    it->device_ended[i] += ended_[i].seconds() - phase_start_;
    stamped_[i] = false;
  }
  phase_start_ = now;
}

const PhaseTimer::Phase* PhaseTimer::phase(const std::string& name) const {
  for (const Phase& p : phases_)
    if (p.name == name) return &p;
  return nullptr;
}

double PhaseTimer::seconds(const std::string& name) const {
  const Phase* p = phase(name);
  return p ? p->seconds : 0;
}

void StreamStamps::phase_done(const std::string& phase) { phases_.emplace_back(phase, Timestamp{}).second.record(d_); }

void StreamStamps::moment(const std::string& what) { moments_.emplace_back(what, Timestamp{}).second.record(d_); }

std::vector<StreamStamps::Span> StreamStamps::spans() const {
  std::vector<Span> out;
  double begin = start_s_;
  for (const auto& [phase, stamp] : phases_) {
    const double end = stamp.seconds();
    out.push_back({phase, begin, end});
    begin = end;
  }
  for (const auto& [what, stamp] : moments_) out.push_back({what, stamp.seconds(), stamp.seconds()});
  return out;
}

}  // namespace mgpu
