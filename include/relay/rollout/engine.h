#pragma once

// The rollout engine: K samples per prompt with per-token behavior log-probs
// and versions, continuous batching over a fixed set of KV-cache slots, and
// weight updates that land between decode steps (DESIGN.md invariants 1-3).
//
// One step, in order:
//   1. apply at most one pending weight update (never mid-step), as the
//      interrupt policy says (trajectory.h);
//   2. admit pending samples into free slots. Samples of one group admitted
//      together share one prefill: the first fills its slot with the prompt's
//      context, the others copy it (KVCache::copy_prefix) instead of
//      recomputing it. A later sample copies from a live sibling whose cache
//      was built by the current weights;
//   3. run the model: context (prompt prefixes, re-prefills) in one batched
//      call that fills the cache only; then every live sequence's remaining
//      tokens: one batched decode call for sequences with one new token, one
//      call with all positions' logits for sequences that must score tokens
//      (forced prefix tokens, proximal recompute);
//   4. sample one token for every live sequence in one batched call, each row
//      with its own random stream, and read the results to the host once;
//   5. retire finished sequences; their slots are free for the next step.
// A sampled token enters the cache in the next step's call, so the logits a
// token is sampled from always come from the weights of the step it is
// sampled in, and carry that step's version.
// Each is a phase over one explicit state value (src/rollout/engine_state.h).
//
// A group with greedy_baseline (ReMax) has one more sequence, queued after its
// K samples: it is scheduled, batched, shares the prompt prefill and goes
// through weight updates exactly like a sample, but step 4 picks its token by
// argmax (SamplingOptions::greedy) in a separate sampler call, concatenated
// with the sampled rows before the one read-back, and it draws nothing from
// any random stream. It comes back in TrajectoryGroup::baseline.
//
// Episodes. A group submitted with PromptGroup::episode is K multi-turn
// episodes of one task instance. When a sample of it samples a stop token,
// its model turn ends: the engine records the turn, hands a TurnEnd to the
// turn handler and parks the sequence, which keeps its slot and KV cache and
// leaves the batch while the other sequences go on decoding. reply() gives
// the environment's answer: an observation, whose tokens are appended to the
// sequence as they are (token-in/token-out: nothing is re-tokenized, so the
// trainer scores exactly the tokens the model saw) and marked as the
// environment's (Trajectory::env_mask), after which the next turn is sampled;
// or the end of the episode (stop, env_done, env_error). Limits:
// max_new_tokens per turn; EpisodeOptions::max_turns turns (an environment
// that answers the last one with an observation ends it as tool_budget);
// EpisodeOptions::max_tokens response tokens in all, observations included
// (an observation that would leave no room for a model token ends it as
// length, unappended). A turn cut short by a length limit ends the episode
// with no environment call.
//
// Weight updates reach parked sequences like any other: recompute rebuilds
// the cache (the proximal pass runs when the sequence resumes, scoring model
// tokens only), keep flags stale_kv, finish and restart apply per turn
// (finish waits only for sequences in the middle of a turn, and a parked
// sequence's cache is rebuilt under the new weights; restart drops only the
// partial turn in progress). Environment tokens carry the version held when
// they were appended and NaN log-probs.
//
// Serving (an HTTP endpoint). A group may bring its own sampling and limits
// (PromptGroup::sampling: temperature, top_k, top_p, max_new_tokens, more
// stop tokens); rows of different sampling options are drawn in one sampler
// call per distinct option set, so each sequence samples exactly what it
// would alone. A group with stream_tokens has each token handed to the token
// handler in the step that drew it, and end_sample() ends a sample from
// outside: kStop when the caller's own rule says the response is complete (a
// stop string matched in the decoded text), kAborted when nobody wants it
// any more (a client went away). The token handler runs before the next
// step, so a sample ended from it draws no further token.
//
// Threads: one thread drives step() / run(); submit(), update_weights(),
// reply(), end_sample() and abort() may be called from any thread at any
// time. The turn and token handlers run on the engine thread at the end of
// step(), outside the engine's lock, so they may call reply() or
// end_sample() themselves or hand the work to another thread and return at
// once.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include <ATen/core/Tensor.h>

#include "relay/common/status.h"
#include "relay/model/decode_graphs.h"
#include "relay/model/kv_cache.h"
#include "relay/model/policy.h"
#include "relay/rollout/engine_options.h"
#include "relay/rollout/prefix.h"
#include "relay/rollout/sampler.h"
#include "relay/rollout/trajectory.h"

