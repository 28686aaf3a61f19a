#pragma once

// What the rollout engine consumes and produces. Plain data, no LibTorch, so
// the wire layer and the store can use it without the model.
//
// Per-token fields of a Trajectory have one entry per response token, and
// response token j sits at position P + j of prompt + response (P = prompt
// length); the logit that scored it is at position P - 1 + j (DESIGN.md
// invariant 4).

#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "relay/common/name_table.h"
#include "relay/common/status.h"

namespace relay::rollout {

// How a response (or an episode: engine.h, "Episodes") ended.
enum class FinishReason {
  kStop,     // a stop token was sampled (it is the last response token); in an
             // episode, the environment had nothing more to say to the model
  kLength,   // max_new_tokens, the episode's token budget or the slot's capacity was reached
  kAborted,  // the engine was told to abort; the response is partial
  // Episodes only.
  kToolBudget,  // the model asked for more after rollout.episode.max_turns turns
  kEnvDone,     // the environment ended the episode
  kEnvError,    // the environment failed (Trajectory::finish_detail says how)
};
// "stop" | "length" | "aborted" | "tool_budget" | "env_done" | "env_error"
const char* finish_reason_name(FinishReason reason);

// What happens to sequences in flight when new weights arrive (AReaL's
// partial rollout and its alternatives). The one applied is recorded on each
// trajectory.
enum class InterruptPolicy {
  // Re-prefill every live sequence (prompt + response so far) under the new
  // weights, rebuilding its KV cache; the same pass records the proximal
  // log-prob of each response token whose version is new_version - 1. Default.
  kRecompute,
  // Keep decoding on the KV cache built by the old weights, now with the new
  // weights (PRIME-RL). Trajectories that did are flagged (stale_kv).
  kKeep,
  // Finish every sequence in flight on the old weights, then switch; no new
  // sequence starts meanwhile. Every response has a single version.
  kFinish,
  // Drop the partial response and sample it again from the prompt.
  kRestart,
};
inline const NameTable<InterruptPolicy> kInterruptPolicyNames{
    "interrupt policy",
    {{"recompute", InterruptPolicy::kRecompute},
     {"keep", InterruptPolicy::kKeep},
     {"finish", InterruptPolicy::kFinish},
     {"restart", InterruptPolicy::kRestart}}};

// A group's own sampling and limits in place of the engine's (an OpenAI
// request's temperature, top_p, max_tokens; relay/rollout/engine.h). Unset
// fields take the engine's value; the engine's raw-log-prob recording and its
// stop tokens always apply.
struct GroupSampling {
  std::optional<double> temperature;  // > 0
  std::optional<int64_t> top_k;       // >= 0; 0 = off
  std::optional<double> top_p;        // in (0, 1]
  bool greedy = false;  // argmax (OpenAI's temperature 0); see SamplingOptions::greedy
  // Response tokens per sample (per turn in an episode); 0 = the engine's
  // max_new_tokens. May exceed it: the KV budget reserves what the group asks.
  int64_t max_new_tokens = 0;
  std::vector<int64_t> stop_tokens;  // ids that also end this group's samples
};

// One prompt and how to sample it.
struct PromptGroup {
  std::string group_id;         // caller's id, echoed on the result
  std::vector<int64_t> prompt;  // token ids, non-empty
  int k = 1;                    // samples to draw
  // Off-policy target solution (token ids) for prefix-guided sampling; empty
  // = none. Which samples start from a prefix of it is the engine's prefix
  // schedule (prefix.h).
  std::vector<int64_t> target;
  uint64_t seed = 0;  // sample j draws from SequenceRng(sequence_seed(seed, j))
  // Training step the prefix schedule is evaluated at; -1 = the engine's
  // policy version when the group is submitted.
  int64_t prefix_step = -1;
  // ReMax (arXiv 2310.10505): also decode one greedy (argmax) response to the
  // prompt, whose reward is the baseline for the K samples. It has the same
  // max_new_tokens and stop tokens, shares the group's prompt prefill, is
  // never prefix-forced (`target` is not used for it), draws nothing from the
  // samples' random streams, and goes through weight updates like any other
  // sequence. It comes back in TrajectoryGroup::baseline, not among the
  // samples.
  bool greedy_baseline = false;
  // A multi-turn episode (engine.h, "Episodes"): each sample's stop token
  // ends a model turn, not the response, and the sample waits for the
  // environment's answer. Not with greedy_baseline.
  bool episode = false;
  GroupSampling sampling;  // the group's own sampling and limits, if any
  // Hand each token sampled for this group to the engine's token handler as
  // it is drawn (Engine::set_token_handler), for a caller that streams them.
  bool stream_tokens = false;
};

// One model turn of an episode and the environment's answer to it. Response
// tokens [start, model_end) are the model's, where start is the previous
// turn's env_end (0 for the first), and [model_end, env_end) the
// environment's observation (empty after the last turn).
struct EpisodeTurn {
  int64_t model_end = 0;
  int64_t env_end = 0;
  // The environment's reward for this turn; NaN when it gave none.
  double reward = std::numeric_limits<double>::quiet_NaN();
  // Tool calls in this turn that ran, and those the environment refused
  // (malformed, an unknown tool, a bad argument): env::EnvStep's counts.
  int32_t tool_calls = 0;
  int32_t tool_errors = 0;
};

struct Trajectory {
  std::vector<int64_t> prompt_tokens;
  std::vector<int64_t> response_tokens;
  // log pi_behavior(token): for sampled tokens, read from the distribution
  // the token was drawn from (temperature-scaled, top-k/top-p truncated,
  // renormalised); for forced prefix tokens, the policy's log-prob at the
  // sampling temperature without truncation.
  std::vector<float> behavior_logprobs;
  // log p(token) at temperature 1 without truncation, under the same weights;
  // empty unless the engine records raw log-probs.
  std::vector<float> raw_logprobs;
  // Policy version that produced each token; non-decreasing.
  std::vector<int64_t> token_versions;
  // Proximal log-prob of each token at the sampling temperature, untruncated,
  // under weights proximal_versions[j]: token_versions[j] + 1 when an update
  // landed while the sequence was in flight and the recompute pass scored it;
  // token_versions[j] for tokens of the last version the engine held when the
  // sequence finished (the trainer's proximal policy if it is still at that
  // version). NaN, with version -1, where neither is known (e.g. after `keep`).
  std::vector<float> proximal_logprobs;
  std::vector<int64_t> proximal_versions;
  std::vector<uint8_t> offpolicy_mask;  // 1 = forced token copied from the target
  // Episodes: 1 = the token came from the environment (a tool's output, an
  // observation), appended as given, never sampled. Such a token has NaN
  // behavior, raw and proximal log-probs (proximal version -1), is not
  // forced, carries the version the engine held when it was appended, and is
  // masked out of the loss. Empty = every token is the model's (single turn).
  std::vector<uint8_t> env_mask;
  // Episodes: the turns, in order; the last one's env_end is the response
  // length. Empty for a single-turn response.
  std::vector<EpisodeTurn> turns;
  FinishReason finish_reason = FinishReason::kLength;
  // Why the environment failed (kEnvError), else "".
  std::string finish_detail;
  InterruptPolicy interrupt_policy = InterruptPolicy::kRecompute;  // the engine's policy
  int interruptions = 0;      // weight updates applied while this sequence was in flight
  bool stale_kv = false;      // kKeep: some tokens were sampled over a KV cache from older weights
  int restarts = 0;           // kRestart: times the partial response was dropped
  double prefix_ratio = 0.0;  // ratio drawn by the prefix schedule (0 = on-policy sample)
  // (version, digest of that version's weights) for every version named in
  // token_versions or proximal_versions, ascending.
  std::vector<std::pair<int64_t, uint64_t>> version_digests;
  // Wall-clock seconds from submission: admitted to a slot, first sampled
  // token, finished.
  double admitted_s = 0.0;
  double first_token_s = 0.0;
  double finished_s = 0.0;
  // The verifier's score, set by whoever scores the response (the engine does
  // not); NaN until then, so an unscored trajectory cannot pass for reward 0.
  double reward = std::numeric_limits<double>::quiet_NaN();
  std::map<std::string, double> sub_scores;
  // MoE models (router replay): the experts each router chose, captured when
  // the engine ran each position and never recomputed, like the behavior
  // log-probs. Flattened [P + R - 1, routing_layers, routing_top_k]: entry p
  // is for the input token at position p of prompt + response (the last
  // response token is never run), so the distribution response token j was
  // sampled from came from entry P - 1 + j. A position run again after a
  // weight update keeps the routing of its first run, which produced the
  // tokens after it. Empty for dense models.
  std::vector<int32_t> routed_experts;
  int32_t routing_layers = 0;  // MoE layers of the model
  int32_t routing_top_k = 0;   // experts per token
  // On-policy distillation (trainer.distill; rollout/teacher.h): log
  // q_teacher(token) of each response token at temperature 1, untruncated,
  // over the student's vocabulary, scored by the teacher model once the
  // response finished; NaN for environment tokens. Empty when no teacher
  // scored it. teacher_digest names the teacher's weights (the manifest
  // digest, as version_digests does for the policy); 0 when none.
  std::vector<float> teacher_logprobs;
  uint64_t teacher_digest = 0;

