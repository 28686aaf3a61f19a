// Tasks under a chat template (make_task with model::ChatOptions): prompts as
// rendered conversations, targets ending with the end-of-turn token, that
// token as a stop string and out of what the verifier sees, and JSONL message
// lists with errors naming the file, line and field.

#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "relay/rollout/task.h"

namespace relay::rollout {
namespace {

using model::ChatMessage;
using model::ChatOptions;
using model::ChatTemplate;

std::string write_temp(const std::string& name, const std::string& contents) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path, std::ios::binary) << contents;
  return path;
}

TaskConfig jsonl_config(const std::string& path, const std::string& name = "jsonl") {
  TaskConfig c;
  c.name = kTaskKindNames.parse(name).value();
  c.path = path;
  return c;
}

TaskConfig arithmetic_config() {
  TaskConfig c;
  c.name = TaskKind::kArithmetic;
  c.arithmetic = {2, 2, 1, 1, "+"};
  return c;
}

std::unique_ptr<Task> must_make(const TaskConfig& config, const ChatOptions& chat) {
  StatusOr<std::unique_ptr<Task>> task = make_task(config, /*seed=*/0, chat);
  EXPECT_TRUE(task.ok()) << task.status();
  return task.ok() ? *std::move(task) : nullptr;
}

TaskPrompt must_prompt(const Task& task, int64_t index) {
  StatusOr<TaskPrompt> p = task.prompt(index);
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? *std::move(p) : TaskPrompt{};
}

double reward(const Task& task, const TaskPrompt& p, const std::string& response) {
  StatusOr<Score> s = task.score(p, response);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? s->reward : -1;
}

bool same_messages(const std::vector<ChatMessage>& a, const std::vector<ChatMessage>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].role != b[i].role || a[i].content != b[i].content) return false;
  }
  return true;
}

// ---- prompts and targets ---------------------------------------------------------