namespace relay::rollout {

// Counters since construction, for metrics and tests.
struct EngineStats {
  int64_t steps = 0;
  int64_t sampled_tokens = 0;     // tokens drawn by the sampler, greedy baselines' included
  int64_t forced_tokens = 0;      // prefix tokens copied from targets and scored
  int64_t context_tokens = 0;     // positions run through the model to fill caches
  int64_t shared_prefills = 0;    // sequences (baselines too) whose prompt context was copied
  int64_t recomputed_tokens = 0;  // positions re-run by recompute after an update
  int64_t updates_applied = 0;
  // Staged versions replaced by a newer one before any step applied them
  // (update_weights on an engine holding no group).
  int64_t updates_superseded = 0;
  int64_t groups_completed = 0;
  int64_t baseline_sequences = 0;  // greedy baselines finished (aborted ones included)
  int64_t baseline_tokens = 0;     // tokens of greedy baselines (also in sampled_tokens)
  // KV cache: its size, the most positions held at once, and the steps in
  // which a waiting sequence stayed out because the budget was promised.
  int64_t kv_capacity_positions = 0;
  int64_t kv_peak_positions = 0;
  int64_t kv_bytes_per_position = 0;
  int64_t admission_waits = 0;
  // Episodes: model turns ended (handed to the turn handler), observation
  // tokens appended, and the sum over steps of sequences parked waiting for
  // an environment (their slots decoded nothing that step).
  int64_t turns_ended = 0;
  int64_t env_tokens = 0;
  int64_t parked_sequence_steps = 0;
  // rollout.decode_graphs: decode steps run in fixed shapes, and of those
  // the ones replayed from a captured CUDA graph.
  int64_t graph_steps = 0;
  int64_t graph_replays = 0;
};

// A model turn of an episode has ended (engine.h, "Episodes").
struct TurnEnd {
  std::string group_id;
  int sample = 0;  // index among the group's K samples
  int turn = 0;    // 0 for the first model turn
  // The model's tokens of this turn, its stop token last; the whole sequence
  // so far is `context` (prompt, earlier turns and observations), then these.
  std::vector<int64_t> tokens;
  std::vector<int64_t> context;
  int64_t version = 0;  // the engine's version when the turn ended
};

// The environment's answer to a TurnEnd.
struct TurnReply {
  // nullopt: the episode goes on with `observation` appended. Else how it
  // ends: kStop (the model is done: no tool call, a final answer), kEnvDone or
  // kEnvError (with `detail`).
  std::optional<FinishReason> end;
  std::vector<int64_t> observation;  // token ids; non-empty when the episode goes on
  double reward = std::numeric_limits<double>::quiet_NaN();  // for this turn; NaN = none
  std::string detail;                                        // kEnvError: what failed
  int tool_calls = 0;   // the turn's tool calls that ran (EpisodeTurn::tool_calls)
  int tool_errors = 0;  // and those refused
};
using TurnHandler = std::function<void(TurnEnd)>;

// A token a step sampled for a group with stream_tokens.
struct SampledToken {
  std::string group_id;
  int sample = 0;
  int64_t token = 0;
  float logprob = 0;    // its behavior log-prob (Trajectory::behavior_logprobs)
  int64_t version = 0;  // the weights' version that sampled it
};
using TokenHandler = std::function<void(std::vector<SampledToken>)>;

class Engine {
 public:
  // `policy` is the engine's own inference copy: update_weights() writes into
  // its parameters. `version` and `digest` describe the weights it holds now.
  static StatusOr<std::unique_ptr<Engine>> create(model::Policy policy, EngineOptions options,
                                                  int64_t version, uint64_t digest);
  ~Engine();

  // Queues a group. InvalidArgument (naming the group and field) for an empty
  // prompt, k < 1, a token outside the vocabulary, a prompt that leaves no
  // room in a sequence, a prompt whose sequences could never fit the KV
  // budget, or a duplicate group_id among groups not yet returned.
  Status submit(PromptGroup group);

  // Stages new weights, applied between two steps. `tensors` maps parameter
  // names (Hugging Face's) to values and must name every parameter with its
  // shape; dtype and device are converted. `version` must exceed the version
  // held and any version already staged. Checked here, so a bad update fails
  // at the call and changes nothing. The engine keeps the tensors until it
  // has copied them; the caller must not write to them meanwhile. An engine
  // holding no group (idle) keeps only the newest staged version: the older
  // ones would be applied to no sequence, each a copy of the weights held
  // until then (a worker without leases stages every version published). So
  // does one under InterruptPolicy::kFinish, which samples nothing before
  // the newest staged version is in.
  Status update_weights(int64_t version, uint64_t digest,
                        std::unordered_map<std::string, at::Tensor> tensors);

