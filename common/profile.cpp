#include "profile.h"

#include <cxxabi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>

#include "check.h"

namespace mgpu {

namespace {
// The one active profile, and the device it times. Set and cleared on the host thread that
// queues work; read by that thread when it queues kernels.
KernelProfile* active = nullptr;
int active_device = -1;
}  // namespace

struct KernelProfile::Impl {
  const Device* device;
  struct Call {
    std::string name;
    double flops, bytes, seconds = 0;
#if MGPU_CUDA
    cudaEvent_t start = nullptr, stop = nullptr;
#endif
  };
  std::mutex mutex;          // cpu: lanes' threads report their times at once
  std::vector<Call> calls;   // reserved up front: a call's slot never moves while it is timed
};

KernelProfile::KernelProfile(const Device& d) : impl_(std::make_unique<Impl>()) {
  if (active) throw Error("KernelProfile: one profile at a time");
  impl_->device = &d;
  impl_->calls.reserve(1 << 16);
  active = this;
  active_device = d.id;
}

KernelProfile::~KernelProfile() {
  active = nullptr;
  active_device = -1;
#if MGPU_CUDA
  try {
    synchronize(*impl_->device);
  } catch (...) {  // reported by whoever synchronizes next
  }
  for (Impl::Call& c : impl_->calls) {
    if (c.start) cudaEventDestroy(c.start);
    if (c.stop) cudaEventDestroy(c.stop);
  }
#else
  try {
    synchronize(*impl_->device);  // the worker may still report into calls
  } catch (...) {
  }
#endif
}

// The device and its stream: a SideStream's device has the same id and another stream, and
// work queued there is not timed (the events would land on the wrong stream).
KernelProfile* KernelProfile::of(const Device& d) {
  return active && d.id == active_device && d.stream == active->impl_->device->stream ? active : nullptr;
}

int KernelProfile::begin(const std::string& name, double flops, double bytes) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  if (impl_->calls.size() == impl_->calls.capacity()) throw Error("KernelProfile: too many calls for one profile");
  impl_->calls.push_back({name, flops, bytes});
#if MGPU_CUDA
  Impl::Call& c = impl_->calls.back();
  activate(*impl_->device);
  MGPU_CHECK_CUDA(cudaEventCreate(&c.start));
  MGPU_CHECK_CUDA(cudaEventCreate(&c.stop));
  MGPU_CHECK_CUDA(cudaEventRecord(c.start, impl_->device->stream));
#endif
  return static_cast<int>(impl_->calls.size()) - 1;
}

void KernelProfile::end(int call) {
#if MGPU_CUDA
  MGPU_CHECK_CUDA(cudaEventRecord(impl_->calls[call].stop, impl_->device->stream));
#else
  (void)call;
#endif
}

void KernelProfile::took(int call, double seconds) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->calls[call].seconds = seconds;
}

std::vector<KernelStats> KernelProfile::table() {
  synchronize(*impl_->device);
  std::map<std::string, KernelStats> by_name;
  std::lock_guard<std::mutex> lock(impl_->mutex);
  for (Impl::Call& c : impl_->calls) {
#if MGPU_CUDA
    float ms = 0;
    MGPU_CHECK_CUDA(cudaEventElapsedTime(&ms, c.start, c.stop));
    c.seconds = ms * 1e-3;
#endif
    KernelStats& s = by_name[c.name];
    s.name = c.name;
    ++s.calls;
    s.seconds += c.seconds;
    s.flops += c.flops;
    s.bytes += c.bytes;
  }
  std::vector<KernelStats> rows;
  for (auto& [name, s] : by_name) rows.push_back(s);
  std::sort(rows.begin(), rows.end(), [](const KernelStats& a, const KernelStats& b) { return a.seconds > b.seconds; });
  return rows;
}

std::string format_profile(const std::vector<KernelStats>& rows) {
  double total = 0;
  int calls = 0;
  for (const KernelStats& r : rows) total += r.seconds, calls += r.calls;
  std::string out;
  char line[256];
  std::snprintf(line, sizeof line, "%-28s %6s %11s %7s %9s %8s\n", "kernel", "calls", "time (us)", "share", "GFLOP/s",
                "GB/s");
  out += line;
  for (const KernelStats& r : rows) {
    char gflops[16] = "", gbs[16] = "";
    if (r.flops > 0 && r.seconds > 0) std::snprintf(gflops, sizeof gflops, "%.1f", r.flops / r.seconds * 1e-9);
    if (r.bytes > 0 && r.seconds > 0) std::snprintf(gbs, sizeof gbs, "%.1f", r.bytes / r.seconds * 1e-9);
    std::snprintf(line, sizeof line, "%-28s %6d %11.1f %6.1f%% %9s %8s\n", r.name.c_str(), r.calls, r.seconds * 1e6,
                  total > 0 ? 100 * r.seconds / total : 0.0, gflops, gbs);
    out += line;
  }
  std::snprintf(line, sizeof line, "%-28s %6d %11.1f %6.1f%%\n", "total", calls, total * 1e6, 100.0);
  out += line;
  return out;
}

std::string kernel_name_of(const char* mangled) {
  int status = 0;
  char* demangled = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string name = status == 0 && demangled ? demangled : mangled;
  std::free(demangled);
  // for_each_span's wrappers: mgpu::SpanWhole<F>, mgpu::SpanElement<F> -> F
  if (name.rfind("mgpu::Span", 0) == 0 && name.find('<') != std::string::npos)
    name = name.substr(name.find('<') + 1, name.rfind('>') - name.find('<') - 1);
  // Namespaces off: what follows the last "::" outside template arguments.
  const std::size_t bracket = name.find('<');
  const std::size_t colons = name.rfind("::", bracket == std::string::npos ? std::string::npos : bracket);
  if (colons != std::string::npos) name = name.substr(colons + 2);
  return name;
}

}  // namespace mgpu
