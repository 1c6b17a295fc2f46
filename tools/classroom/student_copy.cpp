// student_copy: writes a student copy of this repository, in which every exercise's region
// (holes.h) is a hole, and the teachers' answer keys (INSTRUCTOR.md) and hidden cases
// (tests/hidden/, and the rubrics' "hidden" lines) are left out. The copy holds one handout per
// assignment (handouts/NN_name.md, from the rubrics: handouts.h), and STUDENT_COPY.tsv, the
// exercises and the files that hold their holes, which tools/classroom/submit.sh packs.
//
//   build/bin/student_copy --to ../mgpu-student            every exercise a hole
//   build/bin/student_copy --to DIR --only ex02.allreduce   only that one (a comma-separated list)
//   build/bin/student_copy --list                           the exercises and where their regions are
//   build/bin/student_copy --handouts DIR                   only the handouts, into DIR
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
#include <unordered_map>
#include <vector>

#include <CLI/CLI.hpp>

#include "common/cli.h"      // prepare_app, parse, text, refuse_command_line: the chapters' conventions
#include "common/program.h"  // start_program
#include "handouts.h"
#include "holes.h"
#include "near_copies.h"

namespace fs = std::filesystem;

namespace {

// What --help says above the flags.
const char* kAbout =
    "Writes a copy of the repository at --from (default: the one this program was built from)\n"
    "into --to DIR, a folder that must not exist or be empty (or be a copy this program left\n"
    "unfinished), with each exercise's marked region replaced by a hole that stops the\n"
    "program with a message naming the exercise. INSTRUCTOR.md files (answer keys),\n"
    "tests/hidden/ and the rubrics' hidden lines (the teacher's hidden cases), .git, build\n"
    "folders and results/ are left out; handouts/ holds one handout per assignment, made from\n"
    "tools/classroom/rubrics/. Give one of --to, --list, --handouts and --find-answers.";

// A command line that names a copy, but not one this program can make: refused as a bad flag
// is (mgpu::refuse_command_line: the reason, "run with --help", status 2).
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
    if (name == ".git" || relative == "results" || relative == "tests/hidden") return true;
    if (fs::exists(e.path() / "CMakeCache.txt")) return true;  // a build folder
    std::error_code ec;
    if (!skip.empty() && fs::equivalent(e.path(), skip, ec)) return true;
    return false;
  }
  return name == "INSTRUCTOR.md";
}

// exercise -> "file:line-line" of each region
using Found = std::map<std::string, std::vector<std::string>>;

// exercise -> "file:line" of each hole in the copy (its comment line), and file of each
struct Holes {
  handouts::Holes at;
  std::map<std::string, std::set<std::string>> files;
};

// Walks `source`, leaving out `skip` (the --to folder, which may hold an earlier copy); with
// `destination` empty only lists.
void walk(const fs::path& source, const fs::path& dir, const fs::path& destination, const fs::path& skip,
          const std::set<std::string>& only, Found& found, Holes& holes) {
  std::vector<fs::directory_entry> entries{fs::directory_iterator(dir), fs::directory_iterator()};
  std::sort(entries.begin(), entries.end());  // a reproducible order for --list
  for (const fs::directory_entry& e : entries) {
    // lexically: fs::relative would follow a symbolic link to where it points
    const fs::path relative = e.path().lexically_relative(source);
    if (left_out(e, relative, skip)) continue;
    const fs::path target = destination.empty() ? fs::path() : destination / relative;
    if (e.is_symlink()) {
      if (!target.empty()) fs::copy_symlink(e.path(), target);
    } else if (e.is_directory()) {
      if (!target.empty()) fs::create_directories(target);
      walk(source, e.path(), destination, skip, only, found, holes);
    } else if (e.is_regular_file()) {
      if (!is_source(relative)) {
        if (target.empty()) continue;
        if (relative.extension() == ".rubric") {  // the hidden cases' lines stay the teacher's
          write_file(target, handouts::without_hidden(read_file(e.path())));
          fs::permissions(target, fs::status(e.path()).permissions());
        } else if (relative.extension() == ".md") {  // a README's passages that answer a hole go
          write_file(target, holes::hide_answers(read_file(e.path()), relative.string(), only));
          fs::permissions(target, fs::status(e.path()).permissions());
        } else {
          fs::copy_file(e.path(), target);
        }
        continue;
      }
      const std::string text = read_file(e.path());
      int removed = 0;  // lines the holes above took out of this file in the copy
      for (const holes::Region& r : holes::find_regions(text, relative.string())) {
        found[r.exercise].push_back(relative.string() + ":" + std::to_string(r.begin_line) + "-" +
                                    std::to_string(r.end_line));
        if (!only.empty() && !only.count(r.exercise)) continue;
        holes.at[r.exercise].push_back(relative.string() + ":" + std::to_string(r.begin_line - removed));
        holes.files[r.exercise].insert(relative.string());
        removed += (r.end_line - r.begin_line + 1) - 2;  // a region becomes the stub's two lines
      }
      if (!target.empty()) {
        write_file(target, holes::punch_holes(text, relative.string(), readme_for(relative), only));
        fs::permissions(target, fs::status(e.path()).permissions());
      }
    }
  }
}

