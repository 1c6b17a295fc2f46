// The classroom kit's rubrics and handouts. A rubric (tools/classroom/rubrics/NN_name.rubric,
// plain text a teacher edits) gives an assignment, one chapter, its exercises' expected times
// and the points of their graded cases; a handout is the page a student reads for it, made from
// the rubric, the exercise regions (holes.h) and the chapter README's "Fill the holes" table.
//
// A rubric, one statement a line ('#' starts a comment line):
//
//     assignment Data parallelism by hand                  the title, once, first
//     given the devices, streams and events of common/device.h      what is given (any number)
//     exercise ex02.allreduce 40                           an exercise and its minutes
//       case ex02.allreduce:sums 4 every element the sum  a graded case: a ctest test, points, what
//       hidden ex02.allreduce:hidden_more_devices 4 ...    a hidden case (tests/hidden/)
//
// tools/grade.sh reads the same lines for the points.
#pragma once
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace handouts {

struct RubricError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Case {
  std::string test;  // the ctest test: the exercise's own, or <exercise>:<case>
  int points = 0;
  bool hidden = false;
  std::string what;
};

struct Exercise {
  std::string name;
  int minutes = 0;
  std::vector<Case> cases;
};

struct Rubric {
  std::string assignment;  // the file's name without .rubric: 02_data_parallel
  std::string title;
  std::vector<std::string> given;
  std::vector<Exercise> exercises;
};

// Throws RubricError, naming `file` and the line, for an unknown statement, a case before any
// exercise or not named after its exercise, or a number that is not one.
Rubric parse_rubric(const std::string& text, const std::string& file);

// The rubric as a student copy holds it: the lines of hidden cases left out.
std::string without_hidden(const std::string& text);

// One row of a chapter README's "Fill the holes" table: | `exNN.name` | where | what | checked by |
struct Row {
  std::string where, what, checked_by;
};
std::map<std::string, Row> fill_the_holes_rows(const std::string& readme);

// Where an exercise's holes are in the student copy: "file:line" of each (the hole's comment line).
using Holes = std::map<std::string, std::vector<std::string>>;

// The handout of one assignment, in Markdown: only the exercises that are holes in `holes`.
// `readme` is the chapter README's path in the copy. Empty when none of its exercises is a hole.
std::string handout(const Rubric& rubric, const Holes& holes, const std::map<std::string, Row>& rows,
                    const std::string& readme);

}  // namespace handouts
