// What every program of this repository does first, before it prints anything.
//
//   - Its output is line-buffered. The C library buffers 4 KiB of stdout before writing it when
//     stdout is not a terminal (a log file, a pipe, a scheduler's log): the lines a run prints
//     before its first epoch ends would appear only then, and a job killed before would leave an
//     empty log. Line by line, each line is in the log when it is printed.
//   - Output that cannot be written (a full disk, /dev/full) fails the program: at exit it
//     says so on stderr and the status is 1, not 0 with the log silently cut.
//   - OpenMP's idle threads sleep instead of spinning (common/openmp_waits.h: the cpu build may
//     start the program again to set it).
#pragma once

namespace mgpu {

// Call first thing in main(), before MPI_Init or any output.
void start_program(char** argv);

}  // namespace mgpu
