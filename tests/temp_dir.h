// A fresh folder for a test's files, of its own process (two suites, or two builds' suites, may
// run at once: ctest -j), removed with what it holds at scope exit.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>
#include <system_error>

namespace testing {

struct TempDir {
  std::filesystem::path path;
  // Under the system's temporary folder: <what>-<process id>-<count>, e.g. mgpu-test-4711-0.
  explicit TempDir(const std::string& what = "mgpu-test") {
    static int made = 0;
    path = std::filesystem::temp_directory_path() /
           (what + "-" + std::to_string(getpid()) + "-" + std::to_string(made++));
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return (path / name).string(); }
};

}  // namespace testing
