// Chapter 05: one process per device. Start K copies with an MPI launcher,
//   mpirun -np 2 build/bin/05_multi_process            (one machine)
//   srun --mpi=pmix --ntasks-per-node=8 build/bin/05_multi_process  (a SLURM cluster)
// or run it alone for K = 1. Every copy trains on its own device and its own block of every
// global batch; rank 0 prints, writes the CSV and the plot.
#include <array>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "collective.h"  // add_collectives: MPI or NCCL between the ranks
#include "common/fashion_mnist.h"  // load_fashion_mnist: the dataset, found and checked
#include "common/memory.h"  // error_text
#include "common/program.h"  // start_program: line-buffered output, OpenMP's waits
#include "common/report.h"  // TrainingLog, plot_runs: the epoch lines, the CSV, the plot
#include "options.h"  // the chapter's flags, and the settings every rank must agree on
#include "rank_device.h"  // RankDevice: this rank's one device
#include "train.h"  // train, profile_steps: one rank's epoch loop and step
#include "world.h"  // World, MpiSession: the ranks and MPI's life cycle

namespace {

// Every rank's settings on every rank, compared the same way everywhere (options.h): an
// all-gather of their "key=value" texts, first the lengths, then the characters. Every rank
// reaches the same verdict, so on a difference all of them stop here together, and none is
// left waiting in a collective for another. Empty: every rank has the same settings.
std::string compare_across_ranks(const mp::World& w, const mp::Settings& mine) {
  const std::string text = mp::to_text(mine);
  const int length = static_cast<int>(text.size());
  std::vector<int> lengths(w.size), starts(w.size);
  MGPU_CHECK_MPI(MPI_Allgather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, w.comm));
  int total = 0;
  for (int r = 0; r < w.size; ++r) {
    starts[r] = total;
    total += lengths[r];
  }
  std::string all(total, '\0');
  MGPU_CHECK_MPI(MPI_Allgatherv(text.data(), length, MPI_CHAR, all.data(), lengths.data(), starts.data(), MPI_CHAR,
                                w.comm));
  std::vector<mp::Settings> per_rank;
  for (int r = 0; r < w.size; ++r) per_rank.push_back(mp::from_text(all.substr(starts[r], lengths[r])));
  return mp::disagreement(per_rank);
}

// Rank 0 says where the ranks differ (the same on every rank), a line each, then what to do.
void say_disagreement(const mp::World& w, const std::string& differ, const std::string& advice) {
  if (w.rank != 0) return;
  std::string text = mp::kChapter.name + ": ";
  for (const char ch : differ) text += ch == '\n' ? "\n" + mp::kChapter.name + ": " : std::string(1, ch);
  std::fprintf(stderr, "%s; %s\n", text.c_str(), advice.c_str());
}

// Every rank parsed its own command line (mpirun's "A : B" form gives ranks different ones).
// They stop together when any of them refuses its own, so no rank waits for one that left;
// the lowest such rank says why. Then, before any training, every rank must have the same
// settings: ranks that differ would hang in a collective (--epochs) or silently train a run
// that is no one's (--lr). Returns the exit status when the program should stop.
std::optional<int> stop_for_command_line(const mp::World& w, const mp::CommandLine& cl) {
  if (mp::first_rank_where(w, cl.help) < w.size) {
    if (w.rank == 0) std::fputs(mp::usage().c_str(), stdout);
    return 0;
  }
  if (const std::string why = mp::foreign_launcher(w); !why.empty()) {
    std::fprintf(stderr, "%s: %s\nrun with --help for the usage\n", mp::kChapter.name.c_str(), why.c_str());
    return 2;
  }
  const int first_refusing = mp::first_rank_where(w, !cl.error.empty());
  if (first_refusing < w.size) {
    if (w.rank == first_refusing) {
      const std::string who = w.size > 1 ? "rank " + std::to_string(w.rank) + ": " : "";
      std::fprintf(stderr, "%s: %s%s\nrun with --help for the usage\n", mp::kChapter.name.c_str(), who.c_str(),
                   cl.error.c_str());
    }
    return 2;
  }
  const std::string differ = compare_across_ranks(w, mp::settings_to_agree_on(cl.config));
  if (differ.empty()) return std::nullopt;
  say_disagreement(w, differ, "every rank must be started with the same options");
  return 2;
}

