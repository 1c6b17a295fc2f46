#include "program.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "openmp_waits.h"

namespace mgpu {
namespace {

std::string program_name = "program";  // argv[0]'s last part, for the message below

// At exit: the output the program printed must have reached its file. A full disk, /dev/full
// or a file-size limit loses it silently otherwise (the C library only marks the stream), and
// a run whose log is cut would still end with status 0.
void check_standard_output() {
  errno = 0;
  const bool flushed = std::fflush(stdout) == 0;
  if (flushed && !std::ferror(stdout)) return;
  const std::string reason = !flushed && errno != 0 ? std::strerror(errno) : "an earlier write failed";
  std::fprintf(stderr, "%s: error: the standard output could not be written (%s): its output is incomplete\n",
               program_name.c_str(), reason.c_str());
  std::_Exit(1);  // inside exit(): a second exit() would be undefined
}

}  // namespace

void start_program(char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // before anything is printed, as setvbuf requires
  if (argv && argv[0]) {
    program_name = argv[0];
    program_name = program_name.substr(program_name.find_last_of('/') + 1);
  }
  std::atexit(check_standard_output);
  use_passive_openmp_waits(argv);
}

}  // namespace mgpu
