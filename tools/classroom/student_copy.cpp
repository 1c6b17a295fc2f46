// student_copy: writes a student copy of this repository, in which every exercise's region
// (holes.h) is a hole, and the teachers' answer keys (INSTRUCTOR.md) are left out.
//
//   build/bin/student_copy --to ../mgpu-student            every exercise a hole
//   build/bin/student_copy --to DIR --only ex02.allreduce   only that one (a comma-separated list)
//   build/bin/student_copy --list                           the exercises and where their regions are
//
// The copy is of the working tree this program was built from (or --from DIR), without .git,
// build folders (any folder holding a CMakeCache.txt) and results/.
//
// A copy that stops part way (a full disk, Ctrl-C) must not block the next try, and must not
// pass for a finished one: the program first writes the file UNFINISHED_STUDENT_COPY into DIR
// and removes it as its last step. When the copy fails, it removes what it wrote (DIR itself
// when it made DIR); a DIR that still holds that file (the program was killed) is emptied and
// written again by the next run. Any other folder that is not empty is refused, never touched.
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
    "into DIR, a folder that must not exist or be empty (or be a copy this program left\n"
    "unfinished), with each exercise's marked region replaced by a hole that stops the\n"
    "program with a message naming the exercise.\n"
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

// The mark of an unfinished copy: in DIR from the first file written to the last. Its first
// line is what proves DIR this program's; only a DIR holding it is ever emptied.
const char* kUnfinishedName = "UNFINISHED_STUDENT_COPY";
const std::string kUnfinishedLine = "student_copy: an unfinished student copy, format 1";
const std::string kUnfinishedText =
    kUnfinishedLine +
    "\nstudent_copy stopped before this copy was complete. Run it again with the same --to: it\n"
    "empties this folder (only while this file is in it) and writes the copy anew.\n";

bool is_unfinished_copy(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec) || !fs::is_regular_file(fs::symlink_status(dir / kUnfinishedName, ec))) return false;
  std::ifstream in(dir / kUnfinishedName);
  std::string first;
  return std::getline(in, first) && first == kUnfinishedLine;
}

// Removes everything in `dir`, which stays; `ec` says what failed.
void empty_folder(const fs::path& dir, std::error_code& ec) {
  std::vector<fs::path> entries;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) entries.push_back(it->path());
  for (const fs::path& p : entries)
    if (!ec) fs::remove_all(p, ec);
}

// What the copy leaves out; `skip` is the --to folder (where it is inside the source).
bool left_out(const fs::directory_entry& e, const fs::path& relative, const fs::path& skip) {
  const std::string name = relative.filename().string();
  if (e.is_directory()) {
    if (name == ".git" || relative == "results") return true;
    if (fs::exists(e.path() / "CMakeCache.txt")) return true;  // a build folder
    std::error_code ec;
    if (!skip.empty() && fs::equivalent(e.path(), skip, ec)) return true;
    return false;
  }
  return name == "INSTRUCTOR.md";
}

// exercise -> "file:line-line" of each region
using Found = std::map<std::string, std::vector<std::string>>;

// Walks `source`, leaving out `skip` (the --to folder, which may hold an earlier copy); with
// `destination` empty only lists.
void walk(const fs::path& source, const fs::path& dir, const fs::path& destination, const fs::path& skip,
          const std::set<std::string>& only, Found& found) {
  std::vector<fs::directory_entry> entries{fs::directory_iterator(dir), fs::directory_iterator()};
  std::sort(entries.begin(), entries.end());  // a reproducible order for --list
  for (const fs::directory_entry& e : entries) {
    const fs::path relative = fs::relative(e.path(), source);
    if (left_out(e, relative, skip)) continue;
    const fs::path target = destination.empty() ? fs::path() : destination / relative;
    if (e.is_symlink()) {
      if (!target.empty()) fs::copy_symlink(e.path(), target);
    } else if (e.is_directory()) {
      if (!target.empty()) fs::create_directories(target);
      walk(source, e.path(), destination, skip, only, found);
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
  walk(source, source, {}, destination, only, found);  // reads and checks every marker; writes nothing
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
  const bool existed = fs::exists(fs::symlink_status(destination));
  if (existed && is_unfinished_copy(destination)) {
    std::cerr << "student_copy: " << destination.string()
              << " is a copy an earlier run left unfinished: it is written anew\n";
    std::error_code ec;
    empty_folder(destination, ec);
    if (ec) throw std::runtime_error(destination.string() + ": the unfinished copy cannot be removed: " + ec.message());
  } else if (existed && !(fs::is_directory(destination) && fs::is_empty(destination))) {
    throw std::runtime_error("--to " + destination.string() +
                             ": exists and is not an empty folder (nor a copy this program left unfinished): "
                             "nothing in it was touched; choose another --to, or empty it yourself");
  }
  fs::path made = destination;  // the outermost folder this run makes (none when DIR existed)
  while (made.has_parent_path() && made.parent_path() != made && !fs::exists(made.parent_path()))
    made = made.parent_path();
  fs::create_directories(destination);
  try {
    write_file(destination / kUnfinishedName, kUnfinishedText);  // first
    found.clear();
    walk(source, source, fs::canonical(destination), destination, only, found);
    write_file(destination / "STUDENT_COPY.md", student_note(found, only));
    fs::remove(destination / kUnfinishedName);  // last
  } catch (const std::exception& e) {
    // What this run wrote goes: all of DIR's content (DIR was empty, or was emptied above), and
    // the folders this run made, DIR among them.
    std::error_code ec;
    if (existed)
      empty_folder(destination, ec);
    else
      fs::remove_all(made, ec);
    throw std::runtime_error(std::string(e.what()) +
                             (ec ? "; removing the unfinished copy in " + destination.string() + " failed too (" +
                                       ec.message() + "): remove it yourself"
                                 : "; the unfinished copy was removed"));
  }
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
