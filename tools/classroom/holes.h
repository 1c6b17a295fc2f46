// The classroom kit's one idea: the repository is the answer key, and a student copy is the
// repository with the exercises' regions cut out.
//
// In the solution code an exercise's region sits between two comment lines of their own,
//
//     // BEGIN EXERCISE ex02.allreduce
//     ...the solution...
//     // END EXERCISE ex02.allreduce
//
// always inside a function body (a function, a kernel's functor, a lambda). An exercise may
// have several regions, in one file or several. The name is "ex" + the chapter's two digits
// + "." + a word of lower-case letters, digits and underscores. punch_holes() replaces each
// region, markers included, by two lines at the marker's indentation:
//
//     // EXERCISE ex02.allreduce: your code goes here (chapters/02_data_parallel/README.md, "Fill the holes")
//     mgpu::exercise_not_done("ex02.allreduce", "chapters/02_data_parallel/README.md");
//
// so the student copy compiles, and stops with a message naming the exercise where the program
// reaches the hole (common/exercise.h).
#pragma once
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace holes {

struct MarkerError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// One region: the exercise it belongs to, its marker lines (1-based) and the BEGIN marker's
// indentation (where the stub goes).
struct Region {
  std::string exercise;
  int begin_line = 0, end_line = 0;
  std::string indent;
};

// The regions of a file's text, in order. Throws MarkerError, naming `file` and the line, for
// an END without its BEGIN, a BEGIN inside a region, an END naming another exercise, a region
// left open at the end of the file, a marker at the start of a line (outside any function), or
// a malformed name.
std::vector<Region> find_regions(const std::string& text, const std::string& file);

// `text` with the regions of the exercises in `only` (every exercise when `only` is empty)
// replaced by the stub above; `readme` is the README the stub points to.
std::string punch_holes(const std::string& text, const std::string& file, const std::string& readme,
                        const std::set<std::string>& only = {});

// A README may hold a passage that gives an exercise away (a formula the hole is the code of).
// It sits between two lines of their own, invisible where Markdown is rendered,
//
//     <!-- BEGIN ANSWER ex09.batch_norm_backward -->
//     ...the passage...
//     <!-- END ANSWER ex09.batch_norm_backward -->
//
// and hide_answers() replaces it, markers included, by one line saying what was left out, for
// the exercises in `only` (every exercise when `only` is empty). Throws MarkerError, naming
// `file` and the line, for a marker that is malformed, unmatched or left open.
std::string hide_answers(const std::string& text, const std::string& file, const std::set<std::string>& only = {});

}  // namespace holes
