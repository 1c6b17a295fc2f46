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
//
// And what every program then does the same way: load the data and say from where, and end with
// a one-line message and status 1 on an error, whatever part of the program raised it.
#pragma once
#include <functional>
#include <string>

#include "cli.h"
#include "fashion_mnist.h"

namespace mgpu {

// Call first thing in main(), before MPI_Init or any output.
void start_program(char** argv);

// Fashion-MNIST as the options say (--data-dir, --limit-train; load_fashion_mnist), after a
// line saying where it came from and how many images it holds.
FashionMnist load_data(const Options& o);

// Runs a program's body and returns its exit status; an exception that escapes the body is
// printed as "<program>: error: <what>" (error_text) on stderr, and the status is then 1.
int run_or_report(const std::string& program, const std::function<int()>& body);

}  // namespace mgpu
