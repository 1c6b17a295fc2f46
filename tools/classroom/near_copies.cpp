#include "near_copies.h"

#include <cctype>
#include <functional>

namespace near_copies {

namespace {

bool starts_word(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// A number goes on through its dots, exponent and suffix (1.0e-5f); a name through letters,
// digits and underscores.
bool continues_word(const std::string& word, char c) {
  if (starts_word(c)) return true;
  const bool number = std::isdigit(static_cast<unsigned char>(word[0]));
  return number && (c == '.' || ((c == '-' || c == '+') && (word.back() == 'e' || word.back() == 'E')));
}

}  // namespace

std::vector<std::string> tokens(const std::string& text) {
  std::vector<std::string> out;
  std::size_t i = 0;
  const std::size_t n = text.size();
  while (i < n) {
    const char c = text[i];
    if (c == '/' && i + 1 < n && text[i + 1] == '/') {  // a line comment
      while (i < n && text[i] != '\n') ++i;
    } else if (c == '/' && i + 1 < n && text[i + 1] == '*') {  // a block comment
      const std::size_t end = text.find("*/", i + 2);
      i = end == std::string::npos ? n : end + 2;
    } else if (std::isspace(static_cast<unsigned char>(c))) {
      ++i;
    } else if (starts_word(c)) {
      std::string word(1, c);
      for (++i; i < n && continues_word(word, text[i]); ++i) word += text[i];
      out.push_back(word);
    } else {
      out.emplace_back(1, c);
      ++i;
    }
  }
  return out;
}

Shingles shingles(const std::vector<std::string>& tokens, int k) {
  Shingles out;
  if (k <= 0 || tokens.size() < static_cast<std::size_t>(k)) return out;
  const std::hash<std::string> hash;
  for (std::size_t start = 0; start + k <= tokens.size(); ++start) {
    std::uint64_t h = 1469598103934665603ull;  // combine the k tokens' hashes, order kept
    for (int j = 0; j < k; ++j) h = (h ^ hash(tokens[start + j])) * 1099511628211ull;
    out.insert(h);
  }
  return out;
}

double containment(const Shingles& answer, const Shingles& text) {
  if (answer.empty()) return 0.0;
  std::size_t shared = 0;
  for (std::uint64_t s : answer) shared += text.count(s);
  return static_cast<double>(shared) / static_cast<double>(answer.size());
}

}  // namespace near_copies
