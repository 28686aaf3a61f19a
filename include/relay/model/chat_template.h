#pragma once

// Chat templates: a conversation (system / user / assistant messages) as the
// prompt text an instruction-tuned model was trained on, ending with the
// assistant header so that the model's continuation is its reply. Rendering
// matches Hugging Face's apply_chat_template(..., add_generation_prompt=True)
// with the models' own templates:
//
//   chatml  (Qwen2, Qwen2.5, Qwen3, SmolLM, ...): per message
//           "<|im_start|>{role}\n{content}<|im_end|>\n", then "<|im_start|>assistant\n".
//   llama3  (Meta-Llama-3-8B/70B-Instruct): "<|begin_of_text|>", then per message
//           "<|start_header_id|>{role}<|end_header_id|>\n\n{content | trim}<|eot_id|>",
//           then "<|start_header_id|>assistant<|end_header_id|>\n\n".
//
// relay adds no default system message. Qwen's templates add one when the
// conversation has none ("You are a helpful assistant." in Qwen2, a longer
// one in Qwen2.5, none in Qwen3), so a run that wants Qwen2's exact rendering
// sets model.system_prompt to that text; Llama 3.1's date header is likewise
// not reproduced. A default hidden in relay would change with the model
// generation and silently alter every prompt.
//
// Pure text, no LibTorch (library relay_chat). Thread-safe: no state.

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "relay/common/name_table.h"
#include "relay/common/status.h"

namespace relay::model {

class Tokenizer;

enum class ChatTemplate { kNone, kChatml, kLlama3 };

struct ChatMessage {
  std::string role;  // system | user | assistant
  std::string content;
};

// A run's chat settings: model.chat_template once resolved against the
// tokenizer (never "auto" here) and model.system_prompt.
struct ChatOptions {
  ChatTemplate chat_template = ChatTemplate::kNone;  // kNone: prompts are used as written
  std::string system_prompt;  // put first when a conversation has no system message; "" = none
};

// "none", "chatml", "llama3".
const char* chat_template_name(ChatTemplate t);

// The special tokens the format writes ({} for kNone). Each must be one
// token of the tokenizer, or the model would see them as plain text.
std::vector<std::string> chat_special_tokens(ChatTemplate t);

// The token that ends a turn, and so a response: "<|im_end|>" (chatml),
// "<|eot_id|>" (llama3), "" (kNone). Generation stops on it.
std::string end_of_turn(ChatTemplate t);

// model.chat_template as configured: a format, or auto (the one format
// whose special tokens the tokenizer has).
enum class ChatTemplateChoice { kNone, kChatml, kLlama3, kAuto };
inline const NameTable<ChatTemplateChoice> kChatTemplateChoiceNames{
    "chat template",
    {{"none", ChatTemplateChoice::kNone},
     {"chatml", ChatTemplateChoice::kChatml},
     {"llama3", ChatTemplateChoice::kLlama3},
     {"auto", ChatTemplateChoice::kAuto}}};

// The format `choice` means for `tokenizer`: chatml and llama3 once every
// special token of that format encodes as a single id of the tokenizer;
// auto = the one format whose tokens the tokenizer has. InvalidArgument
// naming `field` and the missing token, or, for auto, what the tokenizer
// lacks (or that it has both).
StatusOr<ChatTemplate> resolve_chat_template(ChatTemplateChoice choice, const Tokenizer& tokenizer,
                                             std::string_view field = "model.chat_template");
// The same for a flag's text (`relay generate --chat-template auto`); an
// unknown name is an InvalidArgument naming `field`.
StatusOr<ChatTemplate> resolve_chat_template(std::string_view name, const Tokenizer& tokenizer,
                                             std::string_view field = "model.chat_template");

// The first of the format's special tokens that occurs in `text`, or "" when
// none does. Content holding one would forge a turn boundary.
std::string_view find_chat_token(ChatTemplate t, std::string_view text);

// What is wrong with a conversation, and where: `path` is relative to the
// list ("" for the list itself, "[2].role", "[0].content"), so a caller names
// the element in its own terms ("data.jsonl:7: field 'prompt[2].role': ...").
struct ChatProblem {
  std::string path;
  std::string what;  // "unknown role 'bot'; expected system, user or assistant"
};

// Checks a conversation that is to become a prompt: at least one message;
// each role is system, user or assistant; a system message only first; each
// content non-empty and free of the format's special tokens; the last
// message is the user's (the model is to answer it). nullopt when it passes.
std::optional<ChatProblem> find_chat_problem(ChatTemplate t,
                                             const std::vector<ChatMessage>& messages);

// The conversation as text in format `t`, with the assistant header after it
// when `add_generation_prompt`, byte for byte as Hugging Face renders it.
// REQUIRES: t != kNone; messages pass find_chat_problem (or, without the
// generation prompt, may end with an assistant message).
std::string render_chat(ChatTemplate t, const std::vector<ChatMessage>& messages,
                        bool add_generation_prompt = true);

// What the model should generate as the reply to a rendered prompt: the
// content as the format renders an assistant message (llama3 trims it) and
// the end-of-turn token, so that supervised targets teach the model to stop.
// render_chat(t, m) + chat_response(t, c) is a prefix of
// render_chat(t, m + {assistant, c}, /*add_generation_prompt=*/false).
// REQUIRES: t != kNone.
std::string chat_response(ChatTemplate t, std::string_view content);

}  // namespace relay::model
