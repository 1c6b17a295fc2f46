// A tiny tracer. The few places a profile wants to see inside code that is being taught (a
// collective's host calls, say) call mgpu::trace(what, begin, end); while nobody records, that
// costs one test of an empty function, and the code reads like the algorithm, not like its
// measurement. Recording is per thread: a TraceRecording sends this thread's spans to the
// profiler's function for as long as it lives.
#pragma once
#include <functional>
#include <string>
#include <utility>

namespace mgpu {

// Receives one span: what was done, from begin_s to end_s (seconds on steady_seconds()' clock).
using TraceSink = std::function<void(const std::string& what, double begin_s, double end_s)>;

inline TraceSink& this_thread_trace_sink() {
  thread_local TraceSink sink;
  return sink;
}

inline bool tracing() { return static_cast<bool>(this_thread_trace_sink()); }

inline void trace(const std::string& what, double begin_s, double end_s) {
  if (tracing()) this_thread_trace_sink()(what, begin_s, end_s);
}

// While it lives, this thread's trace() calls go to `sink`; afterwards, where they went before.
class TraceRecording {
 public:
  explicit TraceRecording(TraceSink sink) : previous_(std::exchange(this_thread_trace_sink(), std::move(sink))) {}
  ~TraceRecording() { this_thread_trace_sink() = std::move(previous_); }
  TraceRecording(const TraceRecording&) = delete;
  TraceRecording& operator=(const TraceRecording&) = delete;

 private:
  TraceSink previous_;
};

}  // namespace mgpu
