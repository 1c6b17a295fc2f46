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

namespace {

bool is_common_flag_with_value(const std::string& arg) {
  // Every shared flag takes a value except --help; "--flag=value" carries its own.
  return arg.rfind("--", 0) == 0 && arg.find('=') == std::string::npos && arg != "--help";
}

}  // namespace

CommandLine parse_command_line(const std::vector<std::string>& args, int world_size) {
  CommandLine r;
  Config& c = r.config;
  c.collective = default_collective();
  bool fail_rank_given = false, fail_step_given = false, fail_how_given = false, devices_given = false;

  using Setter = std::function<std::string(const std::string& flag, const std::string& value)>;
  auto non_negative = [](auto& dst, bool& given) -> Setter {
    return [&dst, &given](const std::string& flag, const std::string& v) -> std::string {
      const auto n = mgpu::to_integer(v);
      if (!n || *n < 0) return flag + " needs a non-negative integer, got '" + v + "'";
      if (*n > 1'000'000'000) return flag + " is too large: " + v;
      dst = static_cast<std::remove_reference_t<decltype(dst)>>(*n);
      given = true;
      return "";
    };
  };
  auto file = [](std::string& dst) -> Setter {
    return [&dst](const std::string& flag, const std::string& v) -> std::string {
      if (v.empty()) return flag + " needs a file name";
      dst = v;
      return "";
    };
  };
  bool unused = false;
  const std::map<std::string, Setter> own = {
      {"--collective",
       [&c](const std::string& flag, const std::string& v) -> std::string {
         if (v == "mpi") c.collective = Collective::Mpi;
         else if (v == "nccl") c.collective = Collective::Nccl;
         else return flag + " must be 'nccl' or 'mpi', got '" + v + "'";
         c.collective_given = true;
         return "";
       }},
      {"--overlap",
       [&c](const std::string& flag, const std::string& v) -> std::string {
         if (v != "on" && v != "off") return flag + " must be 'on' or 'off', got '" + v + "'";
         c.overlap = v == "on";
         return "";
       }},
      {"--fail-how",
       [&c, &fail_how_given](const std::string& flag, const std::string& v) -> std::string {
         if (v != "error" && v != "kill") return flag + " must be 'error' or 'kill', got '" + v + "'";
         c.fault.how = v == "kill" ? FailHow::Kill : FailHow::Error;
         fail_how_given = true;
         return "";
       }},
      {"--checkpoint", file(c.checkpoint)},
      {"--resume", file(c.resume)},
      {"--profile-steps", non_negative(c.profile_steps, unused)},
      {"--fail-rank", non_negative(c.fault.rank, fail_rank_given)},
      {"--fail-at-step",
       [&c, &fail_step_given, non_negative](const std::string& flag, const std::string& v) -> std::string {
         c.fault.at_end = v == "end";
         if (c.fault.at_end) {
           fail_step_given = true;
           return "";
         }
         if (non_negative(c.fault.step, fail_step_given)(flag, v).empty()) return "";
         return flag + " needs a step (a non-negative integer up to 1000000000) or 'end', got '" + v + "'";
       }},
  };

  // This chapter's flags are taken out here; the rest go to the shared parser.
  std::vector<std::string> shared;
  for (std::size_t i = 0; i < args.size(); ++i) {
    std::string flag = args[i], value;
    const auto eq = flag.find('=');
    const bool inline_value = flag.rfind("--", 0) == 0 && eq != std::string::npos;
    if (inline_value) {  // --overlap=off
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
    }
    const auto it = own.find(flag);
    if (it == own.end()) {
      devices_given = devices_given || flag == "--devices";
      shared.push_back(args[i]);
      if (is_common_flag_with_value(args[i]) && i + 1 < args.size()) shared.push_back(args[++i]);
      continue;
    }
    if (!inline_value) {
      if (i + 1 >= args.size()) {
        r.error = flag + " needs a value";
        return r;
      }
      value = args[++i];
    }
    if (std::string why = it->second(flag, value); !why.empty()) {
      r.error = why;
      return r;
    }
  }

  const mgpu::ParseResult common = mgpu::parse_options(shared, kChapter);
  c.o = common.options;
  r.help = common.help;
  if (r.help || !common.error.empty()) {
    r.error = common.error;
    return r;
  }

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
