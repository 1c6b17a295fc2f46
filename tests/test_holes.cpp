// The classroom kit's hole puncher (tools/classroom/holes.h): regions found and cut out
// exactly, every malformed marker refused with its file and line, and the repository's own
// markers all well-formed, one region set per graded exercise; and the near-copy search
// (near_copies.h) that proves no other file of a copy holds an answer.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "holes.h"
#include "near_copies.h"

namespace {

std::string read_text(const std::filesystem::path& file) {
  std::ifstream in(file);
  std::ostringstream read;
  read << in.rdbuf();
  return read.str();
}

const char* kSolved =
    "int f(int x) {\n"
    "  int y = x;\n"
    "  // BEGIN EXERCISE ex01.double_it\n"
    "  y *= 2;\n"
    "  // END EXERCISE ex01.double_it\n"
    "  return y;\n"
    "}\n"
    "float g(float v) {\n"
    "    // BEGIN EXERCISE ex02.square\n"
    "    return v * v;\n"
    "    // END EXERCISE ex02.square\n"
    "}\n";

std::string stub(const std::string& indent, const std::string& exercise, const std::string& readme) {
  return indent + "// EXERCISE " + exercise + ": your code goes here (" + readme + ", \"Fill the holes\")\n" + indent +
         "mgpu::exercise_not_done(\"" + exercise + "\", \"" + readme + "\");\n";
}

}  // namespace

TEST_CASE("find_regions: each region's exercise and marker lines, in order") {
  const std::vector<holes::Region> r = holes::find_regions(kSolved, "f.cpp");
  REQUIRE(r.size() == 2);
  CHECK(r[0].exercise == "ex01.double_it");
  CHECK(r[0].begin_line == 3);
  CHECK(r[0].end_line == 5);
  CHECK(r[1].exercise == "ex02.square");
  CHECK(r[1].begin_line == 9);
  CHECK(r[1].end_line == 11);
}

TEST_CASE("punch_holes: each region, markers included, becomes the stub at the marker's indentation") {
  const std::string want = std::string(
                               "int f(int x) {\n"
                               "  int y = x;\n") +
                           stub("  ", "ex01.double_it", "R.md") +
                           "  return y;\n"
                           "}\n"
                           "float g(float v) {\n" +
                           stub("    ", "ex02.square", "R.md") + "}\n";
  CHECK(holes::punch_holes(kSolved, "f.cpp", "R.md") == want);
}

TEST_CASE("punch_holes with `only`: the other exercises stay solved, markers and all") {
  const std::string got = holes::punch_holes(kSolved, "f.cpp", "R.md", {"ex02.square"});
  CHECK(got.find("y *= 2;") != std::string::npos);
  CHECK(got.find("// BEGIN EXERCISE ex01.double_it") != std::string::npos);
  CHECK(got.find("return v * v;") == std::string::npos);
  CHECK(got.find(stub("    ", "ex02.square", "R.md")) != std::string::npos);
}

TEST_CASE("a file without markers comes through byte for byte, with or without a last newline") {
  for (const std::string text : {"", "a\n", "a\nb", "\n\n x // BEGIN something else\n", "// END of story\n"})
    CHECK(holes::punch_holes(text, "f.cpp", "R.md") == text);
}

TEST_CASE("hide_answers: a README's answer passage, markers included, becomes one line saying so") {
  const std::string readme =
      "# Title\n"
      "The backward pass:\n"
      "<!-- BEGIN ANSWER ex09.bn_back -->\n"
      "dz = formula\n"
      "more of it\n"
      "<!-- END ANSWER ex09.bn_back -->\n"
      "After it.\n";
  const std::string want =
      "# Title\n"
      "The backward pass:\n"
      "*(A passage that answers exercise ex09.bn_back is left out of the student copy.)*\n"
      "After it.\n";
  CHECK(holes::hide_answers(readme, "R.md") == want);
  // A copy with other holes keeps the passage, without its markers.
  CHECK(holes::hide_answers(readme, "R.md", {"ex01.other"}) ==
        "# Title\nThe backward pass:\ndz = formula\nmore of it\nAfter it.\n");
  // Text without markers (indented examples included) comes through byte for byte.
  for (const std::string text : {"", "a\n", "a\nb", "    <!-- BEGIN ANSWER ex01.x -->\n"})
    CHECK(holes::hide_answers(text, "R.md") == text);
}

