// What cpu_stream.h declares: a queue and a worker thread per cpu device, the lanes of one
// device run as one queued operation, and chaos mode. Built in the cpu backend only.
#include "cpu_stream.h"

#include <omp.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <exception>
#include <limits>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "check.h"
#include "threads.h"

namespace mgpu::cpu {

namespace {

// How many operations may wait in one queue before submit() blocks the host (a GPU's launch
// queue is about this deep). Without a bound the host could queue a whole epoch ahead.
constexpr std::uint64_t kMaxQueued = 1024;
// Chaos mode's longest delay, in microseconds: long beside a small kernel or copy, short
// enough that the suites still run in seconds.
constexpr int kMaxChaosMicroseconds = 200;

// The lane being recorded by this host thread (run_lanes), if any.
struct Recording {
  const Stream* stream;
  std::vector<std::function<void()>>* lane;
};
thread_local Recording* recording = nullptr;

void refuse_inside_lane(const char* what) {
  if (recording)
    throw Error(std::string(what) + " inside for_each_lane: a lane may only queue kernels and copies "
                "on its own device (events and host waits belong outside the lanes)");
}

// Set on each worker thread under chaos mode: the draws of that stream's delays.
thread_local std::mt19937_64* chaos_rng = nullptr;

int chaos_delay_us() {
  return std::uniform_int_distribution<int>(0, kMaxChaosMicroseconds)(*chaos_rng);
}

void sleep_us(int us) {
  if (us > 0) std::this_thread::sleep_for(std::chrono::microseconds(us));
}

// Every live stream, so that freeing memory can wait for all of them.
std::mutex streams_mutex;
std::set<Stream*>& live_streams() {
  static auto* streams = new std::set<Stream*>;  // never destroyed: streams may outlive statics
  return *streams;
}

}  // namespace

std::optional<std::uint64_t> chaos_seed() {
  static const std::optional<std::uint64_t> seed = []() -> std::optional<std::uint64_t> {
    const char* text = std::getenv("MGPU_CHAOS");
    if (!text || !*text) return std::nullopt;
    // Digits only, and no more than 64 bits hold (strtoull would take "+5" and " 5", and read a
    // number too large for it as the largest it holds).
    const std::string digits = text;
    errno = 0;
    const unsigned long long value = std::strtoull(text, nullptr, 10);
    if (digits.find_first_not_of("0123456789") != std::string::npos || errno == ERANGE)
      throw Error("MGPU_CHAOS must be a seed, a whole number from 0 to " +
                  std::to_string(std::numeric_limits<std::uint64_t>::max()) + ", got '" + digits + "'");
    return value;
  }();
  return seed;
}

struct Stream::State {
  struct Operation {
    std::function<void()> run;
    bool marker;  // an event's record or wait: runs even after an error
  };
  std::mutex mutex;
  std::condition_variable work_queued;  // the worker waits on it
  std::condition_variable work_done;    // the host waits on it
  std::deque<Operation> queue;
  std::uint64_t submitted = 0, completed = 0;
  bool stopping = false;
  std::exception_ptr error;  // the first failure; later work is skipped
  std::thread worker;

  void enqueue(Operation op) {
    std::unique_lock<std::mutex> lock(mutex);
    work_done.wait(lock, [&] { return submitted - completed < kMaxQueued; });
    queue.push_back(std::move(op));
    ++submitted;
    work_queued.notify_one();
  }

