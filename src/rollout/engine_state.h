#pragma once

// The rollout engine's private types: a sequence, a group, and the explicit
// state one Engine::step passes from phase to phase. Private to src/rollout.
//
// One step, in order (engine.h describes what each does; the file of each):
//   take_inputs        engine.cc           submissions, abort, the update (under mu_)
//   apply_update       engine_schedule.cc  at most one, never mid-step
//   admit              engine_schedule.cc  waiting samples into free slots
//   run_model          engine_model.cc     context, then every live sequence's new tokens
//   sample_and_retire  engine_model.cc     one token per live sequence; finished ones leave
//   collect_done       engine_schedule.cc  groups whose every sample finished
//   publish            engine.cc           the snapshots other threads read (under mu_)

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <deque>
#include <limits>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "relay/rollout/engine.h"

namespace relay::rollout {

// A per-token float not known (yet): a forced token's log-probs before it
// is scored, a proximal log-prob never recorded.
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// One sample of a group (or its greedy baseline), from admission to finish.
struct Engine::Sequence {
  Group* group = nullptr;
  bool greedy = false;  // the group's greedy baseline: argmax, never forced, no draws
  SequenceRng rng{0};
  // The engine's sampling with the group's own in place (PromptGroup::sampling);
  // greedy for the baseline. Tokens are drawn, forced tokens and proximal
  // values scored, at its temperature.
  SamplingOptions sampling;
  int64_t max_new_tokens = 0;  // per turn; the group's or the engine's
  int64_t prompt_len = 0;
  std::vector<int64_t> forced;  // prefix tokens copied from the target
  std::vector<int64_t> tokens;  // prompt + response
  Trajectory out;               // response fields, filled as tokens arrive
  // Per response token: log-prob at the sampling temperature without
  // truncation under the weights that produced the token; becomes the
  // proximal value of tokens of the version held at finish.
  std::vector<float> own_logprobs;

  int64_t slot = -1;
  int64_t kv_len = 0;     // positions in the slot's cache
  int64_t kv_epoch = -1;  // weights epoch that computed the cache (-1 = empty)
  // First index into `tokens` whose log-prob the next pass must produce
  // (forced tokens, proximal recompute); tokens.size() = none.
  int64_t score_from = 0;
  bool proximal_pass = false;  // the next pass records proximal values
  bool done = false;
  // Episodes: the group is one; index in its samples; the current model
  // turn begins at tokens[turn_start]; parked = the turn ended and the
  // sequence waits for the environment (it keeps its slot, runs nothing).
  bool episode = false;
  int sample = 0;
  int64_t turn_start = 0;
  bool parked = false;
  // MoE routing of positions [0, routing.size() / width), first run wins.
  std::vector<int32_t> routing;

  int64_t response_len() const { return static_cast<int64_t>(tokens.size()) - prompt_len; }
  int64_t turn_len() const { return static_cast<int64_t>(tokens.size()) - turn_start; }
};

struct Engine::Group {
  PromptGroup request;
  double submitted_s = 0.0;
  // Sample j at index j, then the greedy baseline if the group asked for one.
  std::vector<std::unique_ptr<Sequence>> samples;
  int finished = 0;
};

struct Engine::StepState {
  // take_inputs
  std::deque<Submission> incoming;      // submitted since the last step
  std::deque<PendingReply> replies;     // environments' answers since the last step
  std::deque<PendingEnd> ends;          // end_sample() calls since the last step
  std::optional<PendingUpdate> update;  // applied before this step's model pass
  bool abort = false;                   // abort() was called: end everything, run nothing
  bool draining = false;       // kFinish holds an update back until the sequences in flight end
  bool newer_pending = false;  // a newer version is staged too: admit nothing on this one
  double now = 0;              // seconds since the engine started, once the inputs are in
  // run_model -> sample_and_retire: the logits each live sequence samples its
  // next token from, under this step's weights.
  std::vector<std::pair<Sequence*, at::Tensor>> next_logits;
  // collect_done -> publish: the groups this step finished.
  std::vector<TrajectoryGroup> done;
  // Episode turns that ended this step, for the turn handler after publish.
  std::vector<TurnEnd> turn_ends;
  // Tokens sampled this step for groups with stream_tokens, for the token handler.
  std::vector<SampledToken> sampled;
};

// The context phase of run_model: which sequences compute their context in
// one batched call, and which copy a prompt context from a sibling instead.
struct Engine::ContextPass {
  std::vector<Sequence*> rows;  // computed in the batched call, up to `ends`
  std::vector<int64_t> ends;
  // Copy their prompt context from leader_of[slot] after the call (or have
  // copied it from a ready sibling already), then compute what remains.
  std::vector<Sequence*> followers;
  std::vector<Sequence*> leader_of;  // by slot; null = none
};

}  // namespace relay::rollout
