// What the `relay` subcommands share: failing with one line, reading ids.

#include "bin/commands.h"

#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"

namespace relay::cli {

int fail(const std::string& command, const Status& status) {
  std::fprintf(stderr, "relay %s: %s\n", command.c_str(), std::string(status.message()).c_str());
  return 1;
}

bool parse_ids(const std::string& text, std::vector<int64_t>* ids, std::string* error) {
  ids->clear();
  size_t start = 0;
  int index = 0;
  while (start <= text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    std::string item = text.substr(start, end - start);
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    size_t used = 0;
    long long value = 0;
    bool ok = !item.empty();
    if (ok) {
      try {
        value = std::stoll(item, &used);
      } catch (...) {
        ok = false;
      }
    }
    if (!ok || used != item.size()) {
      *error = absl::StrCat("ids[", index, "]: expected an integer, got '", item, "'");
      return false;
    }
    ids->push_back(value);
    ++index;
    start = end + 1;
  }
  return true;
}

}  // namespace relay::cli