  void run_worker(int threads, std::optional<std::uint64_t> chaos) {
    omp_set_num_threads(threads);  // this thread's kernels and lanes use the device's share
    std::mt19937_64 rng(chaos.value_or(0));
    if (chaos) chaos_rng = &rng;
    for (;;) {
      Operation op;
      {
        std::unique_lock<std::mutex> lock(mutex);
        work_queued.wait(lock, [&] { return stopping || !queue.empty(); });
        if (queue.empty()) return;  // stopping, and nothing left to run
        op = std::move(queue.front());
        queue.pop_front();
      }
      if (chaos) sleep_us(chaos_delay_us());
      bool skip;
      {
        std::lock_guard<std::mutex> lock(mutex);
        skip = error && !op.marker;
      }
      std::exception_ptr failure;
      if (!skip) {
        try {
          op.run();
        } catch (...) {
          failure = std::current_exception();
        }
      }
      {
        std::lock_guard<std::mutex> lock(mutex);
        if (failure && !error) error = failure;
        ++completed;
      }
      work_done.notify_all();
    }
  }
};

Stream::Stream(int threads, std::uint64_t chaos_salt) : state_(new State), threads_(threads < 1 ? 1 : threads) {
  std::optional<std::uint64_t> chaos = chaos_seed();
  if (chaos) *chaos = *chaos * 0x9E3779B97F4A7C15ull + chaos_salt;  // one seed, a different draw per stream
  try {
    state_->worker =
        start_thread("a cpu device's worker thread", [this, chaos] { state_->run_worker(threads_, chaos); });
  } catch (...) {
    delete state_;  // the destructor does not run for a constructor that throws
    throw;
  }
  const std::lock_guard<std::mutex> lock(streams_mutex);
  live_streams().insert(this);
}

Stream::~Stream() {
  {
    const std::lock_guard<std::mutex> lock(streams_mutex);
    live_streams().erase(this);
  }
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->stopping = true;
  }
  state_->work_queued.notify_one();
  state_->worker.join();  // the worker runs what is queued first
  delete state_;
}

void Stream::submit(std::function<void()> work) {
  if (recording) {
    if (recording->stream != this)
      throw Error("for_each_lane: a lane queued work on another device; a device's lanes work on that device only");
    recording->lane->push_back(std::move(work));
    return;
  }
  state_->enqueue({std::move(work), false});
}

void Stream::submit_marker(std::function<void()> mark) {
  refuse_inside_lane("an event's record or wait");
  state_->enqueue({std::move(mark), true});
}

void Stream::wait() {
  refuse_inside_lane("a host wait (synchronize, download, upload)");
  std::unique_lock<std::mutex> lock(state_->mutex);
  const std::uint64_t target = state_->submitted;
  state_->work_done.wait(lock, [&] { return state_->completed >= target; });
  if (state_->error) std::rethrow_exception(state_->error);
}

void Stream::wait_quietly() noexcept {
  std::unique_lock<std::mutex> lock(state_->mutex);
  const std::uint64_t target = state_->submitted;
  state_->work_done.wait(lock, [&] { return state_->completed >= target; });
}

bool Stream::idle() const {
  const std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->completed == state_->submitted;
}

void run_lanes(Stream& s, int lanes, const std::function<void(int lane)>& record_lane) {
  refuse_inside_lane("for_each_lane");
  using Work = std::vector<std::function<void()>>;
  auto work = std::make_shared<std::vector<Work>>(lanes);  // shared: the queued operation outlives this call
  for (int lane = 0; lane < lanes; ++lane) {
    Recording r{&s, &(*work)[lane]};
    recording = &r;
    try {
      record_lane(lane);
    } catch (...) {
      recording = nullptr;
      throw;
    }
    recording = nullptr;
  }
  s.submit([work] {
    const int n = static_cast<int>(work->size());
    std::vector<int> delay_us(n, 0);  // chaos mode: each lane starts late by its own amount
    if (chaos_rng)
      for (int& us : delay_us) us = chaos_delay_us();
    std::vector<std::exception_ptr> errors(n);
#pragma omp parallel for schedule(static, 1) num_threads(n)
    for (int lane = 0; lane < n; ++lane) {
      try {  // an exception must not escape an OpenMP region
        sleep_us(delay_us[lane]);
        for (const std::function<void()>& op : (*work)[lane]) op();
      } catch (...) {
        errors[lane] = std::current_exception();
      }
    }
    for (const std::exception_ptr& e : errors)
      if (e) std::rethrow_exception(e);
  });
}

void wait_for_all_streams() noexcept {
  const std::lock_guard<std::mutex> lock(streams_mutex);
  for (Stream* s : live_streams()) s->wait_quietly();
}

}  // namespace mgpu::cpu
