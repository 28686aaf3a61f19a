#pragma once

// Random mutations of seed inputs, without coverage feedback: the generic
// byte-level ones (bit flips, byte inserts and deletes, range copies,
// splices with another seed) and, by input kind, ones that aim at what
// parsers get wrong:
//   JSON         a number becomes a huge or negative one (2^30, 2^63, -1,
//                1e999); a value becomes one of another type; a value is
//                wrapped in deep array nesting, or an object in thousands of
//                {"type": "Sequence", ...} levels; a member or element is
//                deleted, duplicated or replaced by another from the seeds;
//   YAML         a scalar becomes an odd one (.nan, ~, 1e999, an alias);
//                lines are deleted, duplicated, re-indented; deep flow
//                nesting; anchors and aliases;
//   safetensors  the header (JSON mutations, its length fixed up or not), the
//                length field, a truncated or extended data section.
// Deterministic for a given seed and corpus.

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "fuzz/fuzz_targets.h"

namespace relay::fuzz {

// Mutated inputs stay below this size (the deep-nesting mutations grow fast).
inline constexpr size_t kMaxInputBytes = 4 << 20;

class Mutator {
 public:
  // `corpus` must not be empty.
  Mutator(InputKind kind, std::vector<std::string> corpus, uint64_t seed);

  // A seed with one to five mutations stacked on it.
  std::string next();

 private:
  void mutate(std::string* s);
  void mutate_bytes(std::string* s);
  void mutate_json(std::string* s);
  void mutate_yaml(std::string* s);
  void mutate_safetensors(std::string* s);

  size_t below(size_t n);  // uniform in [0, n); 0 when n == 0
  bool chance(double p);
  template <typename T>
  const T& pick(const std::vector<T>& items) {
    return items[below(items.size())];
  }

  InputKind kind_;
  std::vector<std::string> corpus_;
  std::mt19937_64 rng_;
};

}  // namespace relay::fuzz
