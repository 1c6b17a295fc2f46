// Chapter 05's command line: the flags every chapter shares (common/cli.h), and its own:
//   --collective nccl|mpi  --overlap on|off  --checkpoint FILE  --resume FILE
//   --profile-steps N  --fail-rank R --fail-at-step S|end [--fail-how error|kill]
// The number of devices is the number of processes mpirun started: --devices K is accepted
// only when K is that number.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "common/cli.h"
#include "train.h"

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

// ---- Every rank must run the same training ------------------------------------------------
//
// Each rank parses its own command line, and mpirun's "A : B" form gives ranks different ones.
// Ranks that differ in --epochs or --batch-size take different numbers of steps, so one of
// them waits forever in a collective the others never reach; ranks that differ in --lr or
// --seed meet in every collective and silently train something that is no one's run. So at
// start-up every rank sends every other one the settings below, and all of them compare: the
// same verdict everywhere, so on a difference they all stop together, before any training.

// One thing every rank must share: an option ("--epochs") or what it names ("the training
// set"), and its value as text ("1"; "512 images of 28x28 (checksum ...)").
struct Setting {
  std::string key, value;
  bool operator==(const Setting& o) const { return key == o.key && value == o.value; }
};
using Settings = std::vector<Setting>;

// Every option that shapes the training or its collectives, as the parsed Config holds it.
Settings settings_to_agree_on(const Config& c);
// The data and the model: each set's size and a checksum of its images and labels, and the
// number of parameters. (Ranks may read the data from different folders, on different machines:
// what they read must be the same.)
Settings data_to_agree_on(const mgpu::FashionMnist& data, std::int64_t parameters);

// One "key=value" line per setting, and back: how the settings travel between ranks.
std::string to_text(const Settings& s);
Settings from_text(const std::string& text);

// Pure: per_rank[r] holds rank r's settings. Empty when every rank has the same; otherwise one
// line per setting on which they differ, naming the values and the ranks:
//   ranks disagree on --epochs: rank 0 has 1, rank 1 has 2
//   ranks disagree on --lr: ranks 0-2,4 have 0.2, rank 3 has 0.1
// A setting a rank lacks (a different build of the program) counts as the value "(none)".
std::string disagreement(const std::vector<Settings>& per_rank);

}  // namespace mp
