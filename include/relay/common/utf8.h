#pragma once

// Text that must be valid UTF-8 on its way out (a proto3 string field, a
// JSON string) when what the model wrote may not be: a turn cut inside a
// character, a random model's bytes.

#include <string>
#include <string_view>

namespace relay {

// `text` with each invalid UTF-8 sequence replaced by U+FFFD, exactly as
// nlohmann::json writes it with error_handler_t::replace (what a JSON client
// of relay's endpoint reads), so the two always agree.
std::string replace_invalid_utf8(std::string_view text);

}  // namespace relay
