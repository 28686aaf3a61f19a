// Episodes of the OpenAI endpoint (serve/episodes.h): calls that extend the
// conversation continue its tokens as sampled; the episode's trajectory
// marks the appended messages as the environment's.

#include "relay/serve/episodes.h"

#include <gtest/gtest.h>

#include <cmath>
#include <thread>

#include "relay/model/bpe_tokenizer.h"
#include "testing/byte_tokenizer_json.h"

namespace relay::serve {
namespace {

using model::ChatTemplate;

constexpr int64_t kImEnd = 258;

std::shared_ptr<const model::Tokenizer> chatml_bytes() {
  static auto t = std::make_shared<model::BpeTokenizer>(*model::BpeTokenizer::from_json(
      relay::testing::byte_tokenizer_json({"<|endoftext|>", "<|im_start|>", "<|im_end|>"}).dump(),
      "test"));
  return t;
}

std::vector<int64_t> encode(const std::string& text) { return *chatml_bytes()->encode(text); }

// What the engine would return for a turn: every token at version v.
rollout::Trajectory sampled(std::vector<int64_t> tokens, int64_t version,
                            rollout::FinishReason finish = rollout::FinishReason::kStop) {
  rollout::Trajectory t;
  const size_t n = tokens.size();
  t.response_tokens = std::move(tokens);
  t.behavior_logprobs.assign(n, -0.5f);
  t.token_versions.assign(n, version);
  t.proximal_logprobs.assign(n, -0.5f);
  t.proximal_versions.assign(n, version);
  t.offpolicy_mask.assign(n, 0);
  t.version_digests = {{version, 100 + static_cast<uint64_t>(version)}};
  t.finish_reason = finish;
  return t;
}

const char kCall[] =
    "<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"6*7\"}}\n"
    "</tool_call>";

env::ConversationMessage call_reply() {
  return {"assistant", "", {{"calculator", R"({"expression":"6*7"})"}}};
}

TEST(EpisodesTest, ACallThatExtendsTheConversationContinuesItsTokens) {
  EpisodeStore store({}, chatml_bytes(), ChatTemplate::kChatml);
  std::vector<env::ConversationMessage> messages = {{"user", "What is 6*7?", {}}};
  auto first = store.begin_call("e", messages, {});
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_FALSE(first->continued);
  EXPECT_EQ(first->prompt, encode(*env::render_conversation(ChatTemplate::kChatml, messages, {})));
  std::vector<int64_t> turn = encode(kCall);
  turn.push_back(kImEnd);
  store.finish_call("e", sampled(turn, 0), call_reply());

  // The client repeats the conversation with our reply, then the tool result.
  messages.push_back(call_reply());
  messages.push_back({"tool", "42", {}});
  auto second = store.begin_call("e", messages, {});
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_TRUE(second->continued);
  std::vector<int64_t> want = first->prompt;
  want.insert(want.end(), turn.begin(), turn.end());
  const std::vector<int64_t> observation =
      encode(*env::render_observation(ChatTemplate::kChatml, {{"tool", "42"}}));
  want.insert(want.end(), observation.begin(), observation.end());
  EXPECT_EQ(second->prompt, want);
  EXPECT_EQ(second->appended, static_cast<int64_t>(observation.size()));
  // Here the sampled turn is the template's own rendering, so continuing
  // equals rendering the whole conversation again.
  EXPECT_EQ(second->prompt, encode(*env::render_conversation(ChatTemplate::kChatml, messages, {})));

  std::vector<int64_t> answer = encode("42");
  answer.push_back(kImEnd);
  store.finish_call("e", sampled(answer, 1), {"assistant", "42", {}});
  auto ended = store.end("e", 1.0);
  ASSERT_TRUE(ended.ok()) << ended.status();
  EXPECT_EQ(ended->calls, 2);
  const rollout::Trajectory& t = ended->trajectory;
  ASSERT_TRUE(rollout::check_trajectory(t).ok()) << rollout::check_trajectory(t);
  EXPECT_EQ(t.prompt_tokens, first->prompt);
  EXPECT_EQ(t.reward, 1.0);
  const auto T = static_cast<int64_t>(turn.size());
  const auto O = static_cast<int64_t>(observation.size());
  ASSERT_EQ(t.turns.size(), 2u);
  EXPECT_EQ(t.turns[0].model_end, T);
  EXPECT_EQ(t.turns[0].env_end, T + O);
  EXPECT_EQ(t.turns[1].model_end, T + O + static_cast<int64_t>(answer.size()));
  EXPECT_EQ(t.num_env_tokens(), O);
  for (int64_t j = 0; j < static_cast<int64_t>(t.response_tokens.size()); ++j) {
    const bool env = j >= T && j < T + O;
    EXPECT_EQ(t.env_mask[j], env ? 1 : 0) << j;
    EXPECT_EQ(std::isnan(t.behavior_logprobs[j]), env) << j;
  }
  EXPECT_EQ(t.token_versions.back(), 1);
  EXPECT_EQ(t.version_digests.size(), 2u);
  EXPECT_EQ(store.open(), 0);
  EXPECT_TRUE(absl::IsNotFound(store.end("e", 0).status()));
}

// MoE: each position keeps the routing of the call that ran it first, so the
// episode's routing is what every turn was sampled under (router replay),
// with one entry per position but the last, as Trajectory documents.
TEST(EpisodesTest, EveryPositionKeepsTheRoutingOfTheCallThatRanItFirst) {
  EpisodeStore store({}, chatml_bytes(), ChatTemplate::kChatml);
  std::vector<env::ConversationMessage> messages = {{"user", "What is 6*7?", {}}};
  auto first = store.begin_call("e", messages, {});
  ASSERT_TRUE(first.ok()) << first.status();
  const auto P = static_cast<int32_t>(first->prompt.size());
  std::vector<int64_t> turn = encode(kCall);
  turn.push_back(kImEnd);
  const auto T = static_cast<int32_t>(turn.size());
  // Two layers x one expert per position; call c routes position p to c*1000 + p.
  auto routed = [](int32_t call, int32_t positions) {
    std::vector<int32_t> r;
    for (int32_t p = 0; p < positions; ++p) r.insert(r.end(), {call * 1000 + p, call * 1000 + p});
    return r;
  };
  rollout::Trajectory s1 = sampled(turn, 0);
  s1.routed_experts = routed(1, P + T - 1);
  s1.routing_layers = 2;
  s1.routing_top_k = 1;
  store.finish_call("e", s1, call_reply());
  messages.push_back(call_reply());
  messages.push_back({"tool", "42", {}});
  auto second = store.begin_call("e", messages, {});
  ASSERT_TRUE(second.ok() && second->continued) << second.status();
  const auto P2 = static_cast<int32_t>(second->prompt.size());
  std::vector<int64_t> answer = encode("42");
  answer.push_back(kImEnd);
  rollout::Trajectory s2 = sampled(answer, 1);
  s2.routed_experts = routed(2, P2 + static_cast<int32_t>(answer.size()) - 1);
  s2.routing_layers = 2;
  s2.routing_top_k = 1;
  store.finish_call("e", s2, {"assistant", "42", {}});
  auto ended = store.end("e", 1.0);
  ASSERT_TRUE(ended.ok()) << ended.status();
  const rollout::Trajectory& t = ended->trajectory;
  const size_t positions = t.prompt_tokens.size() + t.response_tokens.size() - 1;
  ASSERT_EQ(t.routed_experts.size(), 2 * positions);
  EXPECT_EQ(t.routing_layers, 2);
  EXPECT_EQ(t.routing_top_k, 1);
  for (size_t p = 0; p < positions; ++p) {
    // The first call ran positions [0, P + T - 1); the second the rest.
    const int32_t call = static_cast<int32_t>(p) < P + T - 1 ? 1 : 2;
    EXPECT_EQ(t.routed_experts[2 * p], call * 1000 + static_cast<int32_t>(p)) << p;
  }
}

TEST(EpisodesTest, ATurnCutShortGetsItsEndOfTurnTokenBeforeTheNewMessages) {
  EpisodeStore store({}, chatml_bytes(), ChatTemplate::kChatml);
  std::vector<env::ConversationMessage> messages = {{"user", "Count", {}}};
  ASSERT_TRUE(store.begin_call("e", messages, {}).ok());
  store.finish_call("e", sampled(encode("1 2 3"), 0, rollout::FinishReason::kLength),
                    {"assistant", "1 2 3", {}});
  messages.push_back({"assistant", "1 2 3", {}});
  messages.push_back({"user", "Go on", {}});
  auto next = store.begin_call("e", messages, {});
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_TRUE(next->continued);
  const std::vector<int64_t> appended(next->prompt.end() - next->appended, next->prompt.end());
  EXPECT_EQ(appended.front(), kImEnd);
  EXPECT_EQ(appended,
            encode("<|im_end|>\n<|im_start|>user\nGo on<|im_end|>\n<|im_start|>assistant\n"));
}

TEST(EpisodesTest, ARewrittenHistoryStartsTheEpisodeOver) {
  EpisodeStore store({}, chatml_bytes(), ChatTemplate::kChatml);
  std::vector<env::ConversationMessage> messages = {{"user", "A", {}}};
  ASSERT_TRUE(store.begin_call("e", messages, {}).ok());
  store.finish_call("e", sampled(encode("B"), 0), {"assistant", "B", {}});
  // The agent edited our reply: nothing of the old tokens can stand.
  std::vector<env::ConversationMessage> edited = {
      {"user", "A", {}}, {"assistant", "B, edited", {}}, {"user", "C", {}}};
  auto call = store.begin_call("e", edited, {});
  ASSERT_TRUE(call.ok());
  EXPECT_FALSE(call->continued);
  EXPECT_EQ(call->prompt, encode(*env::render_conversation(ChatTemplate::kChatml, edited, {})));
  // So does another tool list, or an assistant message where a result belongs.
  store.finish_call("e", sampled(encode("D"), 0), {"assistant", "D", {}});
  edited.push_back({"assistant", "D", {}});
  edited.push_back({"user", "E", {}});
  EXPECT_FALSE(store.begin_call("e", edited, {R"({"type":"function"})"})->continued);
}

TEST(EpisodesTest, OneCallAtATimeAndIdleEpisodesAreDropped) {
  EpisodeStore store({}, chatml_bytes(), ChatTemplate::kChatml);
  const std::vector<env::ConversationMessage> messages = {{"user", "A", {}}};
  ASSERT_TRUE(store.begin_call("e", messages, {}).ok());
  auto again = store.begin_call("e", messages, {});
  EXPECT_TRUE(absl::IsFailedPrecondition(again.status())) << again.status();
  EXPECT_TRUE(absl::IsFailedPrecondition(store.end("e", 0).status()));
  store.abandon_call("e");  // the first call failed: nothing of it stands
  EXPECT_EQ(store.open(), 0);

  EpisodeStoreOptions o;
  o.idle_timeout = std::chrono::seconds(0);
  o.max_episodes = 1;
  EpisodeStore quick(o, chatml_bytes(), ChatTemplate::kChatml);
  ASSERT_TRUE(quick.begin_call("a", messages, {}).ok());
  EXPECT_TRUE(absl::IsResourceExhausted(quick.begin_call("b", messages, {}).status()));
  quick.finish_call("a", sampled(encode("x"), 0), {"assistant", "x", {}});
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_TRUE(quick.begin_call("b", messages, {}).ok()) << "idle 'a' is dropped first";
  EXPECT_TRUE(absl::IsNotFound(quick.end("a", 0).status()));
}

}  // namespace
}  // namespace relay::serve
