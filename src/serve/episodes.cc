#include "relay/serve/episodes.h"

#include <spdlog/spdlog.h>

#include <cmath>
#include <limits>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"

namespace relay::serve {

struct EpisodeStore::Episode {
  std::vector<env::ConversationMessage> messages;  // the last call's, its reply included
  std::vector<std::string> tools;
  std::vector<int64_t> tokens;  // the whole sequence so far
  rollout::Trajectory trajectory;
  int calls = 0;
  bool busy = false;
  std::chrono::steady_clock::time_point last_used;
  // The call in flight: its prompt, its messages, and the tokens it appended.
  std::vector<int64_t> call_prompt;
  std::vector<env::ConversationMessage> call_messages;
  std::vector<std::string> call_tools;
  std::vector<int64_t> call_appended;
  bool call_fresh = false;
};

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

bool same_message(const env::ConversationMessage& a, const env::ConversationMessage& b) {
  if (a.role != b.role || a.content != b.content || a.tool_calls.size() != b.tool_calls.size()) {
    return false;
  }
  for (size_t i = 0; i < a.tool_calls.size(); ++i) {
    if (a.tool_calls[i].name != b.tool_calls[i].name ||
        a.tool_calls[i].arguments != b.tool_calls[i].arguments) {
      return false;
    }
  }
  return true;
}

// The messages that extend `before` (tool results and user messages after
// its last reply), or nullopt when `messages` does not extend it.
std::optional<std::vector<model::ChatMessage>> extension(
    const std::vector<env::ConversationMessage>& before,
    const std::vector<std::string>& tools_before,
    const std::vector<env::ConversationMessage>& messages, const std::vector<std::string>& tools) {
  if (before.empty() || tools != tools_before || messages.size() <= before.size()) {
    return std::nullopt;
  }
  for (size_t i = 0; i < before.size(); ++i) {
    if (!same_message(before[i], messages[i])) return std::nullopt;
  }
  std::vector<model::ChatMessage> rest;
  for (size_t i = before.size(); i < messages.size(); ++i) {
    const env::ConversationMessage& m = messages[i];
    if ((m.role != "tool" && m.role != "user") || !m.tool_calls.empty()) return std::nullopt;
    rest.push_back({m.role, m.content});
  }
  return rest;
}

// Appends n environment tokens (the call's new messages) at `version`.
void append_env(rollout::Trajectory& t, const std::vector<int64_t>& ids, int64_t version) {
  for (int64_t id : ids) {
    t.response_tokens.push_back(id);
    t.behavior_logprobs.push_back(kNaN);
    if (!t.raw_logprobs.empty()) t.raw_logprobs.push_back(kNaN);
    t.token_versions.push_back(version);
    t.proximal_logprobs.push_back(kNaN);
    t.proximal_versions.push_back(-1);
    t.offpolicy_mask.push_back(0);
    t.env_mask.push_back(1);
  }
}

// Appends a call's sampled response (the model's turn).
void append_model(rollout::Trajectory& t, const rollout::Trajectory& s) {
  const bool raw = !s.raw_logprobs.empty();
  if (raw && t.raw_logprobs.size() < t.response_tokens.size()) {
    t.raw_logprobs.resize(t.response_tokens.size(), kNaN);
  }
  for (size_t j = 0; j < s.response_tokens.size(); ++j) {
    t.response_tokens.push_back(s.response_tokens[j]);
    t.behavior_logprobs.push_back(s.behavior_logprobs[j]);
    if (raw) t.raw_logprobs.push_back(s.raw_logprobs[j]);
    t.token_versions.push_back(s.token_versions[j]);
    t.proximal_logprobs.push_back(s.proximal_logprobs[j]);
    t.proximal_versions.push_back(s.proximal_versions[j]);
    t.offpolicy_mask.push_back(s.offpolicy_mask[j]);
    t.env_mask.push_back(0);
  }
  std::set<std::pair<int64_t, uint64_t>> digests(t.version_digests.begin(),
                                                 t.version_digests.end());
  digests.insert(s.version_digests.begin(), s.version_digests.end());
  t.version_digests.assign(digests.begin(), digests.end());
  t.finish_reason = s.finish_reason;
  t.finish_detail = s.finish_detail;
  t.interrupt_policy = s.interrupt_policy;
  t.interruptions += s.interruptions;
  t.stale_kv = t.stale_kv || s.stale_kv;
}

// MoE: the experts each position was run with (Trajectory::routed_experts,
// one entry per position of prompt + response but the last token). A call's
// prompt is the whole episode so far, so its entry p is position p of the
// episode too. Positions an earlier call ran keep that call's routing (their
// tokens were sampled under it); this call adds the positions it ran first:
// the earlier turn's last token, the appended messages, its own turn.
void append_routing(rollout::Trajectory& t, const rollout::Trajectory& s) {
  if (s.routed_experts.empty()) return;
  const size_t stride = static_cast<size_t>(s.routing_layers) * s.routing_top_k;
  const size_t have = t.routed_experts.size();
  if (stride == 0 || have % stride != 0 || s.routed_experts.size() < have) return;
  t.routed_experts.insert(t.routed_experts.end(), s.routed_experts.begin() + have,
                          s.routed_experts.end());
  t.routing_layers = s.routing_layers;
  t.routing_top_k = s.routing_top_k;
}

}  // namespace

EpisodeStore::EpisodeStore(EpisodeStoreOptions options,
                           std::shared_ptr<const model::Tokenizer> tokenizer,
                           model::ChatTemplate chat_template)
    : options_(options), tokenizer_(std::move(tokenizer)), chat_template_(chat_template) {}

EpisodeStore::~EpisodeStore() = default;

