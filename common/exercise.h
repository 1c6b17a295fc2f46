// What a hole of the student copy does when the program reaches it.
//
// The solution code marks each exercise's region between two comment lines,
//   // BEGIN EXERCISE ex01.relu_backward
//   ...
//   // END EXERCISE ex01.relu_backward
// and student_copy (tools/classroom/) replaces the region by a call of exercise_not_done(). The repository
// itself never calls it: a file with a hole includes this header so that its student copy builds.
#pragma once
#include <cstdio>

#include "backend.h"

// The message, one format for the host and the GPU (a literal: device code can print only
// those): the exercise, then the README whose "Fill the holes" section describes it.
#define MGPU_EXERCISE_MESSAGE \
  "exercise %s is not done yet: it is a hole of this student copy; see %s, \"Fill the holes\"\n"

namespace mgpu {

// Host side: prints which exercise is missing and where to read about it, then ends the
// program with exit status 1. It does not throw, because a hole may be reached inside a
// kernel that a cpu device's worker thread runs, where an exception could not be carried to
// the caller; ending the process works the same from any thread.
[[noreturn]] void report_exercise_not_done(const char* exercise, const char* readme);

// Callable from host code and from kernels. On a GPU a kernel cannot end the process: the
// thread prints the message and traps, the kernel fails, and the next checked CUDA call
// reports the failure and stops the program.
[[noreturn]] MGPU_HD inline void exercise_not_done(const char* exercise, const char* readme) {
#if defined(__CUDA_ARCH__)
  printf(MGPU_EXERCISE_MESSAGE, exercise, readme);
  __trap();
  __builtin_unreachable();
#else
  report_exercise_not_done(exercise, readme);
#endif
}

}  // namespace mgpu
