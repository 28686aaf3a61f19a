#pragma once

// The header of one safetensors file, parsed and checked against the data
// section it describes. Private to src/model: SafetensorsReader::open maps the
// file and hands the header text here, so the parsing can be read (and kept
// short) apart from the mapping.

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "relay/common/status.h"
#include "relay/model/safetensors.h"

namespace relay::model::internal {

struct SafetensorsHeader {
  // In data order: ascending (begin, end), empty tensors at one offset by name.
  std::vector<TensorEntry> entries;
  std::map<std::string, std::string> metadata;  // "__metadata__"
};

// `text`: the header JSON; `data_size`: the bytes of the data section after it.
// DataLoss for anything inconsistent (each message starts with `path` and names
// the tensor), Unimplemented for a dtype safetensors defines but relay does
// not read.
StatusOr<SafetensorsHeader> parse_safetensors_header(std::string_view text, uint64_t data_size,
                                                     const std::string& path);

}  // namespace relay::model::internal
