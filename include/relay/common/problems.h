#pragma once

// What a component's options get wrong, all of it at once.
//
// Each component states its option rules once, in a check function over its
// own options struct, and reports every broken rule here with the field's
// path relative to that struct ("ppo.clip_low"). The caller decides where
// the struct sits: the config binding checks the trainer's options under
// "trainer", so the user reads the YAML path
//   trainer.ppo.clip_low: must be in [0, 1), got 2
// and a component that validates its own options (Trainer::create) gets the
// same text.

#include <memory>
#include <string>
#include <vector>

#include "relay/common/status.h"

namespace relay {

struct Problem {
  std::string path;  // full dotted path, "trainer.ppo.clip_low"
  std::string what;  // "must be in [0, 1), got 2"
};

class Problems {
 public:
  // `prefix`: the path of the options struct being checked ("" = top level).
  explicit Problems(std::string prefix = "");

  // A view that reports into the same list, one level down: at("ppo").
  Problems at(const std::string& key) const;
  // The full path of `key` at this level, for rules that name another field
  // ("must be < trainer.clip_cov.ub (5)").
  std::string path(const std::string& key) const;

  void add(const std::string& key, const std::string& what);  // verbatim
  void add(const std::string& key, const std::string& rule, double got);
  void add(const std::string& key, const std::string& rule, int64_t got);
  void add(const std::string& key, const std::string& rule, int got) {
    add(key, rule, static_cast<int64_t>(got));
  }
  void add(const std::string& key, const std::string& rule, const std::string& got);

  // The common rules; `what` in each message is the rule itself.
  void at_least(const std::string& key, int64_t value, int64_t min);
  void positive(const std::string& key, double value);      // > 0 (NaN fails)
  void non_negative(const std::string& key, double value);  // >= 0 (NaN fails)
  void finite(const std::string& key, double value);
  // In [lo, hi], or [lo, hi) with `open_hi`.
  void in_range(const std::string& key, double value, double lo, double hi, bool open_hi = false);
  // 0 (off) or > min; `min_text` says what min is ("1", "1 + ppo.clip_high (1.2)").
  void zero_or_above(const std::string& key, double value, double min, const std::string& min_text);
  void non_empty(const std::string& key, const std::string& value);

  bool empty() const { return list_->empty(); }
  const std::vector<Problem>& list() const { return *list_; }
  // OK, or InvalidArgument with one "path: what" line per problem.
  Status status() const;

 private:
  Problems(std::shared_ptr<std::vector<Problem>> list, std::string prefix);

  std::shared_ptr<std::vector<Problem>> list_;
  std::string prefix_;
};

// Runs a component's `check(options, problems)` (found by argument-dependent
// lookup) under `prefix` and returns the problems as one status.
template <class Options>
Status check_options(const Options& options, const std::string& prefix) {
  Problems problems(prefix);
  check(options, problems);
  return problems.status();
}

// Shortest text that reads back as exactly `x` ("1e-06", "0.95", "10000").
std::string format_double(double x);
// A user-supplied string for a one-line message: quoted, escaped, shortened.
std::string quote(const std::string& s);

}  // namespace relay
