#include "relay/common/problems.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace relay {

Problems::Problems(std::string prefix)
    : list_(std::make_shared<std::vector<Problem>>()), prefix_(std::move(prefix)) {}

Problems::Problems(std::shared_ptr<std::vector<Problem>> list, std::string prefix)
    : list_(std::move(list)), prefix_(std::move(prefix)) {}

Problems Problems::at(const std::string& key) const { return Problems(list_, path(key)); }

std::string Problems::path(const std::string& key) const {
  return prefix_.empty() ? key : absl::StrCat(prefix_, ".", key);
}

void Problems::add(const std::string& key, const std::string& what) {
  list_->push_back({path(key), what});
}
void Problems::add(const std::string& key, const std::string& rule, double got) {
  add(key, absl::StrCat(rule, ", got ", format_double(got)));
}
void Problems::add(const std::string& key, const std::string& rule, int64_t got) {
  add(key, absl::StrCat(rule, ", got ", got));
}
void Problems::add(const std::string& key, const std::string& rule, const std::string& got) {
  add(key, absl::StrCat(rule, ", got ", quote(got)));
}

void Problems::at_least(const std::string& key, int64_t value, int64_t min) {
  if (value < min) add(key, absl::StrCat("must be >= ", min), value);
}
void Problems::positive(const std::string& key, double value) {
  if (!(value > 0)) add(key, "must be > 0", value);
}
void Problems::non_negative(const std::string& key, double value) {
  if (!(value >= 0)) add(key, "must be >= 0", value);
}
void Problems::finite(const std::string& key, double value) {
  if (!std::isfinite(value)) add(key, "must be finite", value);
}
void Problems::in_range(const std::string& key, double value, double lo, double hi, bool open_hi) {
  const bool ok = value >= lo && (open_hi ? value < hi : value <= hi);
  if (!ok) {
    add(key,
        absl::StrCat("must be in [", format_double(lo), ", ", format_double(hi),
                     open_hi ? ")" : "]"),
        value);
  }
}
void Problems::zero_or_above(const std::string& key, double value, double min,
                             const std::string& min_text) {
  if (!(value == 0 || value > min)) {
    add(key, absl::StrCat("must be 0 (off) or > ", min_text), value);
  }
}
void Problems::non_empty(const std::string& key, const std::string& value) {
  if (value.empty()) add(key, "must be non-empty", value);
}

Status Problems::status() const {
  if (list_->empty()) return OkStatus();
  std::vector<std::string> lines;
  lines.reserve(list_->size());
  for (const Problem& p : *list_) lines.push_back(absl::StrCat(p.path, ": ", p.what));
  return InvalidArgumentError(absl::StrJoin(lines, "\n"));
}

std::string format_double(double x) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), x);
  if (ec != std::errc()) return "?";
  return std::string(buf, end);
}

std::string quote(const std::string& s) {
  constexpr size_t kMaxShown = 60;
  std::string shown = absl::CHexEscape(s.substr(0, kMaxShown));
  return absl::StrCat("'", shown, s.size() > kMaxShown ? "...'" : "'");
}

}  // namespace relay
