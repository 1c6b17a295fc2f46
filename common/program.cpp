#include "program.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "backend.h"  // MGPU_CUDA
#include "check.h"
#include "memory.h"   // kBlasStartupBytes
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

#if !MGPU_CUDA
// Before any library starts. OpenBLAS (the cpu build's matrix products) maps about 256 MB as it
// starts, and Debian's OpenBLAS 0.3.21 retries a mapping that fails forever
// (OpenMathLib/OpenBLAS#5289): under an ulimit -v without that room, the program would hang
// before main(), where no code of ours runs. A function in ELF's .preinit_array runs before
// every shared library's initializer: this one asks for the room (a mapping no one may touch,
// given back at once) and, where there is none, says so and ends the program with status 1.
// Only system calls and write(): the C++ library and the sanitizers may not be ready yet.
__attribute__((no_sanitize("address", "thread", "undefined"))) void refuse_an_address_space_too_small_to_start(
    int argc, char** argv, char**) {
  void* room = mmap(nullptr, kBlasStartupBytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (room != MAP_FAILED) {
    munmap(room, kBlasStartupBytes);
    return;
  }
  const char* name = argc > 0 && argv && argv[0] ? argv[0] : "program";
  for (const char* c = name; *c; ++c)
    if (*c == '/') name = c + 1;  // the program's name, as its other messages start
  static const char message[] =
      ": error: ulimit -v leaves this program less than 320 MB of address space to start in; OpenBLAS maps about "
      "256 MB as it starts and, where it cannot, waits forever (Debian's OpenBLAS 0.3.21: OpenMathLib/OpenBLAS#5289). "
      "Raise ulimit -v: a run of this repository needs 1 GB or more (chapter 08 on 4 devices: 2 GB).\n";
  (void)!write(STDERR_FILENO, name, std::strlen(name));
  (void)!write(STDERR_FILENO, message, sizeof message - 1);
  _exit(1);
}
__attribute__((section(".preinit_array"), used)) void (*refuse_before_libraries_start)(int, char**, char**) =
    refuse_an_address_space_too_small_to_start;
#endif

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

FashionMnist load_data(const Options& o) {
  FashionMnist data = load_fashion_mnist(o.data_dir, o.limit_train);
  std::printf("Fashion-MNIST from %s: %d training, %d test images\n", data.dir.c_str(), data.train.count,
              data.test.count);
  return data;
}

int run_or_report(const std::string& program, const std::function<int()>& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", program.c_str(), error_text(e).c_str());
    return 1;
  }
}

}  // namespace mgpu
