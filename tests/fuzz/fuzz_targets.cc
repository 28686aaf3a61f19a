#include "fuzz/fuzz_targets.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>

#include "relay/config/config.h"
#include "relay/model/bpe_tokenizer.h"
#include "relay/model/hf_config.h"
#include "relay/model/safetensors.h"
#include "relay/model/tokenizer.h"
#include "testing/byte_tokenizer_json.h"

namespace relay::fuzz {
namespace {

// A plain write: the parsers under test read the file straight back, and
// write_file_atomic's fsync would cost more than most parses.
Status write_input(const std::string& path, std::string_view input) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(input.data(), static_cast<std::streamsize>(input.size()));
  out.close();
  if (!out) return InternalError("fuzz: cannot write " + path);
  return OkStatus();
}

// An invariant a parser that accepted its input must keep. A broken one is a
// bug, reported like a crash (abort, SIGABRT).
void expect(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz: invariant broken: %s\n", what);
    std::abort();
  }
}

// What `relay tokenize` and the rollout workers do with a loaded tokenizer:
// encode text (some of it the input's own bytes), decode ids in and out of
// range, look up the special tokens.
void exercise(const model::Tokenizer& t, std::string_view input) {
  const std::string texts[] = {
      "Hello world, it's 12345 <|endoftext|> caf\xc3\xa9 \xe4\xbd\xa0\xe5\xa5\xbd \xc2\x85 !!", "",
      "  \n\n\t x", std::string(input.substr(0, 256))};
  for (const std::string& text : texts) {
    StatusOr<std::vector<int64_t>> ids = t.encode(text);
    if (!ids.ok()) continue;
    for (int64_t id : *ids) expect(id >= 0 && id < t.vocab_size(), "encode: id in the vocabulary");
    (void)t.decode(*ids);
  }
  const int64_t v = t.vocab_size();
  (void)t.decode({0, 1, v - 1});
  (void)t.decode({v});
  (void)t.decode({-1, int64_t{1} << 40});
  for (int64_t id : {t.eos_id(), t.bos_id(), t.pad_id()}) {
    expect(id >= -1 && id < v, "special ids are -1 or in the vocabulary");
  }
  (void)t.token_id("<|endoftext|>");
  (void)t.token_id("");
}

Status run_tokenizer(std::string_view input, const std::string& scratch) {
  const std::string path = scratch + "/tokenizer.json";
  RELAY_RETURN_IF_ERROR(write_input(path, input));
  // The loader `relay tokenize --tokenizer FILE` uses.
  RELAY_ASSIGN_OR_RETURN(std::unique_ptr<model::Tokenizer> t, model::load_tokenizer_file(path));
  exercise(*t, input);
  return OkStatus();
}

// tokenizer_config.json beside a fixed, valid tokenizer.json, loaded as a
// model directory.
Status run_tokenizer_config(std::string_view input, const std::string& scratch) {
  const std::string dir = scratch + "/tokenizer_config_dir";
  static const bool written = [&] {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) return false;
    const std::string tokenizer =
        testing::byte_tokenizer_json({"<|endoftext|>", "<|im_start|>", "<|im_end|>", "<pad>"})
            .dump();
    return write_input(dir + "/" + model::kHfTokenizerFile, tokenizer).ok();
  }();
  if (!written) return InternalError("fuzz: cannot write " + dir);
  RELAY_RETURN_IF_ERROR(write_input(dir + "/" + model::kHfTokenizerConfigFile, input));
  RELAY_ASSIGN_OR_RETURN(std::unique_ptr<model::Tokenizer> t, model::load_tokenizer(dir));
  exercise(*t, input);
  return OkStatus();
}

Status run_safetensors(std::string_view input, const std::string& scratch) {
  const std::string path = scratch + "/model.safetensors";
  RELAY_RETURN_IF_ERROR(write_input(path, input));
  RELAY_ASSIGN_OR_RETURN(std::unique_ptr<model::SafetensorsReader> reader,
                         model::SafetensorsReader::open(path));
  for (const model::TensorEntry& e : reader->entries()) {
    StatusOr<at::Tensor> t = reader->tensor(e.name);
    expect(t.ok(), "every listed tensor reads");
  }
  return OkStatus();
}

Status run_shard_index(std::string_view input, const std::string& scratch) {
  const std::string path = scratch + "/model.safetensors.index.json";
  RELAY_RETURN_IF_ERROR(write_input(path, input));
  return model::read_shard_index(path).status();
}

// The real config loader, then the same text with command-line overrides
// applied (set_path on the parsed tree).
Status run_config_yaml(std::string_view input, const std::string& scratch) {
  const std::string text(input);
  RELAY_ASSIGN_OR_RETURN(ExperimentConfig config, parse_config(text, "fuzz.yaml"));
  const std::string yaml = to_yaml(config);
  expect(parse_config(yaml, "to_yaml").ok(), "to_yaml output loads back");
  return parse_config(text, "fuzz.yaml", {"rollout.n=3", "model.init.layers=1"}).status();
}

// config.json (also read as generation_config.json): an accepted config
// must survive to_hf_config_json and back.
Status run_hf_config(std::string_view input, const std::string& scratch) {
  RELAY_RETURN_IF_ERROR(write_input(scratch + "/generation_config.json", input));
  Status generation = model::read_generation_eos_ids(scratch).status();
  RELAY_ASSIGN_OR_RETURN(model::PolicyConfig c,
                         model::parse_hf_config(std::string(input), "config.json"));
  expect(model::parse_hf_config(model::to_hf_config_json(c), "again").ok(),
         "to_hf_config_json output parses back");
  return generation;
}

}  // namespace

const std::vector<FuzzTarget>& fuzz_targets() {
  static const std::vector<FuzzTarget> targets = {
      {"tokenizer", InputKind::kJson, ".json", run_tokenizer},
      {"tokenizer_config", InputKind::kJson, ".json", run_tokenizer_config},
      {"safetensors", InputKind::kSafetensors, ".safetensors", run_safetensors},
      {"shard_index", InputKind::kJson, ".json", run_shard_index},
      {"config_yaml", InputKind::kYaml, ".yaml", run_config_yaml},
      {"hf_config", InputKind::kJson, ".json", run_hf_config},
  };
  return targets;
}

const FuzzTarget* find_fuzz_target(std::string_view name) {
  for (const FuzzTarget& t : fuzz_targets()) {
    if (name == t.name) return &t;
  }
  return nullptr;
}

}  // namespace relay::fuzz
