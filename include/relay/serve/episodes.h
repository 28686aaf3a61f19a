#pragma once

// Episodes of the OpenAI endpoint (docs/serve.md, "Episodes"): the calls an
// agent makes under one episode id (the X-Relay-Episode-Id header) form one
// token sequence. The store keeps, per episode, the tokens so far and the
// conversation they render, so that a call whose messages extend the last
// call's conversation (its reply, then tool results or user messages) is
// answered token-in/token-out: the tokens the model sampled stay as they
// were, and only the new messages are rendered and tokenized, once, and
// appended as the environment's tokens. A call that rewrites the history
// starts the episode over.
//
// Each episode also builds its trajectory (rollout::Trajectory): the first
// call's prompt, then each call's sampled tokens with their behavior
// log-probs and versions, and the appended messages as environment tokens
// (env_mask 1, NaN log-probs), with one EpisodeTurn per call. end()
// hands it over with the reward the agent posts.
//
// Thread-safe. An episode serves one call at a time (a second one meanwhile
// is refused), and one left idle longer than idle_timeout is dropped.

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "relay/common/status.h"
#include "relay/env/tool_prompt.h"
#include "relay/model/chat_template.h"
#include "relay/model/tokenizer.h"
#include "relay/rollout/trajectory.h"

namespace relay::serve {

struct EpisodeStoreOptions {
  std::chrono::seconds idle_timeout{600};  // an episode with no call for this long is dropped
  int64_t max_episodes = 10000;            // open at once; a new one past it is refused
};

// The prompt of one call.
struct EpisodeCall {
  std::vector<int64_t> prompt;  // the whole sequence the model continues
  int64_t appended = 0;         // tokens at its end that this call's messages added
  bool continued = false;       // token-in/token-out from the episode's last call
  // The episode before this call samples: its model turns, and its response
  // tokens (turns and observations, this call's appended ones included).
  int turns = 0;
  int64_t response_tokens = 0;
};

// An ended episode.
struct EndedEpisode {
  std::string id;
  rollout::Trajectory trajectory;  // reward set when one was posted
  int calls = 0;
};

class EpisodeStore {
 public:
  EpisodeStore(EpisodeStoreOptions options, std::shared_ptr<const model::Tokenizer> tokenizer,
               model::ChatTemplate chat_template);
  ~EpisodeStore();

  // The prompt of a call in episode `id` with `messages` and `tools`:
  // continued from the episode's tokens when the messages extend its last
  // conversation, else rendered whole (a new episode, or one started over).
  // The episode is busy until finish_call or abandon_call.
  // FailedPrecondition when it is busy; ResourceExhausted when too many are
  // open; InvalidArgument (naming the message) when rendering fails.
  StatusOr<EpisodeCall> begin_call(const std::string& id,
                                   const std::vector<env::ConversationMessage>& messages,
                                   const std::vector<std::string>& tools);
  // The call's reply: its sampled tokens (one choice) and the assistant
  // message the response showed, which a later call must repeat.
  void finish_call(const std::string& id, const rollout::Trajectory& sampled,
                   env::ConversationMessage reply);
  // The call failed: the episode stays as it was before it.
  void abandon_call(const std::string& id);
  // Ends the episode with the agent's reward (NaN = none). NotFound for an
  // unknown id, FailedPrecondition while a call is in flight.
  StatusOr<EndedEpisode> end(const std::string& id, double reward);

  int64_t open() const;

 private:
  struct Episode;
  void drop_idle() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const EpisodeStoreOptions options_;
  const std::shared_ptr<const model::Tokenizer> tokenizer_;
  const model::ChatTemplate chat_template_;
  mutable std::mutex mu_;
  std::map<std::string, std::unique_ptr<Episode>> episodes_ ABSL_GUARDED_BY(mu_);
};

}  // namespace relay::serve
