// relay generate --model DIR (--ids | --text): samples a continuation with
// the KV cache, optionally rendering --text as a chat user message.

#include <CLI/CLI.hpp>

#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bin/commands.h"
#include "relay/model/chat_template.h"
#include "relay/model/checkpoint.h"
#include "relay/model/policy.h"
#include "relay/model/threads.h"
#include "relay/model/tokenizer.h"
#include "relay/rollout/generate.h"

namespace relay::cli {
namespace {

struct GenerateArgs {
  std::string model_dir;
  std::string ids;   // "1,2,3"; or
  std::string text;  // encoded with the directory's tokenizer
  // none | chatml | llama3 | auto: render `text` as a user message (after
  // `system_prompt`, if any) and stop at the end-of-turn token too.
  std::string chat_template = "none";
  std::string system_prompt;
  int64_t max_new_tokens = 16;
  bool greedy = false;
  double temperature = 1.0;
  int64_t top_k = 0;
  double top_p = 1.0;
  uint64_t seed = 0;
  std::string stop;  // extra stop ids "2,5"; the tokenizer's EOS always stops
  bool no_eos_stop = false;
  bool json = false;
};

// With --chat-template: `text` becomes the rendered conversation (--system,
// then --text as the user's message) and `stop` its end-of-turn token.
Status render_chat_text(const GenerateArgs& args, const model::Tokenizer& tokenizer,
                        std::string* text, std::optional<int64_t>* stop) {
  RELAY_ASSIGN_OR_RETURN(
      model::ChatTemplate t,
      model::resolve_chat_template(args.chat_template, tokenizer, "--chat-template"));
  if (t == model::ChatTemplate::kNone) {
    if (!args.system_prompt.empty()) {
      return InvalidArgumentError("--system: needs --chat-template (chatml, llama3 or auto)");
    }
    return OkStatus();
  }
  std::vector<model::ChatMessage> messages;
  if (!args.system_prompt.empty()) messages.push_back({"system", args.system_prompt});
  messages.push_back({"user", args.text});
  if (std::optional<model::ChatProblem> problem = model::find_chat_problem(t, messages)) {
    const bool system = !args.system_prompt.empty() && problem->path.rfind("[0]", 0) == 0;
    return InvalidArgumentError(absl::StrCat(system ? "--system" : "--text", ": ", problem->what));
  }
  *text = model::render_chat(t, messages);
  *stop = tokenizer.token_id(model::end_of_turn(t));
  return OkStatus();
}

int generate(const GenerateArgs& args) {
  // Every core, split as relay's workers split it (model/threads.h).
  model::configure_threads(0);
  StatusOr<model::Policy> policy = model::load_policy(args.model_dir);
  if (!policy.ok()) return fail("generate", policy.status());
  // --ids needs no tokenizer (the text line is left out without one); a
  // tokenizer file that is there but does not load is reported either way,
  // not taken for an absent one.
  std::unique_ptr<model::Tokenizer> tokenizer;
  StatusOr<std::unique_ptr<model::Tokenizer>> loaded = model::load_tokenizer(args.model_dir);
  if (loaded.ok()) {
    tokenizer = *std::move(loaded);
  } else if (!absl::IsNotFound(loaded.status())) {
    if (!args.text.empty()) return fail("generate", loaded.status());
    std::fprintf(stderr, "relay generate: warning: %s; printing ids only\n",
                 std::string(loaded.status().message()).c_str());
  }

  std::vector<int64_t> prompt;
  std::string error;
  std::optional<int64_t> chat_stop;  // the chat template's end-of-turn token
  if (!args.text.empty()) {
    if (!tokenizer)
      return fail("generate",
                  NotFoundError(absl::StrCat("--text needs a tokenizer in ", args.model_dir)));
    std::string text = args.text;
    if (Status st = render_chat_text(args, *tokenizer, &text, &chat_stop); !st.ok()) {
      return fail("generate", st);
    }
    StatusOr<std::vector<int64_t>> encoded = tokenizer->encode(text);
    if (!encoded.ok()) return fail("generate", encoded.status());
    prompt = *encoded;
  } else if (args.ids.empty()) {
    return fail("generate", InvalidArgumentError("give the prompt with --ids or --text"));
  } else if (!parse_ids(args.ids, &prompt, &error)) {
    return fail("generate", InvalidArgumentError(error));
  }

  rollout::GenerateOptions opts;
  opts.max_new_tokens = args.max_new_tokens;
  opts.seed = args.seed;
  opts.sampling.greedy = args.greedy;
  opts.sampling.temperature = args.temperature;
  opts.sampling.top_k = args.top_k;
  opts.sampling.top_p = args.top_p;
  if (!args.stop.empty() && !parse_ids(args.stop, &opts.stop_tokens, &error)) {
    return fail("generate", InvalidArgumentError("--stop: " + error));
  }
  const int64_t eos = (*policy)->config().eos_token_id;
  if (!args.no_eos_stop && eos >= 0) opts.stop_tokens.push_back(eos);
  if (chat_stop) opts.stop_tokens.push_back(*chat_stop);

  StatusOr<std::vector<rollout::Generation>> result = rollout::generate(*policy, {prompt}, opts);
  if (!result.ok()) return fail("generate", result.status());
  const rollout::Generation& g = (*result)[0];
  if (args.json) {
    nlohmann::json out = {{"ids", g.tokens},
                          {"logprobs", g.logprobs},
                          {"finish_reason", rollout::finish_reason_name(g.finish_reason)}};
    std::cout << out.dump() << "\n";
    return 0;
  }
  std::printf("ids:");
  for (int64_t id : g.tokens) std::printf(" %lld", static_cast<long long>(id));
  std::printf("\nlogprobs:");
  for (float lp : g.logprobs) std::printf(" %.4f", lp);
  std::printf("\nfinish: %s\n", rollout::finish_reason_name(g.finish_reason));
  if (tokenizer) {
    StatusOr<std::string> prompt_text = tokenizer->decode(prompt);
    StatusOr<std::string> text = tokenizer->decode(g.tokens);
    if (prompt_text.ok() && text.ok())
      std::printf("text: %s|%s\n", prompt_text->c_str(), text->c_str());
  }
  return 0;
}

}  // namespace

Command add_generate_command(CLI::App& relay) {
  auto args = std::make_shared<GenerateArgs>();
  CLI::App* generate = relay.add_subcommand("generate", "Sample a continuation with the KV cache");
  generate->add_option("--model", args->model_dir, "HF-layout model directory")->required();
  CLI::Option* ids = generate->add_option("--ids", args->ids, "Prompt token ids, comma-separated");
  CLI::Option* text =
      generate->add_option("--text", args->text, "Prompt text (uses the model's tokenizer)");
  ids->excludes(text);
  CLI::Option* chat =
      generate
          ->add_option("--chat-template", args->chat_template,
                       "Render --text as a chat user message: none | chatml | llama3 | auto")
          ->needs(text);
  generate->add_option("--system", args->system_prompt, "System message (with --chat-template)")
      ->needs(chat);
  generate->add_option("--max-new-tokens", args->max_new_tokens, "Tokens to generate at most");
  CLI::Option* greedy = generate->add_flag("--greedy", args->greedy, "Argmax decoding");
  generate->add_option("--temperature", args->temperature, "Sampling temperature (> 0)")
      ->excludes(greedy);
  generate->add_option("--top-k", args->top_k, "Keep the k most likely tokens (0 = off)");
  generate->add_option("--top-p", args->top_p, "Nucleus mass in (0, 1] (1 = off)");
  generate->add_option("--seed", args->seed, "Sampling seed");
  generate->add_option("--stop", args->stop, "Extra stop token ids, comma-separated");
  generate->add_flag("--no-eos-stop", args->no_eos_stop, "Do not stop at the tokenizer's EOS");
  generate->add_flag("--json", args->json, "Print {\"ids\": [...], \"logprobs\": [...]}");
  return {generate, [args] { return cli::generate(*args); }};
}

}  // namespace relay::cli
