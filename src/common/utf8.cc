#include "relay/common/utf8.h"

#include <nlohmann/json.hpp>

namespace relay {

std::string replace_invalid_utf8(std::string_view text) {
  // Writing the string as JSON with `replace` and reading it back is the
  // replacement a JSON client sees, by construction.
  const nlohmann::json j = std::string(text);
  return nlohmann::json::parse(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace))
      .get<std::string>();
}

}  // namespace relay
