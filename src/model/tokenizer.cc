#include "relay/model/tokenizer.h"

#include <filesystem>

#include <nlohmann/json.hpp>

#include "model/json_nesting.h"
#include "relay/common/file_io.h"
#include "relay/model/bpe_tokenizer.h"
#include "relay/model/lora.h"

namespace relay::model {
namespace {
constexpr const char* kSpecialNames[] = {"<pad>", "<bos>", "<eos>"};
}  // namespace

CharTokenizer::CharTokenizer(std::string alphabet) : alphabet_(std::move(alphabet)) {
  for (int64_t& i : index_) i = -1;
  for (size_t i = 0; i < alphabet_.size(); ++i) {
    index_[static_cast<unsigned char>(alphabet_[i])] = kNumSpecials + static_cast<int64_t>(i);
  }
}

StatusOr<CharTokenizer> CharTokenizer::create(std::string_view alphabet) {
  if (alphabet.empty()) return InvalidArgumentError("char tokenizer: alphabet is empty");
  bool seen[256] = {};
  for (size_t i = 0; i < alphabet.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(alphabet[i]);
    if (c >= 128) {
      return InvalidArgumentError(
          absl::StrCat("char tokenizer: alphabet[", i, "] is not ASCII (byte ", int(c), ")"));
    }
    if (seen[c]) {
      return InvalidArgumentError(
          absl::StrCat("char tokenizer: alphabet repeats '", std::string(1, alphabet[i]), "'"));
    }
    seen[c] = true;
  }
  return CharTokenizer(std::string(alphabet));
}

StatusOr<CharTokenizer> CharTokenizer::from_json(const std::string& json_text,
                                                 const std::string& source) {
  RELAY_RETURN_IF_ERROR(check_json_nesting(json_text, source));
  nlohmann::json j = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return InvalidArgumentError(absl::StrCat(source, ": not valid JSON (truncated or corrupt)"));
  }
  if (!j.is_object()) return InvalidArgumentError(absl::StrCat(source, ": not a JSON object"));
  if (!j.contains("type") || j["type"] != "char") {
    return InvalidArgumentError(absl::StrCat(source, ": type: expected \"char\""));
  }
  if (!j.contains("alphabet") || !j["alphabet"].is_string()) {
    return InvalidArgumentError(absl::StrCat(source, ": alphabet: expected a string"));
  }
  StatusOr<CharTokenizer> t = create(j["alphabet"].get<std::string>());
  if (!t.ok()) return InvalidArgumentError(absl::StrCat(source, ": ", t.status().message()));
  return t;
}

std::string CharTokenizer::to_json() const {
  nlohmann::json j = {{"type", "char"},
                      {"alphabet", alphabet_},
                      {"specials", {kSpecialNames[0], kSpecialNames[1], kSpecialNames[2]}}};
  return j.dump(2) + "\n";
}

StatusOr<std::vector<int64_t>> CharTokenizer::encode(std::string_view text) const {
  std::vector<int64_t> ids;
  ids.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const int64_t id = index_[static_cast<unsigned char>(text[i])];
    if (id < 0) {
      return InvalidArgumentError(absl::StrCat("char tokenizer: character '",
                                               std::string(1, text[i]), "' at offset ", i,
                                               " is not in the alphabet \"", alphabet_, "\""));
    }
    ids.push_back(id);
  }
  return ids;
}

StatusOr<std::string> CharTokenizer::decode(const std::vector<int64_t>& ids) const {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int64_t id = ids[i];
    if (id < 0 || id >= vocab_size()) {
      return InvalidArgumentError(absl::StrCat("char tokenizer: ids[", i, "] = ", id,
                                               " is outside the vocabulary [0, ", vocab_size(),
                                               ")"));
    }
    if (id < kNumSpecials) {
      out += kSpecialNames[id];
    } else {
      out += alphabet_[id - kNumSpecials];
    }
  }
  return out;
}

std::optional<int64_t> CharTokenizer::token_id(std::string_view token) const {
  for (int64_t i = 0; i < kNumSpecials; ++i) {
    if (token == kSpecialNames[i]) return i;
  }
  if (token.size() == 1 && index_[static_cast<unsigned char>(token[0])] >= 0) {
    return index_[static_cast<unsigned char>(token[0])];
  }
  return std::nullopt;
}

