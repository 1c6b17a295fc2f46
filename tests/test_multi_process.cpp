// Chapter 05 across processes. Launched by ctest as `mpirun -np K test_multi_process` (K = 2
// and 3): every rank runs every test case, and the ranks meet in the collectives inside them.
// The reference for "what one process computes" is the same training on MPI_COMM_SELF, a
// world of one, run by rank 0 alone.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "chapters/05_multi_process/checkpoint.h"
#include "chapters/05_multi_process/collective.h"
#include "chapters/05_multi_process/train.h"
#include "chapters/05_multi_process/rank_device.h"
#include "chapters/05_multi_process/world.h"
#include "common/random.h"
#include "helpers.h"

namespace {

using testing::check_same_training;
using testing::random_set;

mp::World world() { return mp::describe_world(MPI_COMM_WORLD); }
mp::World alone() { return mp::describe_world(MPI_COMM_SELF); }

// The same small dataset on every rank: 28 training examples in global batches of 13 make
// batches of 13, 13 and 2, so blocks are uneven (13 = 7 + 6 = 5 + 4 + 4) and, on 3 ranks, the
// last batch leaves rank 2 with nothing.
mgpu::FashionMnist small_data() {
  mgpu::Rng rng(2024);
  mgpu::FashionMnist data;
  data.dir = "(random)";
  data.train = random_set(28, rng);
  data.test = random_set(23, rng);
  return data;
}

// Weights ten times d2l's, so that a few steps move every tensor measurably.
mp::Config small_config(int epochs) {
  mp::Config c;
  c.o.epochs = epochs;
  c.o.batch_size = 13;
  c.o.lr = 0.5f;
  c.o.seed = 7;
  c.init_scale = 0.1f;
  c.profile_steps = 0;
  return c;
}

// The collective the program would choose: NCCL in a cuda build where every rank has a GPU of
// its own, MPI otherwise (the cpu build; ranks sharing a GPU). So on a machine with GPUs these
// tests check the NCCL path, and the MPI path everywhere else.
std::unique_ptr<mgpu::Collective> program_allreduce(const mp::World& w, const mp::RankDevice& device) {
  const mp::CollectiveKind kind =
      mp::choose_collective(w, mp::default_collective(), /*explicitly=*/false, device.ranks_per_gpu(), nullptr);
  mgpu::CollectiveMenu menu;
  mp::add_collectives(menu, w, device.device(), device.ranks_per_gpu());
  return menu.make(mp::collective_name(kind), static_cast<std::size_t>(lenet::flat_count()));
}

mp::RunResult train(const mp::World& w, const mp::Config& c) {
  const mp::RankDevice device(w);
  const auto allreduce = program_allreduce(w, device);
  return mp::train(w, device.device(), small_data(), c, *allreduce, nullptr);
}

std::vector<float> flat(const lenet::HostParams& p) {
  std::vector<float> f;
  for (const auto& t : p) f.insert(f.end(), t.begin(), t.end());
  return f;
}

lenet::HostParams shaped(const std::vector<float>& f) {
  lenet::HostParams p;
  auto first = f.begin();  // back to back, no padding (unlike the device Flat layout)
  for (const lenet::ParamInfo& t : lenet::kParams) {
    p.emplace_back(first, first + t.count);
    first += t.count;
  }
  return p;
}

// rank 0's vector, on every rank.
std::vector<float> from_rank0(const mp::World& w, std::vector<float> v) {
  mp::broadcast_from_rank0(w, v.data(), mgpu::Elements{v.size()});
  return v;
}

lenet::HostParams initial_params() { return lenet::init_params(small_config(1).o.seed, small_config(1).init_scale); }

TEST_CASE("K processes with global batch B end with the parameters of one process with batch B") {
  const mp::World w = world();
  CAPTURE(w.size);
  for (bool overlap : {false, true}) {
    CAPTURE(overlap);
    mp::Config c = small_config(2);  // 2 epochs of 3 steps
    c.overlap = overlap;
    const mp::RunResult many = train(w, c);
    // Every rank holds the very same numbers: they all took the same summed step.
    const std::vector<float> mine = flat(many.params);
    CHECK(mine == from_rank0(w, mine));

    std::vector<float> one(mine.size());
    if (w.rank == 0) one = flat(train(alone(), c).params);
    check_same_training(many.params, shaped(from_rank0(w, one)), initial_params(), "K processes vs one");
  }
}

TEST_CASE("every rank starts from rank 0's parameters, not from its own draw") {
  const mp::World w = world();
  const std::vector<float> same_draw = flat(train(w, small_config(1)).params);
  // Each rank now asks for other initial weights; only rank 0's request counts, because rank 0
  // draws and broadcasts, and the others never draw.
  mp::Config c = small_config(1);
  c.init_scale = 0.1f * float(w.rank + 1);
  const std::vector<float> own_draw = flat(train(w, c).params);
  CHECK(own_draw == same_draw);
}

TEST_CASE("overlap on and overlap off give the same parameters") {
  const mp::World w = world();
  mp::Config c = small_config(2);
  c.overlap = false;
  const mp::RunResult off = train(w, c);
  c.overlap = true;
  const mp::RunResult on = train(w, c);
  // The same sums of the same numbers; only MPI's choice of algorithm per message size (one
  // bucket or four slices) may change the order in which the ranks' values are added.
  check_same_training(on.params, off.params, initial_params(), "overlap on vs off");
  CHECK(on.history.size() == off.history.size());
}

TEST_CASE("evaluation split across ranks counts the same hits as evaluation on rank 0 alone") {
  const mp::World w = world();
  mp::Config c = small_config(2);
  c.o.eval_all_devices = true;
  const mp::RunResult split = train(w, c);
  c.o.eval_all_devices = false;  // --eval device0
  const mp::RunResult rank0 = train(w, c);
  REQUIRE(split.history.size() == 2);
  for (std::size_t e = 0; e < split.history.size(); ++e) {
    CAPTURE(e);
    CHECK(split.history[e].test_acc == rank0.history[e].test_acc);  // same parameters, same images
    CHECK(split.history[e].train_loss == doctest::Approx(rank0.history[e].train_loss).epsilon(1e-12));
  }
}

TEST_CASE("checkpoint after epoch 1, resume: the uninterrupted run, on the same and on another rank count") {
  const mp::World w = world();
  // Only rank 0 writes and reads checkpoints; the name is its own.
  const std::string file = (std::filesystem::temp_directory_path() /
                            ("mgpu-test-resume-" + std::to_string(getpid()) + ".ckpt")).string();
  const mp::RunResult uninterrupted = train(w, small_config(3));

  mp::Config first = small_config(1);
  first.checkpoint = file;
  const mp::RunResult stopped = train(w, first);
  mp::Config rest = small_config(3);
  rest.resume = file;
  const mp::RunResult resumed = train(w, rest);
  // Same ranks, same start, same batches: the same arithmetic, bit for bit.
  CHECK(flat(resumed.params) == flat(uninterrupted.params));
  REQUIRE(resumed.history.size() == 3);
  // Epoch 1 was restored, not trained again (a run from scratch would give the same numbers):
  // its seconds are the stopped run's, as recorded, where a second training would measure anew.
  REQUIRE(stopped.history.size() == 1);
  CHECK(resumed.history[0].seconds == stopped.history[0].seconds);
  for (std::size_t e = 0; e < 3; ++e) {
    CAPTURE(e);
    CHECK(resumed.history[e].epoch == uninterrupted.history[e].epoch);
    CHECK(resumed.history[e].train_loss == uninterrupted.history[e].train_loss);
    CHECK(resumed.history[e].test_acc == uninterrupted.history[e].test_acc);
  }

  // Rank 0 alone resumes what K ranks saved: the same run up to the order of float additions.
  if (w.rank == 0) {
    const mp::RunResult alone_resumed = train(alone(), rest);
    check_same_training(alone_resumed.params, uninterrupted.params, initial_params(), "resumed on one process");

    // A resume with another recipe is refused, naming the flag.
    mp::Config other = rest;
    other.o.batch_size = 14;
    CHECK_THROWS_WITH_AS(train(alone(), other), doctest::Contains("--batch-size 13, this run has --batch-size 14"),
                         mgpu::Error);
    std::filesystem::remove(file);
  }
}

// A file name in the temporary folder, made of rank 0's process id and the same on every rank
// (only rank 0 writes and reads checkpoints; every rank checks the messages that name them).
std::string temp_file(const mp::World& w, const std::string& name) {
  int pid = getpid();
  mp::broadcast_from_rank0(w, &pid, sizeof pid);
  return (std::filesystem::temp_directory_path() / ("mgpu-test-" + std::to_string(pid) + "-" + name)).string();
}

// `call` must throw mgpu::Error on every rank, with a message containing `says`: a fault on one
// rank that leaves another running, or waiting, fails here (or, waiting, hangs the run, which
// ctest's time limit turns into a failure).
template <class F>
void check_every_rank_stops(F call, const std::string& says) {
  bool stopped = false;
  try {
    call();
  } catch (const mgpu::Error& e) {
    stopped = true;
    INFO("message: ", std::string(e.what()));
    CHECK(std::string(e.what()).find(says) != std::string::npos);
  }
  CHECK(stopped);
}

TEST_CASE("a --checkpoint that cannot be written stops every rank before the first step") {
  const mp::World w = world();
  mp::Config c = small_config(2);
  c.checkpoint = "/nonexistent-mgpu-test/run.ckpt";
  check_every_rank_stops([&] { train(w, c); },
                         "/nonexistent-mgpu-test/run.ckpt: the folder /nonexistent-mgpu-test does not exist");
}

TEST_CASE("a checkpoint that fails to be written after the last epoch stops every rank together") {
  const mp::World w = world();
  mp::Config c = small_config(1);
  c.checkpoint = temp_file(w, "unwritable.ckpt");
  // Rank 0's files may hold no byte: the trial file before training is empty and passes, the
  // checkpoint after the epoch fails (EFBIG; the signal that would end the process is ignored).
  rlimit saved{};
  getrlimit(RLIMIT_FSIZE, &saved);
  const auto previous = std::signal(SIGXFSZ, SIG_IGN);
  if (w.rank == 0) {
    rlimit none = saved;
    none.rlim_cur = 0;
    REQUIRE(setrlimit(RLIMIT_FSIZE, &none) == 0);
  }
  // The other ranks have nothing left to do after the last epoch: they must still stop.
  check_every_rank_stops([&] { train(w, c); }, c.checkpoint + ".tmp: cannot write the checkpoint");
  setrlimit(RLIMIT_FSIZE, &saved);
  std::signal(SIGXFSZ, previous);
}

TEST_CASE("--resume with --epochs at or below the checkpoint's epochs is refused on every rank") {
  const mp::World w = world();
  mp::Config first = small_config(2);
  first.checkpoint = temp_file(w, "two-epochs.ckpt");
  train(w, first);
  for (int epochs : {2, 1}) {
    CAPTURE(epochs);
    mp::Config again = small_config(epochs);
    again.resume = first.checkpoint;
    check_every_rank_stops([&] { train(w, again); }, first.checkpoint + ": the checkpoint holds 2 finished epoch(s), "
                                                         "and --epochs " + std::to_string(epochs) + " asks for no more");
  }
  if (w.rank == 0) std::filesystem::remove(first.checkpoint);
}

TEST_CASE("a rank that fails at the end of the run stops every rank together, naming it") {
  const mp::World w = world();
  mp::Config c = small_config(1);
  CHECK_NOTHROW(mp::finish_together(w, c, nullptr));  // no fault: everybody leaves
  for (int failing : {0, w.size - 1}) {
    CAPTURE(failing);
    c.fault.rank = failing;
    c.fault.at_end = true;
    bool stopped = false;
    try {
      mp::finish_together(w, c, nullptr);
    } catch (const mp::StoppedTogether& e) {
      stopped = true;
      CHECK(e.failed_rank() == failing);
      CHECK(e.failed_here() == (w.rank == failing));  // the failing rank reports, the others only leave
      CHECK(std::string(e.what()).find("injected fault at the end of the run") != std::string::npos);
    }
    CHECK(stopped);
  }
}

TEST_CASE("the collective sums every element over the ranks, as one bucket and layer by layer") {
  const mp::World w = world();
  const mp::RankDevice device(w);
  const auto collective = program_allreduce(w, device);
  mp::BucketAllreduce allreduce(*collective);
  // Rank r contributes (r + 1) * v with v the same everywhere: the sum is K(K+1)/2 * v.
  mgpu::Rng rng(9);
  lenet::HostParams v;
  for (const lenet::ParamInfo& p : lenet::kParams) v.push_back(testing::random_floats(p.count, rng));
  const double factor = w.size * (w.size + 1) / 2.0;
  for (bool by_layer : {false, true}) {
    CAPTURE(by_layer);
    lenet::HostParams mine = v;
    for (auto& t : mine)
      for (float& x : t) x *= float(w.rank + 1);
    lenet::Params g = lenet::upload_params(device.device(), mine, lenet::Layout::Flat);
    if (by_layer)
      for (int layer = lenet::kLayers - 1; layer >= 0; --layer) allreduce.start_layer(g, layer);
    allreduce.finish(g);
    const lenet::HostParams got = g.download();
    for (int t = 0; t < lenet::kParamTensors; ++t) {
      CAPTURE(lenet::kParams[t].name);
      std::size_t wrong = 0;
      for (std::size_t j = 0; j < got[t].size(); ++j)
        if (std::abs(got[t][j] - factor * v[t][j]) > 1e-5 * (1 + std::abs(factor * v[t][j]))) ++wrong;
      CHECK(wrong == 0);
    }
  }
  // Layers out of order would make ranks issue different collectives: refused before any is.
  lenet::Params g = lenet::zero_params(device.device(), lenet::Layout::Flat);
  CHECK_THROWS_WITH_AS(allreduce.start_layer(g, 0), doctest::Contains("out of order"), mgpu::Error);
}

TEST_CASE("count_ranks_with counts the ranks that passed the same name") {
  const mp::World w = world();
  CHECK(mp::count_ranks_with(w, "the same everywhere") == w.size);
  CHECK(mp::count_ranks_with(w, "rank " + std::to_string(w.rank)) == 1);
  const int same_parity = (w.size + (w.rank % 2 == 0 ? 1 : 0)) / 2;  // ranks 0, 2, 4.. or 1, 3, ..
  CHECK(mp::count_ranks_with(w, w.rank % 2 == 0 ? "even" : "odd") == same_parity);
  CHECK_THROWS_WITH_AS(mp::count_ranks_with(w, std::string(300, 'x')), doctest::Contains("longer than 255"),
                       mgpu::Error);
}

TEST_CASE("choose_collective: ranks sharing a GPU fall back to MPI together, or refuse an explicit nccl") {
  const mp::World w = world();
  std::string note;
  CHECK(mp::choose_collective(w, mp::CollectiveKind::Mpi, true, 1, &note) == mp::CollectiveKind::Mpi);
  CHECK(mp::choose_collective(w, mp::CollectiveKind::Nccl, true, 1, &note) == mp::CollectiveKind::Nccl);
  CHECK(note.empty());
  // Only rank 0 shares its GPU (3 ranks on 2 GPUs look like this on the ranks of GPU 0): every
  // rank must still take the same decision, or some would wait in NCCL for ranks that use MPI.
  const int sharing = w.rank == 0 ? 2 : 1;
  CHECK(mp::choose_collective(w, mp::CollectiveKind::Nccl, false, sharing, &note) == mp::CollectiveKind::Mpi);
  CHECK(note.find("2 ranks share a GPU") != std::string::npos);
  CHECK(note.find("summed with MPI") != std::string::npos);
  CHECK_THROWS_WITH_AS(mp::choose_collective(w, mp::CollectiveKind::Nccl, true, sharing, nullptr),
                       doctest::Contains("--collective nccl: 2 ranks share a GPU"), mgpu::Error);
}

TEST_CASE("broadcast_from_rank0: every rank ends with rank 0's floats and bytes, whatever it held") {
  const mp::World w = world();
  for (std::size_t n : {std::size_t(0), std::size_t(1), std::size_t(1000)}) {
    CAPTURE(n);
    std::vector<float> mine(n);
    for (std::size_t j = 0; j < n; ++j) mine[j] = float(w.rank) * 1000 + float(j);  // rank 0's: 0, 1, 2, ...
    mp::broadcast_from_rank0(w, mine.data(), mgpu::Elements{n});
    std::size_t wrong = 0;
    for (std::size_t j = 0; j < n; ++j) wrong += mine[j] != float(j);
    CHECK(wrong == 0);
  }
  char bytes[128];  // the size of an ncclUniqueId
  for (int j = 0; j < 128; ++j) bytes[j] = char(w.rank == 0 ? j : 255 - j);
  mp::broadcast_from_rank0(w, bytes, sizeof bytes);
  int wrong = 0;
  for (int j = 0; j < 128; ++j) wrong += bytes[j] != char(j);
  CHECK(wrong == 0);
}

// cpu_threads_for reads OMP_NUM_THREADS and this process's affinity mask: each case sets them,
// and the end puts back what was there.
TEST_CASE("cpu_threads_for: OMP_NUM_THREADS first, else the mask: all of it when bound, a share when not") {
  const char* env = std::getenv("OMP_NUM_THREADS");
  const std::string saved_env = env ? env : "";
  cpu_set_t saved_mask;
  REQUIRE(sched_getaffinity(0, sizeof saved_mask, &saved_mask) == 0);
  mp::World w = world();

  setenv("OMP_NUM_THREADS", "3", 1);
  CHECK(mp::cpu_threads_for(w) == 3);
  setenv("OMP_NUM_THREADS", "0", 1);
  CHECK(mp::cpu_threads_for(w) == 1);  // at least one thread
  unsetenv("OMP_NUM_THREADS");

  // Bound to one core (as mpirun binds a rank): that core, however many ranks share the machine.
  cpu_set_t one;
  CPU_ZERO(&one);
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &saved_mask)) {
      CPU_SET(c, &one);
      break;
    }
  REQUIRE(sched_setaffinity(0, sizeof one, &one) == 0);
  for (int local_size : {1, 4}) {
    w.local_size = local_size;
    CHECK(mp::cpu_threads_for(w) == 1);
  }
  // Free to run on every core of the machine (not bound): the cores shared among its ranks.
  const int online = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  cpu_set_t all;
  CPU_ZERO(&all);
  for (int c = 0; c < online && c < CPU_SETSIZE; ++c) CPU_SET(c, &all);
  if (sched_setaffinity(0, sizeof all, &all) == 0 && online > 1) {
    w.local_size = 1;
    CHECK(mp::cpu_threads_for(w) == online);
    w.local_size = 2;
    CHECK(mp::cpu_threads_for(w) == online / 2);
    w.local_size = 4 * online;
    CHECK(mp::cpu_threads_for(w) == 1);
  } else {
    MESSAGE("this process may not run on all " << online << " cores: the unbound case is not checked");
  }

  sched_setaffinity(0, sizeof saved_mask, &saved_mask);
  if (env) setenv("OMP_NUM_THREADS", saved_env.c_str(), 1);
}

}  // namespace

// Each rank runs doctest and reports its own failures; mpirun's exit status is non-zero when
// any rank's is.
int main(int argc, char** argv) {
  if (mgpu::kCudaBackend && mgpu::gpu_count() == 0) {
    std::printf("no GPU answers: skipping test_multi_process\n");
    return mgpu::kExitNotApplicable;
  }
  mp::MpiSession mpi(argc, argv);
  doctest::Context context(argc, argv);
  // mpirun hands each rank a pseudo-terminal, so doctest would colour output that goes to a log.
  context.setOption("no-colors", true);
  const mp::World w = mp::describe_world(MPI_COMM_WORLD);
  if (w.rank != 0) context.setOption("minimal", true);  // one summary, from rank 0; failures from all
  {  // say which collective the training tests check (NCCL where each rank has its own GPU)
    const mp::RankDevice device(w);
    const mp::CollectiveKind kind =
        mp::choose_collective(w, mp::default_collective(), false, device.ranks_per_gpu(), nullptr);
    const std::string ranks = mp::gather_lines(w, device.describe());
    if (w.rank == 0) std::printf("%scollective under test: %s\n", ranks.c_str(), mp::collective_name(kind));
  }
  return context.run();
}
