#include "handouts.h"

#include <regex>
#include <sstream>

namespace handouts {
namespace {

std::string trim(const std::string& s) {
  const std::size_t b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t\r");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

bool is_number(const std::string& s) {
  return !s.empty() && s.size() < 7 && s.find_first_not_of("0123456789") == std::string::npos;
}

// "ex02.allreduce:sums" -> the shell-quoted ctest pattern '^ex02\.allreduce:sums$'
std::string test_pattern(const std::string& test) {
  std::string out = "'^";
  for (char c : test) out += c == '.' ? std::string("\\.") : std::string(1, c);
  return out + "$'";
}

}  // namespace

Rubric parse_rubric(const std::string& text, const std::string& file) {
  Rubric r;
  const std::size_t slash = file.find_last_of('/');
  r.assignment = file.substr(slash == std::string::npos ? 0 : slash + 1);
  if (r.assignment.size() > 7 && r.assignment.compare(r.assignment.size() - 7, 7, ".rubric") == 0)
    r.assignment.resize(r.assignment.size() - 7);
  r.title = r.assignment;
  std::istringstream lines(text);
  std::string line;
  for (int number = 1; std::getline(lines, line); ++number) {
    const std::string where = file + ":" + std::to_string(number) + ": ";
    std::istringstream words(line);
    std::string kind, a, b;
    words >> kind;
    if (kind.empty() || kind[0] == '#') continue;
    std::string rest;
    std::getline(words, rest);
    rest = trim(rest);
    if (kind == "assignment") {
      r.title = rest;
    } else if (kind == "given") {
      r.given.push_back(rest);
    } else if (kind == "exercise") {
      std::istringstream fields(rest);
      std::string extra;
      fields >> a >> b;
      if (!std::regex_match(a, std::regex("ex[0-9][0-9]\\.[a-z0-9_]+")) || !is_number(b) || (fields >> extra))
        throw RubricError(where + "an exercise line is 'exercise NAME MINUTES', got '" + trim(line) + "'");
      r.exercises.push_back({a, std::stoi(b), {}});
    } else if (kind == "case" || kind == "hidden") {
      std::istringstream fields(rest);
      fields >> a >> b;
      std::string what;
      std::getline(fields, what);
      if (r.exercises.empty()) throw RubricError(where + "a " + kind + " before any 'exercise' line");
      const std::string& exercise = r.exercises.back().name;
      if (a != exercise && a.rfind(exercise + ":", 0) != 0)
        throw RubricError(where + "the case '" + a + "' is not named after its exercise, " + exercise +
                          " (NAME or NAME:CASE)");
      if (!std::regex_match(a, std::regex("[a-z0-9_.:]+")))
        throw RubricError(where + "the case '" + a + "' has a character other than a-z 0-9 _ . :");
      if (!is_number(b)) throw RubricError(where + "'" + b + "' is not a whole number of points");
      r.exercises.back().cases.push_back({a, std::stoi(b), kind == "hidden", trim(what)});
    } else {
      throw RubricError(where + "unknown statement '" + kind + "' (assignment, given, exercise, case or hidden)");
    }
  }
  return r;
}

std::string without_hidden(const std::string& text) {
  std::istringstream lines(text);
  std::string out, line, kind;
  while (std::getline(lines, line)) {
    std::istringstream words(line);
    if (words >> kind && kind == "hidden") continue;
    out += line + "\n";
  }
  return out;
}

std::map<std::string, Row> fill_the_holes_rows(const std::string& readme) {
  std::map<std::string, Row> rows;
  std::istringstream lines(readme);
  std::string line;
  static const std::regex row("^\\| `(ex[0-9][0-9]\\.[a-z0-9_]+)` \\|(.*)\\|(.*)\\|(.*)\\|\\s*$");
  std::smatch m;
  while (std::getline(lines, line))
    if (std::regex_match(line, m, row)) rows[m[1]] = {trim(m[2]), trim(m[3]), trim(m[4])};
  return rows;
}

std::string handout(const Rubric& rubric, const Holes& holes, const std::map<std::string, Row>& rows,
                    const std::string& readme) {
  std::vector<const Exercise*> todo;
  for (const Exercise& e : rubric.exercises)
    if (holes.count(e.name)) todo.push_back(&e);
  if (todo.empty()) return "";
  int minutes = 0, visible = 0, hidden = 0;
  for (const Exercise* e : todo) {
    minutes += e->minutes;
    for (const Case& c : e->cases) (c.hidden ? hidden : visible) += c.points;
  }
  std::ostringstream s;
  s << "# Assignment " << rubric.assignment.substr(0, 2) << ": " << rubric.title << "\n\n";
  s << "Expected time: about " << minutes << " minutes.\n\nPoints: " << visible + hidden << ", of which " << visible
    << " come from the tests in this copy";
  if (hidden > 0)
    s << " and " << hidden
      << " from hidden cases your teacher runs on your submission:\nthe same checks on other inputs (other "
         "seeds, sizes and device counts), so that only a\nsolution that is right in general earns them";
  s << ".\n\nRead `" << readme
    << "` first, its section \"Fill the holes\" above all: it explains what each hole must do and why.\n\n";
  if (!rubric.given.empty()) {
    s << "## What is given\n\nEverything outside the holes is written and tested, among it:\n\n";
    for (const std::string& g : rubric.given) s << "- " << g << "\n";
    s << "\n";
  }
  s << "## What to implement\n\n";
  for (const Exercise* e : todo) {
    int points = 0, hidden_points = 0;
    for (const Case& c : e->cases) (c.hidden ? hidden_points : points) += c.points;
    s << "### " << e->name << " (" << points + hidden_points << " points, about " << e->minutes << " minutes)\n\n";
    s << "- Where: ";
    const std::vector<std::string>& at = holes.at(e->name);
    for (std::size_t i = 0; i < at.size(); ++i) s << (i ? ", " : "") << "`" << at[i] << "`";
    const auto row = rows.find(e->name);
    if (row != rows.end()) {
      s << ", in " << row->second.where << "\n";
      s << "- What to write: " << row->second.what << "\n";
      s << "- Checked by: " << row->second.checked_by << "\n";
    } else {
      s << "\n";
    }
    s << "- Each hole is two lines, `// EXERCISE " << e->name
      << ": your code goes here` and a call that stops the program: replace both with your code.\n";
    s << "- Its tests: `ctest --test-dir build -L " << e->name << " --output-on-failure`\n\n";
    s << "| graded case | points | what it checks | run it alone |\n|---|---|---|---|\n";
    for (const Case& c : e->cases)
      if (!c.hidden)
        s << "| `" << c.test << "` | " << c.points << " | " << c.what << " | `ctest --test-dir build -R "
          << test_pattern(c.test) << " --output-on-failure` |\n";
    if (hidden_points > 0)
      s << "| hidden cases | " << hidden_points << " | the same function on other inputs | run by your teacher |\n";
    s << "\n";
  }
  s << "## How to test locally\n\n"
       "Build as the top README says, then run each exercise's tests as above, or all of them with\n"
       "the points they earn:\n\n"
       "```sh\n"
       "cmake -S . -B build && cmake --build build -j\"$(nproc)\"\n"
       "tools/grade.sh build        # every exercise, then the points case by case\n"
       "```\n\n"
       "A test that stops at `exercise ... is not done yet` reached a hole: yours, or that of an exercise it\n"
       "uses (the README's \"Fill the holes\" says which to do first).\n\n"
       "## What to hand in\n\n"
       "From the top of this copy, with your own id (letters, digits and `. _ @ -`):\n\n"
       "```sh\n"
       "tools/classroom/submit.sh --student YOUR_ID . YOUR_ID.tar.gz\n"
       "```\n\n"
       "It packs the files that hold the holes, as they are now, with a manifest naming you and\n"
       "each exercise, and says which are still holes. Hand in `YOUR_ID.tar.gz`; nothing else of\n"
       "the copy is graded, so keep your changes inside those files.\n";
  return s.str();
}

}  // namespace handouts
