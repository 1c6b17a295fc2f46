// Chapter 05's command line: the flags every chapter shares (common/cli.h), and its own:
//   --collective nccl|mpi  --overlap on|off  --checkpoint FILE  --resume FILE
//   --profile-steps N  --fail-rank R --fail-at-step S|end [--fail-how error|kill]
// The number of devices is the number of processes mpirun started: --devices K is accepted
// only when K is that number.
#pragma once
#include <string>
#include <vector>

#include "common/cli.h"
#include "multi_process.h"

namespace mp {

extern const mgpu::ChapterInfo kChapter;

struct CommandLine {
  Config config;
  bool help = false;
  std::string error;  // non-empty: why the command line was refused
};

// Pure (no printing, no exiting, no MPI), so the tests can call it. world_size: the number of
// processes the run has.
CommandLine parse_command_line(const std::vector<std::string>& args, int world_size);

std::string usage();

}  // namespace mp
