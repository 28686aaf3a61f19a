#pragma once

// The parsers relay runs on files it did not write, as fuzz targets: each
// takes one input (a file's bytes), feeds it to the parser the way relay's
// commands do, and exercises what the parser returned. A malformed input must
// come back as an error Status; anything else (a signal, an uncaught
// exception, an allocation past the memory limit, a hang) is a bug the
// fuzzer reports. Shared by the mutation loop (fuzz_inputs.cc) and the
// libFuzzer entry point (libfuzzer_entry.cc).

#include <string>
#include <string_view>
#include <vector>

#include "relay/common/status.h"

namespace relay::fuzz {

// What a target's inputs look like, which picks the structure-aware
// mutations (mutator.h).
enum class InputKind { kJson, kYaml, kSafetensors };

struct FuzzTarget {
  const char* name;  // --target; also the seed directory under the corpus
  InputKind kind;
  const char* extension;  // of saved crash inputs: ".json", ".yaml", ".safetensors"
  // Runs the parser on `input`. `scratch` is an empty-enough directory the
  // target may write files into (parsers that take a path read them back).
  // Returns the parser's own Status: OK or the error it reported.
  Status (*run)(std::string_view input, const std::string& scratch);
};

// tokenizer, tokenizer_config, safetensors, shard_index, config_yaml, hf_config.
const std::vector<FuzzTarget>& fuzz_targets();
// nullptr when there is no target `name`.
const FuzzTarget* find_fuzz_target(std::string_view name);

}  // namespace relay::fuzz