  // Where ended turns go; set before submitting an episode group (submit
  // refuses one otherwise) and not changed after.
  void set_turn_handler(TurnHandler handler);

  // Where streamed tokens go: every step that sampled tokens for groups with
  // stream_tokens hands them over in one call, in sampling order. Set before
  // submitting such a group (submit refuses one otherwise).
  void set_token_handler(TokenHandler handler);

  // Ends sample `sample` of `group_id` (every sample when -1) at the next
  // step, before it draws again: kStop keeps the tokens so far as the
  // complete response (as if the last one were a stop token); kAborted marks
  // it cut short. A sample not yet admitted ends with an empty response; an
  // episode waiting for its environment ends too. InvalidArgument for
  // another reason; a group no longer in flight is ignored (it finished).
  Status end_sample(const std::string& group_id, int sample, FinishReason reason);

  // Answers the TurnEnd of (group_id, sample), applied at the next step.
  // InvalidArgument for an observation id outside the vocabulary, an empty
  // observation when the episode goes on, or an `end` other than kStop,
  // kEnvDone, kEnvError; FailedPrecondition when that sample is not waiting
  // for an answer (never ended a turn, already answered, or aborted).
  Status reply(const std::string& group_id, int sample, TurnReply reply);

  // Ends every group in flight or queued at the next step: partial responses
  // finish as kAborted and are returned, nothing is dropped silently.
  void abort();

  // One engine step (see the top of this file). Returns the groups whose last
  // sample finished in this step, in completion order.
  StatusOr<std::vector<TrajectoryGroup>> step();

  // Steps until no group is queued or in flight; returns them all.
  StatusOr<std::vector<TrajectoryGroup>> run();

  bool idle() const;        // nothing queued or in flight
  int64_t version() const;  // version of the weights the next step samples with
  int64_t live_sequences() const;
  EngineStats stats() const;
  const EngineOptions& options() const { return options_; }

 private:
  // Defined in src/rollout/engine_state.h.
  struct Sequence;
  struct Group;
  struct StepState;    // what one step passes from phase to phase
  struct ContextPass;  // run_model's context phase
  struct Submission {
    PromptGroup group;
    double at_s = 0.0;  // seconds since the engine started
  };
  struct PendingReply {
    std::string group_id;
    int sample = 0;
    TurnReply reply;
  };
  struct PendingEnd {
    std::string group_id;
    int sample = -1;  // -1 = all
    FinishReason reason = FinishReason::kStop;
  };
  struct PendingUpdate {
    int64_t version = 0;
    uint64_t digest = 0;
    std::unordered_map<std::string, at::Tensor> tensors;
  };

  Engine(model::Policy policy, EngineOptions options, const model::KVCacheOptions& cache,
         int64_t version, uint64_t digest);

  // The phases of step(), in order (engine_state.h).
  // Under mu_: the submissions, the abort request and at most one update.
  void take_inputs(StepState& s);
  // The update, admission, the model pass and sampling; a model error
  // (c10::Error) is its Status.
  Status advance(StepState& s);
  // Under mu_: what other threads read (idle(), version(), stats()).
  void publish(const StepState& s);

  // Scheduling (engine_schedule.cc).
  void enqueue(Submission submission);
  bool is_stop(const Sequence& seq, int64_t token) const;
  // The sequence's response-token limit in all (Sequence::max_new_tokens per turn).
  int64_t response_budget(const Sequence& seq) const;
  // Ends what end_sample() asked for.
  void apply_end(const PendingEnd& end, double now);
  void apply_update(PendingUpdate& update);
  void reset_cache(Sequence& seq);
  // Positions `seq` may reach: prompt + max_new_tokens, within a sequence's capacity.
  int64_t reserved_positions(const Sequence& seq) const;
  void begin_response(Sequence& seq);
  void admit(double now);
  void finish(Sequence& seq, FinishReason reason, double now);
  // Episodes: ends seq's model turn at its stop token and parks it.
  void end_turn(Sequence& seq, StepState& s);
  // Applies an environment's answer to a parked sequence.
  void apply_reply(PendingReply& reply, double now);
  // kRestart: drops the partial turn in progress (the whole response outside
  // episodes) and sets the sequence to sample it again.
  void restart_turn(Sequence& seq);
  void abort_all(double now);
  void collect_done(std::vector<TrajectoryGroup>& done);