// The run's settings, for its name and its JSON: the shared flags (--devices is the number of
// ranks) and this chapter's own. The collective is the one chosen, which may differ from the
// one asked for (nccl falls back to mpi where ranks share a GPU). The checkpoint's files name
// no setting: a resumed run continues the run, and is named as it is.
mgpu::RunSettings run_settings(const mp::Config& c) {
  mgpu::RunSettings s = mgpu::shared_settings(c.o, mp::kChapter);
  const mp::FaultInjection& f = c.fault;
  const bool fault = f.rank >= 0;
  s.insert(s.end(), {
      {"collective", mp::collective_name(c.collective), mp::collective_name(mp::default_collective())},
      {"overlap", c.overlap ? "on" : "off", "on"},
      {"checkpoint", c.checkpoint, "", false},
      {"resume", c.resume, "", false},
      {"profile-steps", std::to_string(c.profile_steps), std::to_string(mp::Config{}.profile_steps)},
      {"fail-rank", fault ? std::to_string(f.rank) : "none", "none"},
      {"fail-at-step", !fault ? "none" : f.at_end ? "end" : std::to_string(f.step), "none"},
      {"fail-how", !fault ? "none" : f.how == mp::FailHow::Kill ? "kill" : "error", "none"},
  });
  return s;
}

void print_profile(const std::array<mp::StepProfile, 2>& p, int steps, int ranks) {
  const mp::StepProfile &off = p[0], &on = p[1];
  std::printf("per step (mean of %d steps each, alternating, device synchronized between phases, averaged over "
              "%d rank(s)):\n",
              steps, ranks);
  for (const auto& [name, t] : {std::pair{"overlap off", off}, std::pair{"overlap on ", on}})
    std::printf("  %s  %.2f ms = compute %.2f + waiting for the allreduce %.3f + sgd %.3f\n", name, t.step, t.compute,
                t.wait, t.update);
  const double saved = off.step - on.step;
  std::printf("  overlap saves %.3f ms per step (%.1f%%)\n", saved, off.step > 0 ? 100 * saved / off.step : 0.0);
  // A negative saving is a measurement, not a bug to hide: say what it means.
  if (saved < 0)
    std::printf("  (negative: the steps with overlap on took longer. Overlap helps only where the allreduce can\n"
                "  hide behind the backward pass; where ranks share cores, its per-layer calls compete with the\n"
                "  compute, and on a busy machine either figure moves by more than the saving: see the chapter\n"
                "  README, \"What overlap saves here\")\n");
}

// The traced steps of every rank, as one CSV on rank 0: <out>/<run>_timeline.csv, one row per
// span (rank, overlap off/on, lane, what, begin and end in ms from the step's start).
void write_timeline(const mp::World& w, const mp::Config& c, const std::string& run,
                    const std::array<mp::StepTrace, 2>& traces) {
  std::string rows;
  for (int m = 0; m < 2; ++m)
    for (const mp::TraceSpan& t : traces[m]) {
      char row[160];
      std::snprintf(row, sizeof row, "%d,%s,%s,%s,%.4f,%.4f\n", w.rank, m ? "on" : "off", t.lane.c_str(),
                    t.what.c_str(), t.begin_ms, t.end_ms);
      rows += row;
    }
  const std::string all = mp::gather_text(w, rows);
  if (w.rank != 0) return;
  const std::string path = (std::filesystem::path(c.o.out) / (run + "_timeline.csv")).string();
  mgpu::write_whole_file(path, "rank,overlap,lane,what,begin_ms,end_ms\n" + all);
  std::printf("wrote %s (one traced step with overlap off and one with it on, every rank)\n", path.c_str());
}