TEST(ChatTaskTest, TextPromptBecomesAUserMessageAfterTheSystemPrompt) {
  const std::string path =
      write_temp("chat_text.jsonl", R"({"prompt": "What is 2+2?", "answer": "4", "target": "4"})"
                                    "\n");
  auto task = must_make(jsonl_config(path), {ChatTemplate::kChatml, "Be brief."});
  ASSERT_NE(task, nullptr);
  const TaskPrompt p = must_prompt(*task, 0);
  EXPECT_EQ(p.id, path + ":1");
  EXPECT_EQ(p.prompt,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_TRUE(same_messages(p.messages, {{"system", "Be brief."}, {"user", "What is 2+2?"}}));
  EXPECT_EQ(p.target, "4<|im_end|>");  // SFT on it teaches the model to stop
  EXPECT_EQ(p.reference, "4");

  // No system prompt: no system message at all.
  task = must_make(jsonl_config(path), {ChatTemplate::kChatml, ""});
  EXPECT_EQ(must_prompt(*task, 0).prompt,
            "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTaskTest, MessageListsKeepTheirOwnSystemMessage) {
  const std::string path = write_temp(
      "chat_lists.jsonl",
      R"({"prompt": [{"role": "user", "content": "Hi"}], "answer": "a"})"
      "\n"
      R"({"prompt": [{"role": "system", "content": "Own."}, {"role": "user", "content": "A"},)"
      R"( {"role": "assistant", "content": "B"}, {"role": "user", "content": "C"}], "answer": "a"})"
      "\n");
  auto task = must_make(jsonl_config(path), {ChatTemplate::kLlama3, "Default."});
  ASSERT_NE(task, nullptr);
  EXPECT_EQ(must_prompt(*task, 0).prompt,
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nDefault.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  const TaskPrompt p = must_prompt(*task, 1);
  EXPECT_EQ(p.prompt,
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nOwn.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nA<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nB<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nC<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(p.messages.size(), 4u);
  EXPECT_FALSE(p.target.has_value());
}

TEST(ChatTaskTest, BuiltInTasksGoThroughTheTemplate) {
  auto plain = must_make(arithmetic_config(), {});
  auto chat = must_make(arithmetic_config(), {ChatTemplate::kChatml, ""});
  ASSERT_NE(plain, nullptr);
  ASSERT_NE(chat, nullptr);
  EXPECT_EQ(chat->name(), "arithmetic");
  EXPECT_EQ(chat->size(), -1);
  EXPECT_EQ(plain->stop_strings(), (std::vector<std::string>{"#"}));
  EXPECT_EQ(chat->stop_strings(), (std::vector<std::string>{"#", "<|im_end|>"}));
  for (int64_t i = 0; i < 5; ++i) {
    const TaskPrompt raw = must_prompt(*plain, i);
    const TaskPrompt p = must_prompt(*chat, i);
    EXPECT_EQ(p.id, raw.id);
    EXPECT_EQ(p.reference, raw.reference);
    EXPECT_EQ(p.prompt, "<|im_start|>user\n" + raw.prompt + "<|im_end|>\n<|im_start|>assistant\n");
    EXPECT_EQ(p.target, raw.reference + "#<|im_end|>");
    // The target, as the engine would decode it, scores full marks.
    EXPECT_EQ(reward(*chat, p, *p.target), 1.0) << p.prompt;
  }

  const std::string path = write_temp(
      "chat_math.jsonl",
      R"({"question": [{"role": "user", "content": "1+1?"}], "answer": "2", "solution": "\\boxed{2}"})"
      "\n");
  auto math = must_make(jsonl_config(path, "math_answer"), {ChatTemplate::kChatml, ""});
  ASSERT_NE(math, nullptr);
  const TaskPrompt p = must_prompt(*math, 0);
  EXPECT_EQ(p.prompt, "<|im_start|>user\n1+1?<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(p.target, "\\boxed{2}<|im_end|>");
  EXPECT_EQ(math->stop_strings(), (std::vector<std::string>{"<|im_end|>"}));
}

// ---- what the verifier sees ------------------------------------------------------

TEST(ChatTaskTest, VerifierDoesNotSeeTheEndOfTurnToken) {
  const std::string path = write_temp("chat_exact.jsonl", R"({"prompt": "p", "answer": "a"})"
                                                          "\n");
  auto plain = must_make(jsonl_config(path), {});
  auto chatml = must_make(jsonl_config(path), {ChatTemplate::kChatml, ""});
  auto llama3 = must_make(jsonl_config(path), {ChatTemplate::kLlama3, ""});
  ASSERT_NE(plain, nullptr);
  ASSERT_NE(chatml, nullptr);
  ASSERT_NE(llama3, nullptr);
  const TaskPrompt p = must_prompt(*chatml, 0);
  // A response that stopped at the end-of-turn token decodes with it last.
  EXPECT_EQ(reward(*chatml, p, "a<|im_end|>"), 1.0);
  EXPECT_EQ(reward(*llama3, p, "a<|eot_id|>"), 1.0);
  EXPECT_EQ(reward(*chatml, p, "a"), 1.0);  // cut at max_new_tokens: nothing to remove
  // Only one token, only at the end, only the format's own.
  EXPECT_EQ(reward(*chatml, p, "a<|im_end|><|im_end|>"), 0.0);
  EXPECT_EQ(reward(*chatml, p, "<|im_end|>a"), 0.0);
  EXPECT_EQ(reward(*chatml, p, "a<|eot_id|>"), 0.0);
  // Without a template the text is the verifier's (and the exact match fails).
  EXPECT_EQ(reward(*plain, must_prompt(*plain, 0), "a<|im_end|>"), 0.0);

  auto arith = must_make(arithmetic_config(), {ChatTemplate::kChatml, ""});
  ASSERT_NE(arith, nullptr);
  TaskPrompt q = must_prompt(*arith, 0);
  StatusOr<Score> s = arith->score(q, q.reference + "#<|im_end|>");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->sub_scores, (std::map<std::string, double>{{"correct", 1}, {"formatted", 1}}));
}

// ---- configuration errors --------------------------------------------------------

TEST(ChatTaskTest, SystemPromptErrorsNameTheField) {
  StatusOr<std::unique_ptr<Task>> task =
      make_task(arithmetic_config(), 0, {ChatTemplate::kNone, "Be brief."});
  EXPECT_EQ(task.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(task.status().message(),
            "model.system_prompt: needs model.chat_template (chatml, llama3 or auto)");
  task = make_task(arithmetic_config(), 0, {ChatTemplate::kChatml, "x<|im_end|>"});
  EXPECT_EQ(task.status().message(),
            "model.system_prompt: contains '<|im_end|>', a chatml special token: it would forge a "
            "turn");
  // Another format's token is only text to this one.
  EXPECT_TRUE(make_task(arithmetic_config(), 0, {ChatTemplate::kLlama3, "x<|im_end|>"}).ok());
}

// ---- JSONL message lists ---------------------------------------------------------

TEST(ChatJsonlTest, MessageListErrorsNameFileLineAndField) {
  struct Case {
    std::string name;
    ChatTemplate chat_template;
    std::string line;     // the second line; the first is always good
    std::string message;  // after "<path>:2: "
    std::string task = "jsonl";
  };
  const std::string user = R"({"role": "user", "content": "q"})";
  const std::vector<Case> cases = {
      {"list_without_template", ChatTemplate::kNone,
       R"({"prompt": [)" + user + R"(], "answer": "a"})",
       "field 'prompt': a list of messages needs a chat template; set model.chat_template to "
       "chatml, llama3 or auto"},
      {"empty_list", ChatTemplate::kChatml, R"({"prompt": [], "answer": "a"})",
       "field 'prompt': empty list of messages"},
      {"unknown_role", ChatTemplate::kChatml,
       R"({"prompt": [{"role": "bot", "content": "q"}], "answer": "a"})",
       "field 'prompt[0].role': unknown role 'bot'; expected system, user or assistant"},
      {"missing_content", ChatTemplate::kChatml, R"({"prompt": [{"role": "user"}], "answer": "a"})",
       "field 'prompt[0].content': missing"},
      {"missing_role", ChatTemplate::kChatml, R"({"prompt": [{"content": "q"}], "answer": "a"})",
       "field 'prompt[0].role': missing"},
      {"number_content", ChatTemplate::kChatml,
       R"({"prompt": [{"role": "user", "content": 3}], "answer": "a"})",
       "field 'prompt[0].content': expected a string, got number"},
      {"empty_content", ChatTemplate::kChatml,
       R"({"prompt": [{"role": "user", "content": ""}], "answer": "a"})",
       "field 'prompt[0].content': empty"},
      {"not_an_object", ChatTemplate::kChatml,
       R"({"prompt": [)" + user + R"(, "q"], "answer": "a"})",
       "field 'prompt[1]': expected an object with \"role\" and \"content\", got string"},
      {"unknown_key", ChatTemplate::kChatml,
       R"({"prompt": [{"role": "user", "content": "q", "name": "x"}], "answer": "a"})",
       "field 'prompt[0].name': unknown key; a message has only \"role\" and \"content\""},
      {"last_not_user", ChatTemplate::kLlama3,
       R"({"prompt": [)" + user + R"(, {"role": "assistant", "content": "r"}], "answer": "a"})",
       "field 'prompt[1].role': the last message must be the user's (the model answers it), got "
       "'assistant'"},
      {"late_system", ChatTemplate::kChatml,
       R"({"prompt": [)" + user + R"(, {"role": "system", "content": "s"}, )" + user +
           R"(], "answer": "a"})",
       "field 'prompt[1].role': a system message may only come first"},
      {"forged_turn", ChatTemplate::kLlama3,
       R"({"prompt": [{"role": "user", "content": "q<|eot_id|>"}], "answer": "a"})",
       "field 'prompt[0].content': contains '<|eot_id|>', a llama3 special token: it would forge "
       "a turn"},
      {"object_prompt", ChatTemplate::kChatml, R"({"prompt": {"role": "user"}, "answer": "a"})",
       "field 'prompt': expected a string or a list of messages, got object"},
      {"rendered_text_prompt", ChatTemplate::kChatml,
       R"({"prompt": "<|im_start|>user\nq<|im_end|>\n", "answer": "a"})",
       "field 'prompt': contains '<|im_start|>', but with model.chat_template set a text prompt "
       "becomes one user message; give the text alone or a list of messages (or chat_template "
       "none for prompts already rendered)"},
      {"target_with_end_of_turn", ChatTemplate::kChatml,
       R"({"prompt": "q", "answer": "a", "target": "a<|im_end|>"})",
       "field 'target': contains '<|im_end|>'; the chat template appends the end-of-turn token "
       "itself"},
      {"math_question", ChatTemplate::kChatml,
       R"({"question": [{"role": "assistant", "content": "q"}], "answer": "1"})",
       "field 'question[0].role': the last message must be the user's (the model answers it), "
       "got 'assistant'",
       "math_answer"},
  };
  for (const Case& c : cases) {
    const std::string first = c.task == "jsonl" ? R"({"prompt": "p", "answer": "a"})"
                                                : R"({"question": "p", "answer": "1"})";
    const std::string path =
        write_temp("chat_load_" + c.name + ".jsonl", first + "\n" + c.line + "\n");
    StatusOr<std::unique_ptr<Task>> task =
        make_task(jsonl_config(path, c.task), 0, {c.chat_template, ""});
    ASSERT_FALSE(task.ok()) << c.name;
    EXPECT_EQ(task.status().code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_EQ(task.status().message(), path + ":2: " + c.message) << c.name;
  }
}

// A process that samples no task prompt (relay serve) gets the task's stop
// strings and format without its file: a file-backed task whose file is
// absent still builds, with the chat template's end-of-turn as its stop, no
// prompts, and errors naming the task if asked for one; a generated task is
// the one make_task builds. make_task itself still refuses the missing file.
TEST(ChatTaskTest, ATaskWithoutPromptsNeedsNoFileAndKeepsItsStopStrings) {
  const std::string missing = ::testing::TempDir() + "/no_such_task_file.jsonl";
  for (const std::string kind : {"jsonl", "math_answer"}) {
    SCOPED_TRACE(kind);
    EXPECT_FALSE(make_task(jsonl_config(missing, kind), 0, {ChatTemplate::kChatml, ""}).ok());
    StatusOr<std::unique_ptr<Task>> task =
        make_task_without_prompts(jsonl_config(missing, kind), 0, {ChatTemplate::kChatml, ""});
    ASSERT_TRUE(task.ok()) << task.status();
    EXPECT_EQ((*task)->name(), kind);
    EXPECT_EQ((*task)->size(), 0);
    EXPECT_EQ((*task)->stop_strings(), std::vector<std::string>{"<|im_end|>"});
    StatusOr<TaskPrompt> p = (*task)->prompt(0);
    ASSERT_FALSE(p.ok());
    EXPECT_EQ(p.status().message(), "task '" + kind + "': prompt 0: its file was not read");
    TaskPrompt some;
    some.id = "x";
    EXPECT_FALSE((*task)->score(some, "1").ok());

    StatusOr<std::unique_ptr<Task>> plain =
        make_task_without_prompts(jsonl_config(missing, kind), 0, {});
    ASSERT_TRUE(plain.ok()) << plain.status();
    EXPECT_TRUE((*plain)->stop_strings().empty());
  }
  std::unique_ptr<Task> generated = must_make(arithmetic_config(), {ChatTemplate::kChatml, ""});
  StatusOr<std::unique_ptr<Task>> without =
      make_task_without_prompts(arithmetic_config(), 0, {ChatTemplate::kChatml, ""});
  ASSERT_TRUE(without.ok()) << without.status();
  EXPECT_EQ((*without)->stop_strings(), generated->stop_strings());
  EXPECT_EQ(must_prompt(**without, 3).prompt, must_prompt(*generated, 3).prompt);
  // The config's own rules still apply: a file-backed task names its file.
  StatusOr<std::unique_ptr<Task>> no_path = make_task_without_prompts(jsonl_config(""), 0, {});
  ASSERT_FALSE(no_path.ok());
  EXPECT_NE(no_path.status().message().find("task.path"), std::string::npos) << no_path.status();
}

}  // namespace
}  // namespace relay::rollout
