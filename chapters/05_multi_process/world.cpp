#include "world.h"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>

#include "common/check.h"
#include "common/exercise.h"  // the student copy's holes call mgpu::exercise_not_done

namespace mp {

void check_mpi(int status, const char* call, const char* file, int line) {
  if (status == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(status, text, &length) != MPI_SUCCESS)
    length = std::snprintf(text, sizeof text, "error code %d", status);
  throw mgpu::Error("MPI error: " + std::string(call) + " at " + mgpu::short_path(file) + ":" + std::to_string(line) +
                    ": " + std::string(text, length));
}

int mpi_count(mgpu::Elements n) {
  if (n.count > static_cast<std::size_t>(INT_MAX))
    throw mgpu::Error("MPI counts are ints: " + std::to_string(n.count) + " elements are too many for one call");
  return static_cast<int>(n.count);
}

MpiSession::MpiSession(int& argc, char**& argv) {
  int provided = 0;
  // Until the error handler below is set, a failing MPI call makes MPI abort with its own
  // message (MPI_ERRORS_ARE_FATAL): that is the right thing for MPI_Init itself.
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  // From here on errors come back as codes, so MGPU_CHECK_MPI can say which call failed and where.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN);
  if (provided < MPI_THREAD_FUNNELED) {
    std::fprintf(stderr, "this MPI cannot be used from a program with threads (MPI_THREAD_FUNNELED not provided)\n");
    abort_all(1);
  }
}

MpiSession::~MpiSession() { MPI_Finalize(); }

std::string foreign_launcher(const World& w) {
  const char* world_size = std::getenv("WORLD_SIZE");
  if (!world_size || std::atoi(world_size) <= w.size) return "";
  const char* rank = std::getenv("RANK");
  return "WORLD_SIZE=" + std::string(world_size) + (rank ? " and RANK=" + std::string(rank) : std::string()) +
         " are set (torchrun's launch), but MPI started this process as a world of " + std::to_string(w.size) +
         ": this program takes its ranks from MPI, so torchrun's processes would each train alone, into the "
         "same files. Start it with mpirun -np " + std::string(world_size) + " (or srun) instead";
}

World describe_world(MPI_Comm comm) {
  World w;
  w.comm = comm;
  MGPU_CHECK_MPI(MPI_Comm_rank(comm, &w.rank));
  MGPU_CHECK_MPI(MPI_Comm_size(comm, &w.size));
  // The ranks that share memory with this one are the ones on this machine.
  MPI_Comm local;
  MGPU_CHECK_MPI(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, w.rank, MPI_INFO_NULL, &local));
  MGPU_CHECK_MPI(MPI_Comm_rank(local, &w.local_rank));
  MGPU_CHECK_MPI(MPI_Comm_size(local, &w.local_size));
  MGPU_CHECK_MPI(MPI_Comm_free(&local));
  char name[MPI_MAX_PROCESSOR_NAME];
  int length = 0;
  MGPU_CHECK_MPI(MPI_Get_processor_name(name, &length));
  w.host.assign(name, length);
  return w;
}

std::string gather_lines(const World& w, const std::string& what) {
  constexpr int kWidth = 200;  // characters per rank's line; longer ones are cut
  char mine[kWidth] = {};
  std::snprintf(mine, kWidth, "rank %d: host %s, local rank %d of %d, %s", w.rank, w.host.c_str(), w.local_rank,
                w.local_size, what.c_str());
  std::vector<char> all(w.rank == 0 ? std::size_t(kWidth) * w.size : 0);
  MGPU_CHECK_MPI(MPI_Gather(mine, kWidth, MPI_CHAR, all.data(), kWidth, MPI_CHAR, 0, w.comm));
  std::string lines;
  for (int r = 0; w.rank == 0 && r < w.size; ++r) lines += std::string(all.data() + std::size_t(r) * kWidth) + "\n";
  return lines;
}

