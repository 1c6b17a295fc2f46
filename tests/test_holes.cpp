// The classroom kit's hole puncher (tools/classroom/holes.h): regions found and cut out
// exactly, every malformed marker refused with its file and line, and the repository's own
// markers all well-formed, one region set per graded exercise.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "holes.h"

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
  CHECK(graded.size() == 25);  // the exercises of chapters 01-09, as the READMEs' tables list them
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