  int64_t num_forced() const;      // number of offpolicy_mask entries set
  int64_t num_env_tokens() const;  // number of env_mask entries set
  bool is_env_token(size_t j) const { return j < env_mask.size() && env_mask[j] != 0; }
  // What a verifier scores: the last model turn's tokens for an episode (its
  // final answer), the whole response otherwise.
  std::vector<int64_t> answer_tokens() const;
  // The sum of the environment's finite turn rewards (0 when none).
  double environment_reward() const;
};

struct TrajectoryGroup {
  std::string group_id;
  // The K sampled responses, sample j at index j; never the greedy baseline.
  std::vector<Trajectory> trajectories;
  // The greedy response when the group asked for one (greedy_baseline), else
  // empty. Not a training sample: its reward is the group's baseline (verl's
  // `reward_baselines`), NaN until scored like any other. Its tokens are the
  // argmax of the policy's logits, so its behavior_logprobs are the sampler's
  // greedy record: log p(token) at temperature 1 without truncation (the
  // raw_logprobs value, which it also carries when raw log-probs are
  // recorded), not a log-prob under the sampling temperature. Proximal values,
  // versions and interruption fields mean what they mean for a sample;
  // offpolicy_mask is all 0 and prefix_ratio 0.
  std::optional<Trajectory> baseline;
};

// Checks the per-token invariants: every per-token field sized like the
// response, versions non-decreasing, proximal_versions in {-1, v, v + 1},
// behavior log-probs <= 0 or NaN (missing), digests for every version used,
// routed_experts empty or sized (P + R - 1) x layers x top_k with ids >= 0;
// env_mask empty or sized like the response, its tokens with no log-prob and
// not forced, and the turns covering the response in order, agreeing with it.
// Names the field and index of the first violation.
// `max_behavior_logprob` is the ceiling on behavior log-probs: 0, or a
// caller's tolerance for rounding when it has already refused values above
// it and will clamp the rest (comm::validate_submission), so that it need
// not check a clamped copy of the whole trajectory.
Status check_trajectory(const Trajectory& t, float max_behavior_logprob = 0.0f);

}  // namespace relay::rollout
