#include "openmp_waits.h"

#include <unistd.h>

#include <cstdlib>

#include "backend.h"

namespace mgpu {

void use_passive_openmp_waits(char** argv) {
  if (kCudaBackend) return;  // the GPU does the work: no OpenMP team waits at barriers
  if (std::getenv("OMP_WAIT_POLICY") != nullptr) return;  // the user's choice, or our restart
  if (setenv("OMP_WAIT_POLICY", "passive", 1) != 0) return;
  execv("/proc/self/exe", argv);
  // Only reached if exec failed (no /proc): carry on with the runtime's default.
}

}  // namespace mgpu
