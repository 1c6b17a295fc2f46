// Near copies of an answer: how the classroom kit proves that no other file of a student copy
// holds a hole's answer, without a list of the places that once did.
//
// The idea is the one plagiarism detectors use (shingling, as in MOSS): cut a text into tokens,
// take every run of k consecutive tokens (a "shingle"), and ask what share of the answer's
// shingles another file also holds. Comments and white space are dropped first, so re-indenting
// or re-commenting an answer does not hide it. As MOSS ignores the code every student was given,
// the caller leaves out of the answer's shingles those of the code around the hole and those
// common to many files (`for (std::size_t i = 0; i < v.size(); ++i)`): what is left is what only
// the answer says.
#pragma once
#include <cstdint>
#include <string>
#include <unordered_set>
#include <vector>

namespace near_copies {

// The tokens of a text: words (identifiers, keywords, numbers with their dots and suffixes)
// and single punctuation marks. `//` to the end of a line and `/* ... */` are comments and
// are dropped, as is white space.
std::vector<std::string> tokens(const std::string& text);

// The distinct runs of `k` consecutive tokens, each as a 64-bit hash (a text of fewer than
// `k` tokens has none).
using Shingles = std::unordered_set<std::uint64_t>;
Shingles shingles(const std::vector<std::string>& tokens, int k);

// The share of `answer`'s shingles that `text` also holds, from 0 to 1 (0 when `answer` has none).
double containment(const Shingles& answer, const Shingles& text);

}  // namespace near_copies
