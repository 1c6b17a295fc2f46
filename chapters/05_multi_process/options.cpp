#include "options.h"

#include <functional>
#include <map>

namespace mp {

const mgpu::ChapterInfo kChapter{"05_multi_process",
                                 "one process per device, launched by mpirun or srun: the gradients are summed with "
                                 "NCCL or MPI",
                                 /*default_devices=*/1, /*max_devices=*/1 << 20};

std::string usage() {
  std::string u = mgpu::usage(kChapter);
  u += "\nthis chapter (launch K processes, one per device: mpirun -np K " + kChapter.name + " ...):\n";
  u += "  --devices K       must equal the number of processes, if given\n";
  u += std::string("  --collective C    nccl or mpi: what sums the gradients (default ") +
       (nccl_available() ? "nccl, or mpi where ranks share a GPU" : "mpi; nccl needs a cuda build with NCCL") +
       ")\n";
  u += "  --overlap on|off  sum each layer's gradients while backward computes the earlier ones (default on)\n";
  u += "  --checkpoint FILE after every epoch rank 0 saves the run to FILE (written to FILE.tmp, then renamed)\n";
  u += "  --resume FILE     continue the run saved in FILE, with any number of processes\n";
  u += "  --profile-steps N after training, time N steps without overlap and N with it (default 20; 0: skip)\n";
  u += "  --fail-rank R --fail-at-step S|end [--fail-how error|kill]\n";
  u += "                    fault injection: rank R fails at step S (counted from 0 over the whole run),\n";
  u += "                    or with 'end' at the end of the run, while rank 0 writes the results\n";
  return u;
}

CommandLine parse_command_line(const std::vector<std::string>& args, int world_size) {
  CommandLine r;
  Config& c = r.config;
  c.o = mgpu::default_options(kChapter);
  c.collective = default_collective();
  bool fail_rank_given = false, fail_step_given = false, fail_how_given = false, devices_given = false;

  // The shared flags (common/cli.h), with --devices noted when given, and this chapter's own:
  // one table, read by the same parser as every other program's.
  mgpu::FlagTable flags = mgpu::common_flags(c.o, kChapter);
  flags["--devices"] = [set = flags["--devices"], &devices_given](const std::string& flag, const std::string& v) {
    devices_given = true;
    return set(flag, v);
  };
  auto given = [](mgpu::FlagSetter set, bool& was_given) -> mgpu::FlagSetter {
    return [set, &was_given](const std::string& flag, const std::string& v) {
      std::string why = set(flag, v);
      was_given = why.empty();
      return why;
    };
  };
  flags["--collective"] = [&c](const std::string& flag, const std::string& v) -> std::string {
    if (v == "mpi") c.collective = Collective::Mpi;
    else if (v == "nccl") c.collective = Collective::Nccl;
    else return flag + " must be 'nccl' or 'mpi', got '" + v + "'";
    c.collective_given = true;
    return "";
  };
  flags["--overlap"] = [&c](const std::string& flag, const std::string& v) -> std::string {
    if (v != "on" && v != "off") return flag + " must be 'on' or 'off', got '" + v + "'";
    c.overlap = v == "on";
    return "";
  };
  flags["--fail-how"] = [&c, &fail_how_given](const std::string& flag, const std::string& v) -> std::string {
    if (v != "error" && v != "kill") return flag + " must be 'error' or 'kill', got '" + v + "'";
    c.fault.how = v == "kill" ? FailHow::Kill : FailHow::Error;
    fail_how_given = true;
    return "";
  };
  flags["--checkpoint"] = mgpu::text_flag(c.checkpoint, "a file name");
  flags["--resume"] = mgpu::text_flag(c.resume, "a file name");
  flags["--profile-steps"] = mgpu::integer_flag(c.profile_steps, 0);
  flags["--fail-rank"] = given(mgpu::integer_flag(c.fault.rank, 0), fail_rank_given);
  flags["--fail-at-step"] = [&c, &fail_step_given, step = mgpu::integer_flag(c.fault.step, 0)](
                                const std::string& flag, const std::string& v) -> std::string {
    c.fault.at_end = v == "end";
    fail_step_given = c.fault.at_end || step(flag, v).empty();
    if (fail_step_given) return "";
    return flag + " needs a step (a non-negative integer up to 1000000000) or 'end', got '" + v + "'";
  };

  const mgpu::FlagsResult parsed = mgpu::parse_flags(args, flags);
  r.help = parsed.help;
  r.error = parsed.help || !parsed.error.empty() ? parsed.error : mgpu::check_options(c.o, kChapter);
  if (r.help || !r.error.empty()) return r;

  const std::string K = std::to_string(world_size);
  if (devices_given && c.o.devices != world_size)
    r.error = "--devices " + std::to_string(c.o.devices) + " does not match the " + K +
              " process(es) of this run: here every process drives one device, so start " +
              std::to_string(c.o.devices) + " of them (mpirun -np " + std::to_string(c.o.devices) + ")";
  else if (c.o.batch_size < world_size)
    r.error = "--batch-size " + std::to_string(c.o.batch_size) + " is smaller than the " + K +
              " processes: every rank needs at least one example of every full batch";
  else if (c.collective == Collective::Nccl && !nccl_available())
    r.error = std::string("--collective nccl needs a cuda build with NCCL; this is the ") + mgpu::kBackendName +
              " build: use --collective mpi";
  else if (fail_rank_given != fail_step_given)
    r.error = "--fail-rank and --fail-at-step go together: give both or neither";
  else if (fail_how_given && !fail_rank_given)
    r.error = "--fail-how needs --fail-rank and --fail-at-step";
  else if (fail_rank_given && c.fault.rank >= world_size)
    r.error = "--fail-rank " + std::to_string(c.fault.rank) + " is not a rank of this run (ranks 0.." +
              std::to_string(world_size - 1) + ")";
  c.o.devices = world_size;
  return r;
}

}  // namespace mp