// The note at the top of the copy: which exercises are holes and how to grade them.
// Where each hole is in THIS copy (file:line of its comment): not the answer key's line ranges,
// which would say how long each answer is, and point at the wrong lines here.
std::string student_note(const Holes& holes) {
  std::string s =
      "# A student copy\n\n"
      "This is a copy of the repository in which the exercises below are holes: the code that\n"
      "solves each was cut out and replaced by a call that stops the program with a message\n"
      "naming the exercise. Each chapter's README says, under \"Fill the holes\", what to write.\n"
      "Build as the README says, then check your work with\n\n"
      "    tools/grade.sh build                  # a score sheet, one line per exercise, and the points\n"
      "    ctest --test-dir build -L ex02.allreduce --output-on-failure   # one exercise's tests\n\n"
      "The folder handouts/ has one page per assignment: what to write and where, the points, the\n"
      "expected time, how to test and how to hand in (tools/classroom/submit.sh, which packs the\n"
      "files listed in STUDENT_COPY.tsv).\n\n"
      "| exercise | its holes (file:line) |\n|---|---|\n";
  for (const auto& [exercise, places] : holes.at) {
    std::string where;
    for (const std::string& p : places) where += (where.empty() ? "" : ", ") + ("`" + p + "`");
    s += "| " + exercise + " | " + where + " |\n";
  }
  return s;
}

// One handout per rubric in SOURCE/tools/classroom/rubrics that has a hole, into `dir`;
// returns how many were written.
int write_handouts(const fs::path& source, const fs::path& dir, const Holes& holes) {
  const fs::path rubrics = source / "tools" / "classroom" / "rubrics";
  if (!fs::is_directory(rubrics)) return 0;
  std::vector<fs::path> files;
  for (const fs::directory_entry& e : fs::directory_iterator(rubrics))
    if (e.path().extension() == ".rubric") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  int written = 0;
  for (const fs::path& file : files) {
    const handouts::Rubric rubric =
        handouts::parse_rubric(read_file(file), fs::relative(file, source).string());
    const std::string readme = "chapters/" + rubric.assignment + "/README.md";
    const std::map<std::string, handouts::Row> rows =
        fs::exists(source / readme) ? handouts::fill_the_holes_rows(read_file(source / readme))
                                    : std::map<std::string, handouts::Row>{};
    const std::string text = handouts::handout(rubric, holes.at, rows, readme);
    if (text.empty()) continue;
    fs::create_directories(dir);
    write_file(dir / (rubric.assignment + ".md"), text);
    ++written;
  }
  return written;
}

// STUDENT_COPY.tsv: "exercise<TAB>file" for each file that holds one of its holes.
std::string exercise_files(const Holes& holes) {
  std::string s;
  for (const auto& [exercise, files] : holes.files)
    for (const std::string& f : files) s += exercise + "\t" + f + "\n";
  return s;
}