TEST_CASE("malformed answer markers are refused, naming the file and the line") {
  CHECK_THROWS_WITH_AS(holes::hide_answers("<!-- BEGIN ANSWER ex01.a -->\ntext\n", "R.md"),
                       "R.md:1: the answer passage of ex01.a is never closed (no END ANSWER)", holes::MarkerError);
  CHECK_THROWS_WITH_AS(holes::hide_answers("x\n<!-- END ANSWER ex01.a -->\n", "R.md"),
                       "R.md:2: END ANSWER ex01.a does not close an open passage of it", holes::MarkerError);
  CHECK_THROWS_WITH_AS(holes::hide_answers("<!-- BEGIN ANSWER the formula -->\n", "R.md"),
                       doctest::Contains("R.md:1: an answer marker is"), holes::MarkerError);
  CHECK_THROWS_WITH_AS(
      holes::hide_answers("<!-- BEGIN ANSWER ex01.a -->\n<!-- BEGIN ANSWER ex01.b -->\n", "R.md"),
      "R.md:2: BEGIN ANSWER ex01.b inside the passage of ex01.a (opened on line 1)", holes::MarkerError);
}

TEST_CASE("malformed markers are refused, naming the file, the line and the fault") {
  struct Case {
    const char* text;
    const char* message;
  };
  const Case cases[] = {
      {"  x;\n  // END EXERCISE ex01.a\n", "f.cpp:2: END EXERCISE ex01.a without its BEGIN"},
      {"  // BEGIN EXERCISE ex01.a\n  // BEGIN EXERCISE ex01.b\n", "f.cpp:2: BEGIN EXERCISE ex01.b inside the region of ex01.a"},
      {"  // BEGIN EXERCISE ex01.a\n  // END EXERCISE ex01.b\n", "f.cpp:2: END EXERCISE ex01.b closes the region of ex01.a"},
      {"\n  // BEGIN EXERCISE ex01.a\n  x;\n", "f.cpp:2: the region of ex01.a is never closed"},
      {"// BEGIN EXERCISE ex01.a\n// END EXERCISE ex01.a\n", "f.cpp:1: the marker of ex01.a starts its line"},
      {"  // BEGIN EXERCISE allreduce\n", "f.cpp:1: a marker is '// BEGIN EXERCISE exNN.name' alone on its line"},
      {"  // BEGIN EXERCISE ex1.a\n", "f.cpp:1: a marker is"},
      {"  // BEGIN EXERCISE ex01.Upper\n", "f.cpp:1: a marker is"},
      {"  // BEGIN EXERCISE ex01.a and more\n", "f.cpp:1: a marker is"},
      {"  // END EXERCISE\n", "f.cpp:1: a marker is '// END EXERCISE exNN.name'"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.text);
    CHECK_THROWS_WITH_AS(holes::find_regions(c.text, "f.cpp"), doctest::Contains(c.message), holes::MarkerError);
    CHECK_THROWS_AS(holes::punch_holes(c.text, "f.cpp", "R.md"), holes::MarkerError);
  }
}