std::string gather_text(const World& w, const std::string& text) {
  // First each rank's length, then the characters, each rank's at its displacement.
  const int mine = static_cast<int>(text.size());
  std::vector<int> lengths(w.rank == 0 ? w.size : 0), starts(lengths.size());
  MGPU_CHECK_MPI(MPI_Gather(&mine, 1, MPI_INT, lengths.data(), 1, MPI_INT, 0, w.comm));
  int total = 0;
  for (std::size_t r = 0; r < lengths.size(); ++r) {
    starts[r] = total;
    total += lengths[r];
  }
  std::string all(total, '\0');
  MGPU_CHECK_MPI(MPI_Gatherv(text.data(), mine, MPI_CHAR, all.data(), lengths.data(), starts.data(), MPI_CHAR, 0,
                             w.comm));
  return all;
}

void sum_over_ranks(const World& w, double* values, int count) {
  MGPU_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, values, count, MPI_DOUBLE, MPI_SUM, w.comm));
}

double max_over_ranks(const World& w, double value) {
  MGPU_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &value, 1, MPI_DOUBLE, MPI_MAX, w.comm));
  return value;
}

int first_rank_where(const World& w, bool yes) {
  int rank = yes ? w.rank : w.size;
  MGPU_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &rank, 1, MPI_INT, MPI_MIN, w.comm));
  return rank;
}

int count_ranks_with(const World& w, const std::string& key) {
  constexpr int kWidth = 256;  // characters per key; longer keys are refused, never cut
  if (key.size() >= kWidth) throw mgpu::Error("count_ranks_with: key longer than 255 characters: " + key);
  // BEGIN EXERCISE ex05.bootstrap
  // Every rank's key in a slot of kWidth characters (the rest zeros), gathered on every rank.
  std::vector<char> mine(kWidth, '\0'), all(std::size_t(kWidth) * w.size);
  std::copy(key.begin(), key.end(), mine.begin());
  MGPU_CHECK_MPI(MPI_Allgather(mine.data(), kWidth, MPI_CHAR, all.data(), kWidth, MPI_CHAR, w.comm));
  int same = 0;
  for (int r = 0; r < w.size; ++r) same += key == std::string(all.data() + std::size_t(r) * kWidth);
  return same;
  // END EXERCISE ex05.bootstrap
}

void broadcast_from_rank0(const World& w, float* data, mgpu::Elements n) {
  // BEGIN EXERCISE ex05.bootstrap
  MGPU_CHECK_MPI(MPI_Bcast(data, mpi_count(n), MPI_FLOAT, 0, w.comm));
  // END EXERCISE ex05.bootstrap
}

void broadcast_from_rank0(const World& w, void* bytes, std::size_t count) {
  // BEGIN EXERCISE ex05.bootstrap
  MGPU_CHECK_MPI(MPI_Bcast(bytes, mpi_count(mgpu::Elements{count}), MPI_BYTE, 0, w.comm));
  // END EXERCISE ex05.bootstrap
}

void together(const World& w, const std::function<void()>& work) {
  std::string error;  // empty: this rank's work succeeded
  try {
    work();
  } catch (const std::exception& e) {
    error = *e.what() ? e.what() : "an error without a message";
  } catch (...) {
    error = "an exception that is not a std::exception";
  }
  const int failed = first_rank_where(w, !error.empty());
  if (failed == w.size) return;
  // The failing rank's message, to every rank, so that each can say what stopped it (cut to a
  // fixed length: one broadcast, no second one for the length).
  constexpr int kWidth = 1024;
  std::vector<char> message(kWidth, '\0');
  if (w.rank == failed) std::copy_n(error.begin(), std::min<std::size_t>(error.size(), kWidth - 1), message.begin());
  MGPU_CHECK_MPI(MPI_Bcast(message.data(), kWidth, MPI_CHAR, failed, w.comm));
  if (!error.empty()) throw StoppedTogether(error, failed, /*failed_here=*/true);
  throw StoppedTogether("rank " + std::to_string(failed) + " failed: " + message.data(), failed, false);
}

void abort_all(int exit_code) {
  std::fflush(stdout);
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);  // MPI_Abort does not return; should it, this process still stops
}

}  // namespace mp
