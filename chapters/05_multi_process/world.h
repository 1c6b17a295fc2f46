// Who this process is among all the processes of a run, and the few MPI calls the chapter makes
// besides the gradient allreduce (collective.h): all of them checked.
//
// mpirun -np K (or srun) starts K copies of the program. Each asks MPI for
//   rank        its number among all K, 0..K-1       (torch.distributed: RANK)
//   size        K                                     (WORLD_SIZE)
//   local rank  its number among the processes on its own machine (LOCAL_RANK), found by
//               splitting the world into groups that share memory (MPI_COMM_TYPE_SHARED);
//               it picks the GPU, since GPUs are numbered per machine.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/check.h"
#include "common/device.h"

namespace mp {

// Every MPI call goes through this: a failure throws mgpu::Error naming the call, the file and
// line, and MPI's own error string. (MpiSession makes MPI return errors instead of aborting.)
void check_mpi(int status, const char* call, const char* file, int line);
#define MGPU_CHECK_MPI(call) ::mp::check_mpi((call), #call, __FILE__, __LINE__)

// MPI counts are ints; element counts here are std::size_t. Refuses what an int cannot hold.
int mpi_count(mgpu::Elements n);

// MPI_Init_thread in the constructor, MPI_Finalize in the destructor. Only the main thread
// calls MPI (MPI_THREAD_FUNNELED): OpenMP's threads compute, they never communicate.
class MpiSession {
 public:
  MpiSession(int& argc, char**& argv);
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;
};

struct World {
  MPI_Comm comm = MPI_COMM_NULL;  // the processes of the run (not owned)
  int rank = 0, size = 1;
  int local_rank = 0, local_size = 1;  // among the processes on this machine
  std::string host;                    // this machine's name
};

// Who this process is in `comm` (MPI_COMM_WORLD in the program; MPI_COMM_SELF makes a world of
// one, which the tests use as the one-process reference).
World describe_world(MPI_Comm comm);

// torchrun (and torch.distributed.launch) start WORLD_SIZE processes with RANK, LOCAL_RANK,
// MASTER_ADDR and MASTER_PORT set and no MPI: each is then a world of one to MPI, and they would
// train apart into the same files. This program takes its ranks from MPI (mpirun, or srun,
// which starts MPI's processes): where WORLD_SIZE says more processes than MPI's world has,
// returns the sentence that refuses the run; "" otherwise.
std::string foreign_launcher(const World& w);

// One line per rank, gathered on rank 0 (empty on the others): "rank 1: host vm, local rank 1 of 2, <what>".
std::string gather_lines(const World& w, const std::string& what);
// Every rank's `text`, of any length, concatenated in rank order on rank 0 ("" elsewhere).
std::string gather_text(const World& w, const std::string& text);

// values[0..count) summed over all ranks; every rank gets the sums.
void sum_over_ranks(const World& w, double* values, int count);
double max_over_ranks(const World& w, double value);
// The lowest rank for which `yes` holds, or w.size when it holds for none: for decisions every
// rank must take together, such as stopping.
int first_rank_where(const World& w, bool yes);
// How many ranks (this one included) passed the same `key`: chapter 05 counts the ranks that
// drive one physical GPU by its name. Every rank must call it.
int count_ranks_with(const World& w, const std::string& key);
// Rank 0's n floats (or bytes) copied to every rank: Horovod's broadcast_parameters.
void broadcast_from_rank0(const World& w, float* data, mgpu::Elements n);
void broadcast_from_rank0(const World& w, void* bytes, std::size_t count);

// A step every rank takes together, for work that only some ranks do and after which they could
// otherwise part ways: rank 0 checking its files before training, writing a checkpoint after an
// epoch, or writing the results at the end while the others have nothing left to do. Each rank
// runs `work` (which must not communicate: the other ranks may be skipping it), then one
// collective tells every rank whether it failed anywhere. If it did, every rank throws
// StoppedTogether at this same point, so all of them can leave through MPI_Finalize with a
// non-zero status and none is left waiting for another; no MPI_Abort is needed.
//
// Why not simply MPI_Abort from the failing rank, as in the middle of training? At the end of a
// run the other ranks have nothing more to wait for: they go on into MPI_Finalize or exit, and an
// MPI_Abort from rank 0 at that moment races with their teardown. With Open MPI 4.1 mpirun then
// sometimes crashes in its PMIx teardown (status 139) or hangs for minutes, deaf to SIGTERM.
void together(const World& w, const std::function<void()>& work);

// What together() throws on every rank when `work` failed on any. On a rank whose own work
// failed, what() is that rank's own message; on the others it names the lowest failing rank and
// carries its message.
class StoppedTogether : public mgpu::Error {
 public:
  StoppedTogether(const std::string& what, int failed_rank, bool failed_here)
      : mgpu::Error(what), failed_rank_(failed_rank), failed_here_(failed_here) {}
  int failed_rank() const { return failed_rank_; }  // the lowest rank whose work failed
  bool failed_here() const { return failed_here_; }  // this rank's own work failed: it says why

 private:
  int failed_rank_;
  bool failed_here_;
};

// The fault path. An error on one rank must stop all of them: the others are waiting for it in
// the next collective and would wait forever. abort_all() calls MPI_Abort on MPI_COMM_WORLD,
// which makes mpirun or srun kill every process of the run. (An NCCL communicator is aborted
// before that, by its destructor, as the error unwinds the stack: see collective.cpp.)
[[noreturn]] void abort_all(int exit_code);

}  // namespace mp
