#include "program.h"

#include <cstdio>

#include "openmp_waits.h"

namespace mgpu {

void start_program(char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // before anything is printed, as setvbuf requires
  use_passive_openmp_waits(argv);
}

}  // namespace mgpu