StatusOr<std::unique_ptr<Tokenizer>> load_tokenizer_file(const std::string& path) {
  RELAY_ASSIGN_OR_RETURN(std::string text, read_file(path));
  // A Hugging Face tokenizer.json has a "model" object; relay's own file has
  // "type": "char".
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_object() && j.contains("model")) {
    RELAY_ASSIGN_OR_RETURN(BpeTokenizer t, BpeTokenizer::from_json(text, path));
    return std::unique_ptr<Tokenizer>(new BpeTokenizer(std::move(t)));
  }
  RELAY_ASSIGN_OR_RETURN(CharTokenizer t, CharTokenizer::from_json(text, path));
  return std::unique_ptr<Tokenizer>(new CharTokenizer(std::move(t)));
}

namespace {

// tokenizer_config.json's special token names: a string, or an object with
// "content" (an AddedToken), or null.
StatusOr<BpeTokenizer::SpecialTokens> read_special_tokens(const std::string& path) {
  RELAY_ASSIGN_OR_RETURN(std::string text, read_file(path));
  RELAY_RETURN_IF_ERROR(check_json_nesting(text, path));
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return InvalidArgumentError(path + ": not a JSON object");
  BpeTokenizer::SpecialTokens names;
  auto read = [&](const char* key, std::optional<std::string>* out) -> Status {
    if (!j.contains(key) || j[key].is_null()) return OkStatus();
    const nlohmann::json& v = j[key];
    if (v.is_string()) {
      *out = v.get<std::string>();
    } else if (v.is_object() && v.contains("content") && v["content"].is_string()) {
      *out = v["content"].get<std::string>();
    } else {
      std::string got = v.dump();
      if (got.size() > 80) {  // cut at a character boundary: the message stays UTF-8
        size_t end = 77;
        while (end > 0 && (static_cast<unsigned char>(got[end]) & 0xC0) == 0x80) --end;
        got = got.substr(0, end) + "...";
      }
      return InvalidArgumentError(
          absl::StrCat(path, ": ", key, ": expected a string or {\"content\": ...}, got ", got));
    }
    return OkStatus();
  };
  RELAY_RETURN_IF_ERROR(read("eos_token", &names.eos));
  RELAY_RETURN_IF_ERROR(read("bos_token", &names.bos));
  RELAY_RETURN_IF_ERROR(read("pad_token", &names.pad));
  return names;
}

}  // namespace

StatusOr<std::unique_ptr<Tokenizer>> load_tokenizer(const std::string& model_dir) {
  const std::string char_path = (std::filesystem::path(model_dir) / kCharTokenizerFile).string();
  if (std::filesystem::exists(char_path)) return load_tokenizer_file(char_path);
  const std::string hf_path = (std::filesystem::path(model_dir) / kHfTokenizerFile).string();
  if (std::filesystem::exists(hf_path)) {
    RELAY_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> t, load_tokenizer_file(hf_path));
    const std::string config = (std::filesystem::path(model_dir) / kHfTokenizerConfigFile).string();
    auto* bpe = dynamic_cast<BpeTokenizer*>(t.get());
    if (bpe != nullptr && std::filesystem::exists(config)) {
      RELAY_ASSIGN_OR_RETURN(BpeTokenizer::SpecialTokens names, read_special_tokens(config));
      RELAY_RETURN_IF_ERROR(bpe->use_special_tokens(names, config));
    }
    return t;
  }
  if (is_peft_adapter_dir(model_dir)) {
    // PEFT's save_pretrained writes no tokenizer: the base model's it is.
    RELAY_ASSIGN_OR_RETURN(PeftAdapter adapter, read_peft_adapter(model_dir));
    return load_tokenizer(adapter.base_model);
  }
  return NotFoundError(absl::StrCat(model_dir, ": no tokenizer (", kCharTokenizerFile, " or ",
                                    kHfTokenizerFile, ")"));
}

Status save_char_tokenizer(const CharTokenizer& tokenizer, const std::string& model_dir) {
  return write_file_atomic((std::filesystem::path(model_dir) / kCharTokenizerFile).string(),
                           tokenizer.to_json());
}

}  // namespace relay::model