void run(const mp::World& w, mp::Config c) {
  const mp::RankDevice rank_device(w);
  std::string note;
  c.collective = mp::choose_collective(w, c.collective, c.collective_given, rank_device.ranks_per_gpu(), &note);
  if (w.rank == 0 && !note.empty()) std::printf("%s: %s\n", mp::kChapter.name.c_str(), note.c_str());
  const mgpu::Device& d = rank_device.device();
  double machines = w.local_rank == 0 ? 1 : 0;  // one rank per machine counts it
  mp::sum_over_ranks(w, &machines, 1);
  const std::string ranks = mp::gather_lines(w, rank_device.describe());
  if (w.rank == 0)
    std::printf("%s: %d process(es) on %.0f machine(s), backend %s, collective %s, overlap %s\n%s",
                mp::kChapter.name.c_str(), w.size, machines, mgpu::kBackendName, mp::collective_name(c.collective),
                c.overlap ? "on" : "off", ranks.c_str());

  const mgpu::FashionMnist data = mgpu::load_fashion_mnist(c.o.data_dir, c.o.limit_train);  // every rank
  if (w.rank == 0)
    std::printf("Fashion-MNIST from %s: %d training, %d test images; global batch %d = %d block(s) of about %d\n",
                data.dir.c_str(), data.train.count, data.test.count, c.o.batch_size, w.size,
                c.o.batch_size / w.size);
  // The same data and model on every rank, before the first collective of training: ranks may
  // read from different folders (--data-dir, one per machine), but what they read must match.
  // All ranks reach the same verdict here and leave together, as after together() (world.h).
  const std::string differ = compare_across_ranks(w, mp::data_to_agree_on(data, lenet::parameter_count()));
  if (!differ.empty()) {
    say_disagreement(w, differ, "every rank must read the same data (see --data-dir on every machine)");
    throw mp::StoppedTogether(differ, /*failed_rank=*/0, /*failed_here=*/false);  // said once, above
  }

  mgpu::CollectiveMenu menu;
  mp::add_collectives(menu, w, d, rank_device.ranks_per_gpu());
  const std::unique_ptr<mgpu::Collective> allreduce =
      menu.make(mp::collective_name(c.collective), static_cast<std::size_t>(lenet::flat_count()));  // the flat bucket
  const mgpu::RunSettings settings = run_settings(c);
  const std::string run = mgpu::run_name(mp::kChapter.name, c.o.run_name, settings);  // 05_multi_process_devices-2
  std::optional<mgpu::TrainingLog> log;
  if (w.rank == 0) log.emplace(mp::kChapter.name, run, c.o, settings, w.size, data.train.count);
  mp::train(w, d, data, c, *allreduce, log ? &*log : nullptr);

  if (c.profile_steps > 0) {
    const mp::Profile profile = mp::profile_steps(w, d, data, c, *allreduce, c.profile_steps);
    if (w.rank == 0) print_profile(profile.phases, c.profile_steps, w.size);
    write_timeline(w, c, run, profile.traces);
  }
  // The end is a step all ranks take together: rank 0 writes the results while the others wait,
  // and all of them learn whether it worked before any of them leaves.
  mp::finish_together(w, c, log ? &*log : nullptr);
}

void report(const std::string& rank, const char* what) {
  std::fprintf(stderr, "%s: rank %s: error: %s\n", mp::kChapter.name.c_str(), rank.c_str(), what);
}

// An error on this rank alone: the other ranks are (or soon will be) waiting for it in a
// collective, so after saying what went wrong, stop them all.
[[noreturn]] void fail(const std::string& rank, const char* what) {
  report(rank, what);
  mp::abort_all(1);
}

}  // namespace

int main(int argc, char** argv) {
  mgpu::start_program(argv);  // first, before MPI_Init: line-buffered output; it may start the program again
  const mp::MpiSession mpi(argc, argv);  // outside the try: MPI must outlive the abort below
  std::string rank = "?";                // known once MPI has said who this process is
  try {
    const mp::World w = mp::describe_world(MPI_COMM_WORLD);
    rank = std::to_string(w.rank);
    const mp::CommandLine cl = mp::parse_command_line(std::vector<std::string>(argv + 1, argv + argc), w.size);
    if (const std::optional<int> status = stop_for_command_line(w, cl)) return *status;
    run(w, cl.config);
  } catch (const mp::StoppedTogether& e) {
    // Every rank learned of the failure at the same point (mp::together): each rank whose own
    // work failed says why, and all of them leave through MPI_Finalize with status 1. No
    // MPI_Abort: nobody is left waiting, and an abort racing with the others' exit is what
    // crashed or hung mpirun at the end of a run.
    if (e.failed_here()) report(rank, e.what());
    return 1;
  } catch (const std::exception& e) {
    fail(rank, mgpu::error_text(e).c_str());
  } catch (...) {
    fail(rank, "an exception that is not a std::exception");
  }
  return 0;
}
