// How OpenMP threads wait (cpu build), chosen before the program does anything else.
//
// An OpenMP thread that reaches a barrier before the others does not sleep at once: by default
// GCC's runtime spins for a while, burning its core, in case the others are about to arrive.
// On an idle machine that saves a few microseconds per barrier. On a busy one it is a disaster:
// the thread a spinner waits for may be waiting for the very core the spinner occupies. With one
// other busy process on a 2-core machine, chapter 01 measured 6.6 s per epoch spinning and 2.7 to
// 3.1 s with passive waits (alone: 1.45 to 1.50 s either way); a fair share of the cores is ~2.9.
//
// The runtime reads OMP_WAIT_POLICY once, when it is loaded, before main() starts: too early
// for the program to set it. So where the user has not chosen, the program sets
// OMP_WAIT_POLICY=passive and starts itself again (execv of /proc/self/exe, same arguments, same
// process id, nothing done yet). A user who wants spinning back sets OMP_WAIT_POLICY=active.
#pragma once

namespace mgpu {

// Call first thing in main(), before MPI_Init or any OpenMP call. Returns normally when nothing
// needs doing (the cuda build; OMP_WAIT_POLICY already set) or when the restart fails.
void use_passive_openmp_waits(char** argv);

}  // namespace mgpu
