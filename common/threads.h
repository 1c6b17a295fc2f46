// Starting a thread, with a message when it cannot start.
//
// A thread may fail to start: the system limits how many threads a user runs (ulimit -u) and
// how much memory a process maps (ulimit -v; every thread maps a stack, 8 MiB by default).
// std::thread then throws std::system_error, whose message ("Resource temporarily unavailable")
// says neither which thread nor which limit. start_thread says both.
#pragma once
#include <string>
#include <system_error>
#include <thread>
#include <utility>

#include "check.h"

namespace mgpu {

// A thread running f(); throws mgpu::Error naming `what` ("the worker thread of cpu device 3")
// where it cannot start.
template <class F>
std::thread start_thread(const std::string& what, F&& f) {
  try {
    return std::thread(std::forward<F>(f));
  } catch (const std::system_error& e) {
    throw Error("cannot start " + what + ": " + e.what() +
                " (too many threads, or too little memory for another one's stack: see ulimit -u and ulimit -v)");
  }
}

}  // namespace mgpu
