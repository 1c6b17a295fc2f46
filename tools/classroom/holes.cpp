#include "holes.h"

#include <cctype>
#include <sstream>

namespace holes {
namespace {

// A text cut into lines, each without its '\n'; `ends_with_newline` says whether the last one had one.
struct Lines {
  std::vector<std::string> lines;
  bool ends_with_newline = false;
};

Lines split_lines(const std::string& text) {
  Lines out;
  std::size_t at = 0;
  while (at < text.size()) {
    const std::size_t end = text.find('\n', at);
    if (end == std::string::npos) {
      out.lines.push_back(text.substr(at));
      return out;
    }
    out.lines.push_back(text.substr(at, end - at));
    at = end + 1;
  }
  out.ends_with_newline = !text.empty();
  return out;
}

bool is_exercise_name(const std::string& name) {
  // ex + two digits + '.' + [a-z0-9_]+
  if (name.size() < 6 || name.compare(0, 2, "ex") != 0 || !std::isdigit(static_cast<unsigned char>(name[2])) ||
      !std::isdigit(static_cast<unsigned char>(name[3])) || name[4] != '.')
    return false;
  for (std::size_t i = 5; i < name.size(); ++i) {
    const char c = name[i];
    if (!(std::islower(static_cast<unsigned char>(c)) || std::isdigit(static_cast<unsigned char>(c)) || c == '_'))
      return false;
  }
  return true;
}

// A marker line: "<indent>// BEGIN EXERCISE <name>" or the same with END. kind is "BEGIN",
// "END" or "" (not a marker). Anything else that mentions "BEGIN EXERCISE" or "END EXERCISE"
// after "//" is a mistake, reported rather than copied through as if it were code.
struct Marker {
  std::string kind, name, indent;
};

Marker parse_marker(const std::string& line, const std::string& file, int number) {
  const std::size_t code = line.find_first_not_of(" \t");
  if (code == std::string::npos || line.compare(code, 2, "//") != 0) return {};
  std::istringstream words(line.substr(code + 2));
  std::string kind, exercise, name, extra;
  words >> kind >> exercise;
  if ((kind != "BEGIN" && kind != "END") || exercise != "EXERCISE") return {};
  const std::string where = file + ":" + std::to_string(number) + ": ";
  if (!(words >> name) || (words >> extra) || !is_exercise_name(name))
    throw MarkerError(where + "a marker is '// " + kind + " EXERCISE exNN.name' alone on its line, got '" + line + "'");
  if (code == 0)
    throw MarkerError(where + "the marker of " + name +
                      " starts its line: a region must sit inside a function body, indented");
  return {kind, name, line.substr(0, code)};
}

}  // namespace

std::vector<Region> find_regions(const std::string& text, const std::string& file) {
  const Lines lines = split_lines(text);
  std::vector<Region> regions;
  bool open = false;
  for (std::size_t i = 0; i < lines.lines.size(); ++i) {
    const int number = static_cast<int>(i) + 1;
    const Marker m = parse_marker(lines.lines[i], file, number);
    const std::string where = file + ":" + std::to_string(number) + ": ";
    if (m.kind == "BEGIN") {
      if (open)
        throw MarkerError(where + "BEGIN EXERCISE " + m.name + " inside the region of " + regions.back().exercise +
                          " (opened on line " + std::to_string(regions.back().begin_line) + ")");
      regions.push_back({m.name, number, 0, m.indent});
      open = true;
    } else if (m.kind == "END") {
      if (!open) throw MarkerError(where + "END EXERCISE " + m.name + " without its BEGIN");
      if (m.name != regions.back().exercise)
        throw MarkerError(where + "END EXERCISE " + m.name + " closes the region of " + regions.back().exercise +
                          " (opened on line " + std::to_string(regions.back().begin_line) + ")");
      regions.back().end_line = number;
      open = false;
    }
  }
  if (open)
    throw MarkerError(file + ":" + std::to_string(regions.back().begin_line) + ": the region of " +
                      regions.back().exercise + " is never closed (no END EXERCISE)");
  return regions;
}

std::string punch_holes(const std::string& text, const std::string& file, const std::string& readme,
                        const std::set<std::string>& only) {
  const std::vector<Region> regions = find_regions(text, file);
  const Lines lines = split_lines(text);
  std::string out;
  std::size_t next = 0;  // the next region
  for (std::size_t i = 0; i < lines.lines.size(); ++i) {
    const int number = static_cast<int>(i) + 1;
    if (next < regions.size() && regions[next].begin_line == number) {
      const Region& r = regions[next++];
      if (only.empty() || only.count(r.exercise)) {
        out += r.indent + "// EXERCISE " + r.exercise + ": your code goes here (" + readme + ", \"Fill the holes\")\n";
        out += r.indent + "mgpu::exercise_not_done(\"" + r.exercise + "\", \"" + readme + "\");\n";
        i = static_cast<std::size_t>(r.end_line) - 1;  // skip to the END marker; the loop steps past it
        continue;
      }
    }
    out += lines.lines[i];
    if (i + 1 < lines.lines.size() || lines.ends_with_newline) out += '\n';
  }
  return out;
}

namespace {

// "<!-- BEGIN ANSWER <name> -->" or the same with END, alone on its line: kind "BEGIN" or "END"
// and the name; kind "" for any other line. A line that starts "<!-- BEGIN ANSWER" or
// "<!-- END ANSWER" but is not a whole marker is a mistake, reported.
Marker parse_answer_marker(const std::string& line, const std::string& file, int number) {
  for (const std::string kind : {"BEGIN", "END"}) {
    const std::string open = "<!-- " + kind + " ANSWER ";
    if (line.compare(0, open.size(), open) != 0) continue;
    const std::string close = " -->";
    const std::string name =
        line.size() > open.size() + close.size() && line.compare(line.size() - close.size(), close.size(), close) == 0
            ? line.substr(open.size(), line.size() - open.size() - close.size())
            : "";
    if (!is_exercise_name(name))
      throw MarkerError(file + ":" + std::to_string(number) + ": an answer marker is '<!-- " + kind +
                        " ANSWER exNN.name -->' alone on its line, got '" + line + "'");
    return {kind, name, ""};
  }
  return {};
}

}  // namespace

std::string hide_answers(const std::string& text, const std::string& file, const std::set<std::string>& only) {
  const Lines lines = split_lines(text);
  std::string out;
  std::string open;  // the exercise whose passage is being read, "" outside one
  int opened_on = 0;
  bool hiding = false;
  for (std::size_t i = 0; i < lines.lines.size(); ++i) {
    const int number = static_cast<int>(i) + 1;
    const Marker m = parse_answer_marker(lines.lines[i], file, number);
    const std::string where = file + ":" + std::to_string(number) + ": ";
    if (m.kind == "BEGIN") {
      if (!open.empty())
        throw MarkerError(where + "BEGIN ANSWER " + m.name + " inside the passage of " + open + " (opened on line " +
                          std::to_string(opened_on) + ")");
      open = m.name;
      opened_on = number;
      hiding = only.empty() || only.count(m.name);
      if (hiding) out += "*(A passage that answers exercise " + m.name + " is left out of the student copy.)*\n";
      continue;
    }
    if (m.kind == "END") {
      if (m.name != open) throw MarkerError(where + "END ANSWER " + m.name + " does not close an open passage of it");
      open.clear();
      hiding = false;
      continue;
    }
    if (hiding) continue;
    out += lines.lines[i];
    if (i + 1 < lines.lines.size() || lines.ends_with_newline) out += '\n';
  }
  if (!open.empty())
    throw MarkerError(file + ":" + std::to_string(opened_on) + ": the answer passage of " + open +
                      " is never closed (no END ANSWER)");
  return out;
}

}  // namespace holes