  // The model pass and sampling (engine_model.cc).
  // Every live sequence's cache up to its tokens; their next-token logits
  // into s.next_logits.
  void run_model(StepState& s);
  // Context phase, per sequence: copy a sibling's prompt context now, wait
  // to copy it from a sibling computing it in the batched call, or compute it.
  void place_context(Sequence& seq, ContextPass& ctx);
  // A live sibling whose cache holds the prompt context under the current
  // weights, or null.
  Sequence* ready_donor(const Sequence& seq) const;
  void copy_prompt_context(const Sequence& from, Sequence& seq);
  void run_context(ContextPass& ctx);
  // Every live sequence's remaining tokens: decode rows and rows to score.
  void run_new_tokens(StepState& s);
  at::Tensor extend_rows(const std::vector<Sequence*>& rows, const std::vector<int64_t>& ends,
                         model::ExtendLogits which);
  // A decode step of `rows` (one new position each) in fixed shapes; an
  // undefined tensor when graphs_ declines it.
  at::Tensor decode_in_fixed_shapes(const std::vector<Sequence*>& rows);
  // Keeps the routing of rows[b]'s new positions, [kv_len, ends[b]), before
  // kv_len moves on.
  void record_routing(const std::vector<Sequence*>& rows, const std::vector<int64_t>& ends,
                      int64_t T, model::MoeRouting& routing);
  // Gives `seq` the routing of donor's first `positions` positions it lacks.
  void share_routing(const Sequence& donor, Sequence& seq, int64_t positions);
  void record_scores(Sequence& seq, const at::Tensor& logits, int64_t start);
  void sample_and_retire(StepState& s);
  // Appends row b of the step's draws to `seq` and finishes it at a stop
  // token or its length limit.
  void append_token(Sequence& seq, int64_t b, const at::Tensor& tokens, const at::Tensor& logprobs,
                    const at::Tensor& own, const at::Tensor& raw, StepState& s);
  double seconds_since(std::chrono::steady_clock::time_point t) const;

  model::Policy policy_;
  const EngineOptions options_;
  model::KVCache cache_;
  // Decode steps in fixed shapes (rollout.decode_graphs); null = off.
  std::unique_ptr<model::DecodeGraphs> graphs_;
  const int64_t capacity_;       // positions per sequence
  const int64_t routing_width_;  // ints per position of routed_experts (0 = not recorded)
  // What a weight update must carry, by name (model::published_weights):
  // every parameter, or with LoRA adapters only the adapters, plus the
  // trainer's base digest, which must equal base_digest_. Immutable after
  // construction.
  std::map<std::string, std::vector<int64_t>> param_shapes_;
  std::optional<uint64_t> base_digest_;

  // Engine-thread state.
  int64_t version_ = 0;
  int64_t epoch_ = 0;                          // bumps whenever the weights change
  std::map<int64_t, uint64_t> digests_;        // every version held, with its digest
  std::deque<std::unique_ptr<Group>> groups_;  // not yet returned, in submission order
  std::vector<Sequence*> slots_;               // slot -> live sequence, or null
  std::deque<Sequence*> waiting_;              // samples not yet admitted, in order
  bool admission_blocked_ = false;             // the last admit() left samples waiting
  const std::chrono::steady_clock::time_point start_time_;
  EngineStats stats_;

  // Shared with other threads, under mu_.
  mutable std::mutex mu_;
  std::deque<Submission> submitted_;
  std::deque<PendingUpdate> updates_;
  int64_t staged_version_ = 0;  // highest version held or staged
  int64_t updates_superseded_ = 0;
  bool abort_requested_ = false;
  std::set<std::string> open_ids_;  // groups submitted and not yet returned
  std::deque<PendingReply> replies_;
  std::deque<PendingEnd> ends_;
  // (group id, sample) of parked sequences not yet answered.
  std::set<std::pair<std::string, int>> awaiting_;
  TurnHandler turn_handler_;
  TokenHandler token_handler_;
  // Signalled by submit, update_weights, reply and abort: step() waits on it
  // when every sequence in flight is parked.
  std::condition_variable input_cv_;
  int64_t version_snapshot_ = 0;
  int64_t live_snapshot_ = 0;
  EngineStats stats_snapshot_;
};

}  // namespace relay::rollout
