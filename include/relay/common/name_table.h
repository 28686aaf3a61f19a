#pragma once

// The names of an enum's values, kept beside the enum: one table gives both
// directions (config text -> value, value -> text for YAML, metrics and
// messages), so a value added to the enum is named in exactly one place.
//
//   enum class Color { kRed, kGreen };
//   inline const NameTable<Color> kColorNames{"color", {{"red", Color::kRed},
//                                                       {"green", Color::kGreen}}};
//   kColorNames.parse("green")  -> Color::kGreen
//   kColorNames.parse("blue")   -> InvalidArgument "unknown color 'blue'; known: red, green"
//   kColorNames.name(Color::kRed) -> "red"
//
// A value may have several names (another system's spelling, e.g. verl's
// "low_var_kl" for k3); the first one listed is its canonical name.

#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "relay/common/status.h"

namespace relay {

template <class E>
class NameTable {
 public:
  struct Entry {
    const char* name;
    E value;
  };

  // `what` names the kind of value in errors ("policy loss", "KL estimator").
  NameTable(const char* what, std::initializer_list<Entry> entries)
      : what_(what), entries_(entries) {}

  StatusOr<E> parse(std::string_view name) const {
    for (const Entry& e : entries_) {
      if (name == e.name) return e.value;
    }
    std::string message = "unknown ";
    message.append(what_).append(" '").append(name).append("'; known: ").append(known());
    return InvalidArgumentError(message);
  }

  // The canonical name of `value`; "?" for a value the table lacks (a
  // programming error the tests catch, not an input error).
  const char* name(E value) const {
    for (const Entry& e : entries_) {
      if (e.value == value) return e.name;
    }
    return "?";
  }

  // Every accepted name, comma-separated, in table order.
  std::string known() const {
    std::string out;
    for (const Entry& e : entries_) {
      if (!out.empty()) out += ", ";
      out += e.name;
    }
    return out;
  }

  const std::vector<Entry>& entries() const { return entries_; }
  const char* what() const { return what_; }

 private:
  const char* what_;
  std::vector<Entry> entries_;
};

}  // namespace relay