// The graded exercises: the ctest cases tests/CMakeLists.txt and tests/chapter*.cmake register
// for them (mgpu_exercise(<name> ...), or add_test(NAME <name> ...) where one needs more), read
// from those files here. An exercise marked in the code but not graded (or the reverse) fails
// this test. In a student copy the regions are holes: there the stubs' calls are counted with
// the markers that are left.
TEST_CASE("the repository's markers are all well-formed, and mark exactly the graded exercises") {
  namespace fs = std::filesystem;
  const fs::path root = MGPU_SOURCE_DIR;
  std::set<std::string> graded;
  const std::regex registration(R"((?:mgpu_exercise\(|add_test\(NAME )(ex[0-9]{2}\.[a-z0-9_]+))");
  for (const fs::directory_entry& e : fs::directory_iterator(root / "tests")) {
    const std::string name = e.path().filename().string();
    if (name != "CMakeLists.txt" && !(name.rfind("chapter", 0) == 0 && e.path().extension() == ".cmake")) continue;
    const std::string text = read_text(e.path());
    for (std::sregex_iterator m(text.begin(), text.end(), registration), end; m != end; ++m) graded.insert((*m)[1]);
  }
  CHECK(graded.size() == 31);  // the exercises of chapters 01-10, as the READMEs' tables list them
  std::set<std::string> marked;
  const std::string stub = "mgpu::exercise_not_done(\"";
  for (const char* folder : {"chapters", "common", "tests", "tools"})
    for (const fs::directory_entry& e : fs::recursive_directory_iterator(root / folder)) {
      const std::string ext = e.path().extension().string();
      if (!e.is_regular_file() || (ext != ".cu" && ext != ".cpp" && ext != ".h")) continue;
      if (e.path().filename() == "test_holes.cpp") continue;  // this file's examples
      const std::string text = read_text(e.path());
      for (const holes::Region& r : holes::find_regions(text, fs::relative(e.path(), root).string()))
        marked.insert(r.exercise);
      for (std::size_t at = text.find(stub); at != std::string::npos; at = text.find(stub, at + 1)) {
        const std::size_t begin = at + stub.size();
        marked.insert(text.substr(begin, text.find('"', begin) - begin));
      }
    }
  CHECK(marked == graded);
}

// --- The rubrics and handouts (handouts.h).
#include "handouts.h"

TEST_CASE("a rubric: exercises with their minutes, visible and hidden cases with their points") {
  const handouts::Rubric r = handouts::parse_rubric(
      "# a comment\nassignment Small things\ngiven the rest\nexercise ex01.a 10\n  case ex01.a 3 it works\n"
      "  hidden ex01.a:hidden_more 2 more of it\nexercise ex01.b 5\n  case ex01.b:half 1 half of it\n",
      "rubrics/01_small.rubric");
  CHECK(r.assignment == "01_small");
  CHECK(r.title == "Small things");
  CHECK(r.given == std::vector<std::string>{"the rest"});
  REQUIRE(r.exercises.size() == 2);
  CHECK(r.exercises[0].minutes == 10);
  REQUIRE(r.exercises[0].cases.size() == 2);
  CHECK(r.exercises[0].cases[1].test == "ex01.a:hidden_more");
  CHECK(r.exercises[0].cases[1].hidden);
  CHECK(r.exercises[0].cases[1].points == 2);
  CHECK(r.exercises[1].cases[0].what == "half of it");
}

TEST_CASE("a rubric with a mistake is refused, with its file and line") {
  CHECK_THROWS_WITH_AS(handouts::parse_rubric("case ex01.a 3 x\n", "r.rubric"),
                       doctest::Contains("r.rubric:1: a case before any 'exercise' line"), handouts::RubricError);
  CHECK_THROWS_WITH_AS(handouts::parse_rubric("exercise ex01.a ten\n", "r.rubric"),
                       doctest::Contains("r.rubric:1: an exercise line is 'exercise NAME MINUTES'"),
                       handouts::RubricError);
  CHECK_THROWS_WITH_AS(handouts::parse_rubric("exercise ex01.a 1\ncase ex01.b 1 x\n", "r.rubric"),
                       doctest::Contains("r.rubric:2: the case 'ex01.b' is not named after its exercise"),
                       handouts::RubricError);
  CHECK_THROWS_WITH_AS(handouts::parse_rubric("exercise ex01.a 1\ncase ex01.a many x\n", "r.rubric"),
                       doctest::Contains("'many' is not a whole number of points"), handouts::RubricError);
  CHECK_THROWS_WITH_AS(handouts::parse_rubric("points 3\n", "r.rubric"),
                       doctest::Contains("unknown statement 'points'"), handouts::RubricError);
}