// --find-answers: the answer of every hole of the student copy `copy` (its regions in `source`)
// searched for in every other text file of the copy (near_copies.h). What only the answer says
// is its shingles less those of the copy's own file (the code given around the hole) and those
// that more than kCommonFiles files of the copy hold (idioms). A file that holds kHeld or more
// of them holds the answer. Regions with fewer than kMinShingles such shingles are too short to
// tell from ordinary code, and are listed as such. Returns the number of (region, file) pairs
// that hold an answer; prints, for a person to look at, those that hold half of kHeld or more.
constexpr int kShingle = 8;       // tokens a shingle: about one short statement
constexpr int kCommonFiles = 3;   // a shingle in more files than this is an idiom
constexpr int kMinShingles = 4;   // an answer with fewer is not searched for
constexpr double kHeld = 0.25;    // a quarter of what only the answer says, in one file

int find_answers(const fs::path& source, const fs::path& copy) {
  std::ifstream tsv(copy / "STUDENT_COPY.tsv");
  if (!tsv) throw Usage("--find-answers " + copy.string() + ": not a student copy (no STUDENT_COPY.tsv)");
  std::set<std::string> exercises;
  for (std::string line; std::getline(tsv, line);)
    if (!line.empty()) exercises.insert(line.substr(0, line.find('\t')));

  // Every text file of the copy as shingles, and in how many files each shingle is.
  std::map<std::string, near_copies::Shingles> texts;  // relative path -> shingles
  std::unordered_map<std::uint64_t, int> files_holding;
  for (fs::recursive_directory_iterator it(copy), end; it != end; ++it) {
    if (it->is_directory() && fs::exists(it->path() / "CMakeCache.txt")) {  // a build folder
      it.disable_recursion_pending();
      continue;
    }
    if (it->is_symlink() || !it->is_regular_file() || it->file_size() > (4u << 20)) continue;
    const std::string text = read_file(it->path());
    if (text.find('\0') != std::string::npos) continue;  // not text
    near_copies::Shingles& s = texts[it->path().lexically_relative(copy).string()];
    s = near_copies::shingles(near_copies::tokens(text), kShingle);
    for (std::uint64_t h : s) ++files_holding[h];
  }

  int held = 0;
  for (fs::recursive_directory_iterator it(source), end; it != end; ++it) {
    const fs::path relative = it->path().lexically_relative(source);
    if (it->is_directory() && (left_out(*it, relative, copy) || fs::exists(it->path() / "CMakeCache.txt"))) {
      it.disable_recursion_pending();
      continue;
    }
    if (!it->is_regular_file() || !is_source(relative)) continue;
    const std::string text = read_file(it->path());
    std::vector<std::string> lines;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    for (const holes::Region& r : holes::find_regions(text, relative.string())) {
      if (!exercises.count(r.exercise)) continue;
      std::string answer;
      for (int l = r.begin_line + 1; l < r.end_line; ++l) answer += lines[l - 1] + "\n";
      const auto own = texts.find(relative.string());  // the hole's own file in the copy
      near_copies::Shingles only_answer;
      for (std::uint64_t h : near_copies::shingles(near_copies::tokens(answer), kShingle)) {
        const auto holding = files_holding.find(h);
        const bool around_the_hole = own != texts.end() && own->second.count(h);
        const bool idiom = holding != files_holding.end() && holding->second > kCommonFiles;
        if (!around_the_hole && !idiom) only_answer.insert(h);
      }
      const std::string where = r.exercise + " (" + relative.string() + ":" + std::to_string(r.begin_line) + "-" +
                                std::to_string(r.end_line) + ")";
      if (only_answer.size() < static_cast<std::size_t>(kMinShingles)) {
        std::cout << "too short to search: " << where << "\n";
        continue;
      }
      for (const auto& [file, shingles] : texts) {
        if (file == relative.string()) continue;
        const double share = near_copies::containment(only_answer, shingles);
        const int percent = static_cast<int>(100 * share + 0.5);
        if (share >= kHeld) {
          ++held;
          std::cout << "HOLDS THE ANSWER: " << file << " holds " << percent << "% of " << where << "\n";
        } else if (share >= kHeld / 2) {
          std::cout << "near: " << file << " holds " << percent << "% of " << where << " (under "
                    << static_cast<int>(100 * kHeld) << "%)\n";
        }
      }
    }
  }
  return held;
}

