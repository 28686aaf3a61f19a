#pragma once

// A bound on how deeply the JSON files relay reads may nest. nlohmann::json
// parses without recursion, but copies, compares and dumps recursively, so a
// tokenizer.json or safetensors header of 100,000 nested brackets would
// overflow the stack in a copy or in the dump() of an error message. Real
// files (tokenizer.json, config.json, safetensors headers) nest fewer than 10
// levels; 128 leaves room for a 32-deep pre-tokenizer Sequence to be refused
// by name (bpe_tokenizer.cc) rather than as a nesting error.

#include <cstddef>
#include <string>
#include <string_view>

#include "relay/common/status.h"

namespace relay::model {

inline constexpr int kMaxJsonNesting = 128;

// The byte offset of the first '[' or '{' outside a string that opens level
// max_depth + 1, or std::string_view::npos when there is none. Does not
// validate: malformed JSON is left for the parser to report.
size_t find_json_nesting_over(std::string_view text, int max_depth = kMaxJsonNesting);

// InvalidArgument "<source>: JSON nests deeper than 128 levels (at byte N)"
// when find_json_nesting_over() finds a place; OK otherwise.
Status check_json_nesting(std::string_view text, const std::string& source);

}  // namespace relay::model
