// What a piece of a test prints, captured: the progress lines and epoch lines the log writes.
#pragma once
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace testing {

// What `f` prints on file descriptor fd (1: stdout, 2: stderr, child processes' included),
// sent to a file while it runs.
template <class F>
std::string output_of(int fd, F f) {
  namespace fs = std::filesystem;
  const fs::path file =
      fs::temp_directory_path() / ("mgpu_test_output_" + std::to_string(fd) + "_" + std::to_string(getpid()));
  std::fflush(stdout);
  std::fflush(stderr);
  const int saved = dup(fd);
  FILE* capture = std::fopen(file.c_str(), "w");
  dup2(fileno(capture), fd);
  f();
  std::fflush(stdout);
  std::fflush(stderr);
  dup2(saved, fd);
  close(saved);
  std::fclose(capture);
  std::ostringstream text;
  text << std::ifstream(file).rdbuf();
  fs::remove(file);
  return text.str();
}
template <class F>
std::string stdout_of(F f) {
  return output_of(1, f);
}

}  // namespace testing
