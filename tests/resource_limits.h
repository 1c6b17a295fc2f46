// Resource limits, for the tests that need a real failure rather than a simulated one: the
// kernel refuses what goes past a limit (a file past RLIMIT_FSIZE, as a full disk refuses it; a
// mapping past RLIMIT_AS, a thread's stack say), and root is held to both, where it is not held
// to file permissions.
#pragma once
#include <doctest/doctest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <fstream>

namespace testing {

// Built with a sanitizer? Sanitizers map shadow memory as a program allocates, and do not work
// under a capped address space (AddressSanitizer also ends the program where an allocation fails,
// instead of throwing std::bad_alloc): such builds leave the address-space caps out.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

// A resource limit of this process, set for the scope of one check and restored after it.
struct ScopedLimit {
  int resource;
  rlimit saved{};
  ScopedLimit(int r, rlim_t soft) : resource(r) {
    getrlimit(resource, &saved);
    rlimit lowered = saved;
    lowered.rlim_cur = std::min(soft, saved.rlim_max);
    REQUIRE(setrlimit(resource, &lowered) == 0);
  }
  ~ScopedLimit() { setrlimit(resource, &saved); }
  ScopedLimit(const ScopedLimit&) = delete;
  ScopedLimit& operator=(const ScopedLimit&) = delete;
};

// Files of this process may not grow past `bytes` for the scope: a write past it fails with
// EFBIG, as one on a full disk fails with ENOSPC. SIGXFSZ, which would end the process instead,
// is ignored meanwhile (set before the limit, restored after it).
struct FileSizeLimit {
  struct IgnoredSignal {
    void (*previous)(int) = std::signal(SIGXFSZ, SIG_IGN);
    ~IgnoredSignal() { std::signal(SIGXFSZ, previous); }
  } ignored;
  ScopedLimit limit;
  explicit FileSizeLimit(rlim_t bytes) : limit(RLIMIT_FSIZE, bytes) {}
};

// The address space this process maps now, in bytes (for a cap relative to it).
inline rlim_t address_space_now() {
  std::ifstream statm("/proc/self/statm");
  rlim_t pages = 0;
  statm >> pages;
  return pages * static_cast<rlim_t>(sysconf(_SC_PAGESIZE));
}

// The address space capped at what this process maps now plus `headroom` bytes, for the scope:
// a larger allocation fails for real. (Not for sanitized builds: kSanitized says why.)
struct AddressSpaceHeadroom {
  ScopedLimit limit;
  explicit AddressSpaceHeadroom(rlim_t headroom) : limit(RLIMIT_AS, address_space_now() + headroom) {}
};

}  // namespace testing
