#pragma once

// Where the OpenAI endpoint gets its episodes inside training (docs/serve.md,
// "Inside training"): relay-rollout with rollout.agent leases prompts from
// the trainer and offers each lease's K samples as K episodes; an agent takes
// one with POST /v1/episodes, plays it through /v1/chat/completions under
// its id, and ends it with POST /v1/episodes/{id}/end. The server asks the
// source which ids are open (calls under any other id are refused) and hands
// it every ended episode.

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "relay/common/status.h"
#include "relay/model/chat_template.h"
#include "relay/serve/episodes.h"

namespace relay::serve {

// One episode an agent is given.
struct EpisodeTicket {
  std::string id;       // the X-Relay-Episode-Id of its calls
  std::string task_id;  // the task's prompt id ("arithmetic/17")
  // The task's conversation (model.system_prompt if any, then the
  // question): the messages an episode's first call starts with, its tools
  // given in the request (the chat template lists them). Every episode of a
  // group must start from the same prompt tokens: the trainer compares them.
  std::vector<model::ChatMessage> messages;
  std::string reference;  // what the task's verifier compares the answer with
  std::string group_id;   // the lease's group; `sample` of `k` in it
  int sample = 0;
  int k = 0;
  int64_t version = 0;  // the policy version when it was handed out
};

class EpisodeSource {
 public:
  virtual ~EpisodeSource() = default;
  // The next episode, waiting up to `wait` for one; nullopt when none came.
  // OutOfRange once no more will come (the run is over).
  virtual StatusOr<std::optional<EpisodeTicket>> take(std::chrono::milliseconds wait) = 0;
  // Whether `id` was handed out and has not ended or expired.
  virtual bool is_open(const std::string& id) const = 0;
  // An episode the agent ended (its trajectory, with the reward it posted).
  virtual void end(EndedEpisode episode) = 0;
};

}  // namespace relay::serve
