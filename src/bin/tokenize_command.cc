// relay tokenize: encodes text (prints the ids, comma-separated) or decodes
// ids (prints the text) with relay's or a Hugging Face tokenizer.

#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "bin/commands.h"
#include "relay/model/tokenizer.h"

namespace relay::cli {
namespace {

struct TokenizeArgs {
  std::string tokenizer;  // a tokenizer file, or a model directory holding one
  std::string text;       // text to encode
  bool decode = false;    // decode `ids` instead
  std::string ids;        // "1,2,3", with decode
  bool json = false;      // print {"ids": [...]} or {"text": "..."}
};

int tokenize(const TokenizeArgs& args) {
  StatusOr<std::unique_ptr<model::Tokenizer>> tokenizer =
      std::filesystem::is_directory(args.tokenizer) ? model::load_tokenizer(args.tokenizer)
                                                    : model::load_tokenizer_file(args.tokenizer);
  if (!tokenizer.ok()) return fail("tokenize", tokenizer.status());
  if (args.decode) {
    std::vector<int64_t> ids;
    std::string error;
    if (!parse_ids(args.ids, &ids, &error)) return fail("tokenize", InvalidArgumentError(error));
    StatusOr<std::string> text = (*tokenizer)->decode(ids);
    if (!text.ok()) return fail("tokenize", text.status());
    if (args.json) {
      // Ids that end inside a UTF-8 sequence decode to invalid UTF-8: JSON
      // shows those bytes as U+FFFD.
      std::cout << nlohmann::json{{"text", *text}}.dump(-1, ' ', false,
                                                        nlohmann::json::error_handler_t::replace)
                << "\n";
    } else {
      std::cout << *text << "\n";
    }
    return 0;
  }
  StatusOr<std::vector<int64_t>> ids = (*tokenizer)->encode(args.text);
  if (!ids.ok()) return fail("tokenize", ids.status());
  if (args.json) {
    std::cout << nlohmann::json{{"ids", *ids}}.dump() << "\n";
  } else {
    std::cout << absl::StrJoin(*ids, ",") << "\n";
  }
  return 0;
}

}  // namespace

Command add_tokenize_command(CLI::App& relay) {
  auto args = std::make_shared<TokenizeArgs>();
  CLI::App* tokenize =
      relay.add_subcommand("tokenize", "Encode text to ids, or decode ids to text");
  tokenize->add_option("--tokenizer", args->tokenizer, "Tokenizer file or model directory")
      ->required();
  CLI::Option* text = tokenize->add_option("--text", args->text, "Text to encode");
  CLI::Option* decode = tokenize->add_flag("--decode", args->decode, "Decode --ids instead");
  CLI::Option* ids =
      tokenize->add_option("--ids", args->ids, "Token ids to decode, comma-separated");
  decode->needs(ids)->excludes(text);
  ids->needs(decode);
  text->excludes(decode);
  tokenize->add_flag("--json", args->json, "Print {\"ids\": [...]} or {\"text\": ...}");
  return {tokenize, [args, text] {
            if (!args->decode && text->count() == 0) {
              std::fprintf(stderr, "relay tokenize: give --text, or --decode with --ids\n");
              return 1;
            }
            return cli::tokenize(*args);
          }};
}

}  // namespace relay::cli
