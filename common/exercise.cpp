#include "exercise.h"

#include <cstdlib>

namespace mgpu {

void report_exercise_not_done(const char* exercise, const char* readme) {
  std::fflush(stdout);  // what the program printed so far comes first
  std::fprintf(stderr, MGPU_EXERCISE_MESSAGE, exercise, readme);
  std::fflush(stderr);
  // _Exit, not exit: other threads (a device's worker, OpenMP's) may be running, and exit()
  // would destroy objects they are using.
  std::_Exit(1);
}

}  // namespace mgpu
