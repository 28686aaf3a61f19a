// relay export SRC --out DIR [--merge] [--dtype D]: a model directory any
// Hugging Face tool loads. SRC is a model directory or a PEFT LoRA adapter
// directory (a LoRA run's checkpoint); an adapter is merged into its base
// (W + alpha / r * B A, PEFT's merge_and_unload) only when --merge says so.

#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "bin/commands.h"
#include "relay/common/file_io.h"
#include "relay/model/checkpoint.h"
#include "relay/model/lora.h"
#include "relay/model/policy.h"
#include "relay/model/tokenizer.h"

namespace relay::cli {
namespace {

struct ExportArgs {
  std::string source;
  std::string out;
  bool merge = false;
  bool overwrite = false;
  std::string dtype;  // "" = as loaded
};

// The files next to the weights that HF tools read (the tokenizer and
// generation config), from the directory that has them.
Status carry_files(const std::string& from, model::SaveOptions& o) {
  for (const char* name : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                           "generation_config.json", "vocab.json", "merges.txt",
                           "chat_template.jinja", model::kCharTokenizerFile}) {
    const std::string path = (std::filesystem::path(from) / name).string();
    if (o.extra_files.count(name) || !std::filesystem::exists(path)) continue;
    RELAY_ASSIGN_OR_RETURN(o.extra_files[name], read_file(path));
  }
  return OkStatus();
}

int run_export(const ExportArgs& args) {
  model::LoadOptions lo;
  if (!args.dtype.empty()) {
    StatusOr<c10::ScalarType> dtype = model::parse_torch_dtype(args.dtype);
    if (!dtype.ok()) return fail("export", dtype.status());
    lo.dtype = *dtype;
  }
  const bool adapter = model::is_peft_adapter_dir(args.source) &&
                       !std::filesystem::exists(std::filesystem::path(args.source) / "config.json");
  if (adapter && !args.merge) {
    return fail("export", InvalidArgumentError(absl::StrCat(
                              args.source,
                              " is a LoRA adapter (adapter_config.json); pass --merge to write its "
                              "base with the adapter merged in")));
  }
  if (!adapter && args.merge) {
    return fail("export", InvalidArgumentError(absl::StrCat("--merge: ", args.source,
                                                            " is not a LoRA adapter directory")));
  }
  StatusOr<model::Policy> policy = model::load_policy(args.source, lo);
  if (!policy.ok()) return fail("export", policy.status());
  model::SaveOptions so;
  so.overwrite = args.overwrite;
  if (Status s = carry_files(args.source, so); !s.ok()) return fail("export", s);
  model::Policy out = *policy;
  if (adapter) {
    StatusOr<model::PeftAdapter> a = model::read_peft_adapter(args.source);
    if (!a.ok()) return fail("export", a.status());
    if (Status s = carry_files(a->base_model, so); !s.ok()) return fail("export", s);
    out = model::merged_policy(**policy);
  }
  if (Status s = model::save_policy(*out, args.out, so); !s.ok()) return fail("export", s);
  std::printf("wrote %s%s\n", args.out.c_str(),
              adapter ? " (the base with the LoRA adapter merged)" : "");
  return 0;
}

}  // namespace

Command add_export_command(CLI::App& relay) {
  auto args = std::make_shared<ExportArgs>();
  CLI::App* app = relay.add_subcommand(
      "export", "Write a Hugging Face model directory (a LoRA adapter merged into its base)");
  app->add_option("source", args->source, "Model directory or PEFT LoRA adapter directory")
      ->required();
  app->add_option("--out", args->out, "Directory to write")->required();
  app->add_flag("--merge", args->merge, "Merge the LoRA adapter into its base model");
  app->add_option("--dtype", args->dtype, "float32 | bfloat16 | float16 (default: as stored)");
  app->add_flag("--overwrite", args->overwrite, "Replace --out if it exists");
  return {app, [args] { return cli::run_export(*args); }};
}

}  // namespace relay::cli