int run(int argc, char** argv) {
  std::string from = MGPU_SOURCE_DIR, to, handouts, find_in, only_list;
  bool list = false;
  CLI::App app{kAbout, "student_copy"};
  mgpu::prepare_app(app);  // the chapters' conventions: -h, and a flag given twice keeps its last value
  app.add_option("--to", to, "write the student copy into DIR")->type_name("DIR")->check(mgpu::text("a folder"));
  app.add_option("--from", from, "the repository to copy (default: the one this program was built from)")
      ->type_name("SOURCE")
      ->check(mgpu::text("a folder"));
  app.add_option("--only", only_list, "make holes of these exercises only (the others stay solved)")
      ->type_name("EXERCISE[,EXERCISE...]")
      ->check(mgpu::text("exercises' names, separated by commas"));
  app.add_flag("--list", list, "print every exercise and where its regions are, and write nothing");
  app.add_option("--handouts", handouts, "write only the handouts (as the copy would hold them) into DIR")
      ->type_name("DIR")
      ->check(mgpu::text("a folder"));
  app.add_option("--find-answers", find_in,
                 "search every file of the student copy COPY for a near copy of the answer of each of its "
                 "holes (status 1 when one holds an answer, 0 when none does)")
      ->type_name("COPY")
      ->check(mgpu::text("a student copy's folder"));
  const mgpu::Parsed parsed = mgpu::parse(app, std::vector<std::string>(argv + 1, argv + argc));
  if (parsed.help) {
    std::cout << app.help();
    return 0;
  }
  if (!parsed.error.empty()) throw Usage(parsed.error);
  if (int(list) + int(!to.empty()) + int(!handouts.empty()) + int(!find_in.empty()) != 1)
    throw Usage("give one of --to DIR, --list, --handouts DIR or --find-answers COPY");
  std::set<std::string> only;
  std::istringstream names(only_list);
  for (std::string name; std::getline(names, name, ',');)
    if (!name.empty()) only.insert(name);
  fs::path source = from;
  const fs::path destination = to, handouts_dir = handouts, searched = find_in;
  if (!fs::is_directory(source / "chapters")) throw Usage("--from " + source.string() + ": not this repository");
  source = fs::canonical(source);
  if (!searched.empty()) {
    if (!only.empty()) throw Usage("--only is not for --find-answers (the copy's STUDENT_COPY.tsv names its holes)");
    const int held = find_answers(source, searched);
    std::cout << (held == 0 ? "no file of " + searched.string() + " holds the answer of one of its holes\n"
                            : std::to_string(held) + " file(s) of " + searched.string() + " hold a hole's answer\n");
    return held == 0 ? 0 : 1;
  }

  Found found;
  Holes where;
  walk(source, source, {}, destination, only, found, where);  // reads and checks every marker; writes nothing
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
  if (!handouts_dir.empty()) {
    const int n = write_handouts(source, handouts_dir, where);
    std::cout << n << (n == 1 ? " handout" : " handouts") << " written to " << handouts_dir.string() << "\n";
    return 0;
  }
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
    where = {};
    walk(source, source, fs::canonical(destination), destination, only, found, where);
    write_file(destination / "STUDENT_COPY.md", student_note(where));
    write_file(destination / "STUDENT_COPY.tsv", exercise_files(where));
    write_handouts(source, destination / "handouts", where);
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
  mgpu::start_program(argv);  // line-buffered output, and a failed write of it fails the program
  try {
    return run(argc, argv);
  } catch (const Usage& e) {
    mgpu::refuse_command_line("student_copy", e.what());
  } catch (const std::exception& e) {  // marker errors, files that cannot be read or written
    std::cerr << "student_copy: " << e.what() << "\n";
    return 1;
  }
}
