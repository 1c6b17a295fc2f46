// student_copy: writes a student copy of this repository, in which every exercise's region
// (holes.h) is a hole, and the teachers' answer keys (INSTRUCTOR.md) are left out.
//
//   build/bin/student_copy --to ../mgpu-student            every exercise a hole
//   build/bin/student_copy --to DIR --only ex02.allreduce   only that one (a comma-separated list)
//   build/bin/student_copy --list                           the exercises and where their regions are
//
// The copy is of the working tree this program was built from (or --from DIR), without .git,
// build folders (any folder holding a CMakeCache.txt) and results/.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "holes.h"

namespace fs = std::filesystem;

namespace {

const char* kUsage =
    "usage: student_copy --to DIR [--from SOURCE] [--only EXERCISE[,EXERCISE...]]\n"
    "       student_copy --list [--from SOURCE]\n"
    "Writes a copy of the repository at SOURCE (default: the one this program was built from)\n"
    "into DIR, a folder that must not exist or be empty, with each exercise's marked region\n"
    "replaced by a hole that stops the program with a message naming the exercise.\n"
    "INSTRUCTOR.md files (answer keys), .git, build folders and results/ are left out.\n"
    "  --only   make holes of these exercises only (the others stay solved)\n"
    "  --list   print every exercise and where its regions are, and write nothing\n";

struct Usage : std::runtime_error {
  using std::runtime_error::runtime_error;
};

bool is_source(const fs::path& p) {
  const std::string ext = p.extension().string();
  return ext == ".cu" || ext == ".cpp" || ext == ".h" || ext == ".cuh" || ext == ".hpp";
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw std::runtime_error(p.string() + ": cannot be read");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_file(const fs::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary);
  out << text;
  if (!out.flush()) throw std::runtime_error(p.string() + ": cannot be written");
}

// The README a hole in `relative` points to: its chapter's, or the top one.
std::string readme_for(const fs::path& relative) {
  auto part = relative.begin();
  if (part != relative.end() && *part == "chapters" && std::next(part) != relative.end() &&
      std::next(std::next(part)) != relative.end())
    return "chapters/" + std::next(part)->string() + "/README.md";
  return "README.md";
}

// What the copy leaves out.
bool left_out(const fs::directory_entry& e, const fs::path& relative, const fs::path& destination) {
  const std::string name = relative.filename().string();
  if (e.is_directory()) {
    if (name == ".git" || relative == "results") return true;
    if (fs::exists(e.path() / "CMakeCache.txt")) return true;  // a build folder
    std::error_code ec;
    if (fs::equivalent(e.path(), destination, ec)) return true;
    return false;
  }
  return name == "INSTRUCTOR.md";
}

// exercise -> "file:line-line" of each region
using Found = std::map<std::string, std::vector<std::string>>;

// Walks `source`; with `destination` empty only lists.
void walk(const fs::path& source, const fs::path& dir, const fs::path& destination, const std::set<std::string>& only,
          Found& found) {
  std::vector<fs::directory_entry> entries{fs::directory_iterator(dir), fs::directory_iterator()};
  std::sort(entries.begin(), entries.end());  // a reproducible order for --list
  for (const fs::directory_entry& e : entries) {
    const fs::path relative = fs::relative(e.path(), source);
    if (left_out(e, relative, destination)) continue;
    const fs::path target = destination.empty() ? fs::path() : destination / relative;
    if (e.is_symlink()) {
      if (!target.empty()) fs::copy_symlink(e.path(), target);
    } else if (e.is_directory()) {
      if (!target.empty()) fs::create_directories(target);
      walk(source, e.path(), destination, only, found);
    } else if (e.is_regular_file()) {
      if (!is_source(relative)) {
        if (!target.empty()) fs::copy_file(e.path(), target);
        continue;
      }
      const std::string text = read_file(e.path());
      for (const holes::Region& r : holes::find_regions(text, relative.string()))
        found[r.exercise].push_back(relative.string() + ":" + std::to_string(r.begin_line) + "-" +
                                    std::to_string(r.end_line));
      if (!target.empty()) {
        write_file(target, holes::punch_holes(text, relative.string(), readme_for(relative), only));
        fs::permissions(target, fs::status(e.path()).permissions());
      }
    }
  }
}

// The note at the top of the copy: which exercises are holes and how to grade them.
std::string student_note(const Found& found, const std::set<std::string>& only) {
  std::string s =
      "# A student copy\n\n"
      "This is a copy of the repository in which the exercises below are holes: the code that\n"
      "solves each was cut out and replaced by a call that stops the program with a message\n"
      "naming the exercise. Each chapter's README says, under \"Fill the holes\", what to write.\n"
      "Build as the README says, then check your work with\n\n"
      "    tools/grade.sh build                  # a score sheet, one line per exercise\n"
      "    ctest --test-dir build -L ex02.allreduce --output-on-failure   # one exercise's tests\n\n"
      "| exercise | where |\n|---|---|\n";
  for (const auto& [exercise, regions] : found) {
    if (!only.empty() && !only.count(exercise)) continue;
    std::string where;
    for (const std::string& r : regions) where += (where.empty() ? "" : ", ") + ("`" + r + "`");
    s += "| " + exercise + " | " + where + " |\n";
  }
  return s;
}

int run(int argc, char** argv) {
  fs::path source = MGPU_SOURCE_DIR, destination;
  std::set<std::string> only;
  bool list = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw Usage(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--help" || arg == "-h") {
      std::cout << kUsage;
      return 0;
    } else if (arg == "--to") {
      destination = value();
    } else if (arg == "--from") {
      source = value();
    } else if (arg == "--only") {
      std::istringstream names(value());
      for (std::string name; std::getline(names, name, ',');)
        if (!name.empty()) only.insert(name);
    } else if (arg == "--list") {
      list = true;
    } else {
      throw Usage("unknown option '" + arg + "'");
    }
  }
  if (list == !destination.empty()) throw Usage("give either --to DIR or --list");
  if (!fs::is_directory(source / "chapters")) throw Usage("--from " + source.string() + ": not this repository");
  source = fs::canonical(source);

  Found found;
  walk(source, source, {}, only, found);  // reads and checks every marker; writes nothing
  if (list) {
    for (const auto& [exercise, regions] : found) {
      std::cout << exercise;
      for (const std::string& r : regions) std::cout << "  " << r;
      std::cout << "\n";
    }
    return 0;
  }
  for (const std::string& name : only)
    if (!found.count(name)) throw std::runtime_error("--only " + name + ": no exercise of that name is marked");
  if (fs::exists(destination) && !(fs::is_directory(destination) && fs::is_empty(destination)))
    throw std::runtime_error("--to " + destination.string() + ": exists and is not an empty folder");
  fs::create_directories(destination);
  found.clear();
  walk(source, source, fs::canonical(destination), only, found);
  write_file(destination / "STUDENT_COPY.md", student_note(found, only));
  const std::size_t holes = only.empty() ? found.size() : only.size();
  std::cout << "student copy of " << source.string() << " written to " << destination.string() << ": " << holes
            << (holes == 1 ? " exercise" : " exercises") << " made a hole\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const Usage& e) {
    std::cerr << "student_copy: " << e.what() << "\n" << kUsage;
    return 2;
  } catch (const std::exception& e) {  // marker errors, files that cannot be read or written
    std::cerr << "student_copy: " << e.what() << "\n";
    return 1;
  }
}