StatusOr<EpisodeCall> EpisodeStore::begin_call(
    const std::string& id, const std::vector<env::ConversationMessage>& messages,
    const std::vector<std::string>& tools) {
  std::lock_guard<std::mutex> lock(mu_);
  drop_idle();
  auto it = episodes_.find(id);
  if (it != episodes_.end() && it->second->busy) {
    return FailedPreconditionError(absl::StrCat(
        "episode '", id, "': a call is already in flight; an episode takes one at a time"));
  }
  if (it == episodes_.end() && static_cast<int64_t>(episodes_.size()) >= options_.max_episodes) {
    return absl::ResourceExhaustedError(
        absl::StrCat(options_.max_episodes, " episodes are open; end some first"));
  }
  EpisodeCall call;
  std::vector<int64_t> appended;
  if (it != episodes_.end()) {
    Episode& e = *it->second;
    if (auto rest = extension(e.messages, e.tools, messages, tools)) {
      // The end-of-turn token ends the reply in the template; a turn cut by a
      // length limit or a stop string lacks it.
      std::string text;
      const std::optional<int64_t> eot = tokenizer_->token_id(model::end_of_turn(chat_template_));
      if (chat_template_ != model::ChatTemplate::kNone && eot && e.tokens.back() != *eot) {
        text = model::end_of_turn(chat_template_);
      }
      RELAY_ASSIGN_OR_RETURN(std::string observation,
                             env::render_observation(chat_template_, *rest));
      RELAY_ASSIGN_OR_RETURN(appended, tokenizer_->encode(text + observation));
      call.prompt = e.tokens;
      call.prompt.insert(call.prompt.end(), appended.begin(), appended.end());
      call.appended = static_cast<int64_t>(appended.size());
      call.continued = true;
      call.turns = e.calls;
      call.response_tokens =
          static_cast<int64_t>(e.trajectory.response_tokens.size() + appended.size());
    }
  }
  if (!call.continued) {
    RELAY_ASSIGN_OR_RETURN(std::string text,
                           env::render_conversation(chat_template_, messages, tools));
    RELAY_ASSIGN_OR_RETURN(call.prompt, tokenizer_->encode(text));
    if (it != episodes_.end()) {
      spdlog::info("episode '{}': the call rewrites its history; the episode starts over", id);
    }
  }
  std::unique_ptr<Episode>& e = episodes_[id];
  if (!e || !call.continued) e = std::make_unique<Episode>();
  e->busy = true;
  e->last_used = std::chrono::steady_clock::now();
  e->call_prompt = call.prompt;
  e->call_messages = messages;
  e->call_tools = tools;
  e->call_appended = std::move(appended);
  e->call_fresh = !call.continued;
  return call;
}

void EpisodeStore::finish_call(const std::string& id, const rollout::Trajectory& sampled,
                               env::ConversationMessage reply) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = episodes_.find(id);
  if (it == episodes_.end()) return;
  Episode& e = *it->second;
  rollout::Trajectory& t = e.trajectory;
  if (e.call_fresh) {
    t = rollout::Trajectory();
    t.prompt_tokens = e.call_prompt;
  } else {
    // The new messages answer the last turn: its observation.
    const int64_t version =
        sampled.token_versions.empty() ? t.token_versions.back() : sampled.token_versions.front();
    append_env(t, e.call_appended, version);
    t.turns.back().env_end = static_cast<int64_t>(t.response_tokens.size());
  }
  append_model(t, sampled);
  append_routing(t, sampled);
  const auto R = static_cast<int64_t>(t.response_tokens.size());
  // The calls the model made in this turn, as the response parsed them; the
  // agent runs them, so whether they failed is not known here.
  t.turns.push_back({R, R, std::numeric_limits<double>::quiet_NaN(),
                     static_cast<int32_t>(reply.tool_calls.size()), 0});
  e.tokens = e.call_prompt;
  e.tokens.insert(e.tokens.end(), sampled.response_tokens.begin(), sampled.response_tokens.end());
  e.messages = std::move(e.call_messages);
  e.messages.push_back(std::move(reply));
  e.tools = std::move(e.call_tools);
  ++e.calls;
  e.busy = false;
  e.last_used = std::chrono::steady_clock::now();
}

void EpisodeStore::abandon_call(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = episodes_.find(id);
  if (it == episodes_.end()) return;
  if (it->second->calls == 0 || it->second->call_fresh) {
    episodes_.erase(it);  // nothing of it stands
    return;
  }
  it->second->busy = false;
}

StatusOr<EndedEpisode> EpisodeStore::end(const std::string& id, double reward) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = episodes_.find(id);
  if (it == episodes_.end()) {
    return NotFoundError(absl::StrCat("episode '", id,
                                      "': no such episode (never started, already ended, or "
                                      "dropped after ",
                                      options_.idle_timeout.count(), " s without a call)"));
  }
  if (it->second->busy) {
    return FailedPreconditionError(
        absl::StrCat("episode '", id, "': a call is in flight; end it after the call returns"));
  }
  EndedEpisode out;
  out.id = id;
  out.calls = it->second->calls;
  out.trajectory = std::move(it->second->trajectory);
  out.trajectory.reward = reward;
  episodes_.erase(it);
  return out;
}

int64_t EpisodeStore::open() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(episodes_.size());
}

void EpisodeStore::drop_idle() {
  const auto now = std::chrono::steady_clock::now();
  for (auto it = episodes_.begin(); it != episodes_.end();) {
    if (!it->second->busy && now - it->second->last_used > options_.idle_timeout) {
      spdlog::info("episode '{}': dropped after {} s without a call", it->first,
                   options_.idle_timeout.count());
      it = episodes_.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace relay::serve