TEST_CASE("the student copy's rubric has no hidden line; the handout counts the hidden points, names no hidden case") {
  const std::string text = "exercise ex01.a 10\n  case ex01.a 3 it works\n  hidden ex01.a:hidden_more 2 more\n";
  CHECK(handouts::without_hidden(text) == "exercise ex01.a 10\n  case ex01.a 3 it works\n");
  const handouts::Rubric r = handouts::parse_rubric("assignment Small\n" + text, "01_small.rubric");
  const auto rows = handouts::fill_the_holes_rows(
      "| exercise | where | what to write | checked by |\n|---|---|---|---|\n| `ex01.a` | `f` | the answer | a test |\n");
  REQUIRE(rows.count("ex01.a"));
  CHECK(rows.at("ex01.a").where == "`f`");
  const std::string page = handouts::handout(r, {{"ex01.a", {"chapters/01_small/code.cpp:12"}}}, rows,
                                             "chapters/01_small/README.md");
  CHECK(page.find("# Assignment 01: Small") == 0);
  CHECK(page.find("Expected time: about 10 minutes.") != std::string::npos);
  CHECK(page.find("Points: 5, of which 3 come from the tests in this copy and 2 from hidden cases") != std::string::npos);
  CHECK(page.find("`chapters/01_small/code.cpp:12`, in `f`") != std::string::npos);
  CHECK(page.find("ctest --test-dir build -R '^ex01\\.a$'") != std::string::npos);
  CHECK(page.find("hidden_more") == std::string::npos);
  CHECK(page.find("tools/classroom/submit.sh --student YOUR_ID") != std::string::npos);
  CHECK(handouts::handout(r, {}, rows, "README.md").empty());  // no hole of it: no handout
}

TEST_CASE("the repository's rubrics parse, and every one of their exercises is marked in the code") {
  namespace fs = std::filesystem;
  const fs::path root = MGPU_SOURCE_DIR;
  int rubrics = 0;
  for (const fs::directory_entry& e : fs::directory_iterator(root / "tools/classroom/rubrics")) {
    if (e.path().extension() != ".rubric") continue;
    ++rubrics;
    const handouts::Rubric r = handouts::parse_rubric(read_text(e.path()), e.path().string());
    CAPTURE(r.assignment);
    CHECK(fs::exists(root / "chapters" / r.assignment / "README.md"));
    CHECK(!r.exercises.empty());
    for (const handouts::Exercise& x : r.exercises) {
      CAPTURE(x.name);
      CHECK(x.minutes > 0);
      CHECK(!x.cases.empty());
    }
  }
  CHECK(rubrics == 10);
}

TEST_CASE("near copies: tokens without comments or white space, shingles, and the share one text holds of another") {
  using near_copies::tokens;
  CHECK(tokens("x[i] += 1.5e-3f * y;  // a comment\n/* another\n one */ return;") ==
        std::vector<std::string>{"x", "[", "i", "]", "+", "=", "1.5e-3f", "*", "y", ";", "return", ";"});
  CHECK(tokens("  // only a comment\n").empty());
  // Re-indented, re-commented, on other lines: the same tokens.
  const std::string answer = "for (int i = 0; i < n; ++i) {  // each element\n  y[i] = a * x[i] + y[i];\n}\n";
  const std::string pasted = "/* mine */ for (int i = 0;\n i < n;\n ++i) { y[i] = a * x[i] + y[i]; }";
  CHECK(tokens(answer) == tokens(pasted));

  const auto a = near_copies::shingles(tokens(answer), 8);
  CHECK(a.size() == tokens(answer).size() - 8 + 1);  // every run of 8 differs here
  CHECK(near_copies::shingles(tokens("a b c"), 8).empty());  // fewer tokens than a shingle
  CHECK(near_copies::containment(a, near_copies::shingles(tokens(pasted), 8)) == doctest::Approx(1.0));
  CHECK(near_copies::containment(a, near_copies::shingles(tokens("int main() { return 0; }"), 8)) == 0.0);
  CHECK(near_copies::containment({}, a) == 0.0);  // nothing to look for
  // Half of the answer (its loop header) elsewhere: about a share of what is shared, not all or nothing.
  const double half = near_copies::containment(a, near_copies::shingles(tokens("for (int i = 0; i < n; ++i) { z[i] = 0; }"), 8));
  CHECK(half > 0.2);
  CHECK(half < 0.8);
}
