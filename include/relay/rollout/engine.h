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
// Threads: one thread drives step() / run(); submit(), update_weights() and
// abort() may be called from any thread at any time.

#include <chrono>
#include <cstdint>
#include <deque>
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
  int64_t groups_completed = 0;
  int64_t baseline_sequences = 0;  // greedy baselines finished (aborted ones included)
  int64_t baseline_tokens = 0;     // tokens of greedy baselines (also in sampled_tokens)
  // KV cache: its size, the most positions held at once, and the steps in
  // which a waiting sequence stayed out because the budget was promised.
  int64_t kv_capacity_positions = 0;
  int64_t kv_peak_positions = 0;
  int64_t kv_bytes_per_position = 0;
  int64_t admission_waits = 0;
};

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
  // has copied them; the caller must not write to them meanwhile.
  Status update_weights(int64_t version, uint64_t digest,
                        std::unordered_map<std::string, at::Tensor> tensors);

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
  bool is_stop(int64_t token) const;
  void apply_update(PendingUpdate& update);
  void reset_cache(Sequence& seq);
  // Positions `seq` may reach: prompt + max_new_tokens, within a sequence's capacity.
  int64_t reserved_positions(const Sequence& seq) const;
  void begin_response(Sequence& seq);
  void admit(double now);
  void finish(Sequence& seq, FinishReason reason, double now);
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
                    const at::Tensor& own, const at::Tensor& raw, double now);
  double seconds_since(std::chrono::steady_clock::time_point t) const;

  model::Policy policy_;
  const EngineOptions options_;
  model::KVCache cache_;
  const int64_t capacity_;       // positions per sequence
  const int64_t routing_width_;  // ints per position of routed_experts (0 = not recorded)
  std::map<std::string, std::vector<int64_t>> param_shapes_;  // immutable after construction

  // Engine-thread state.
  int64_t version_ = 0;
  int64_t epoch_ = 0;                          // bumps whenever the weights change
  std::map<int64_t, uint64_t> digests_;        // every version held, with its digest
  std::deque<std::unique_ptr<Group>> groups_;  // not yet returned, in submission order
  std::vector<Sequence*> slots_;               // slot -> live sequence, or null
  std::deque<Sequence*> waiting_;              // samples not yet admitted, in order
  const std::chrono::steady_clock::time_point start_time_;
  EngineStats stats_;

  // Shared with other threads, under mu_.
  mutable std::mutex mu_;
  std::deque<Submission> submitted_;
  std::deque<PendingUpdate> updates_;
  int64_t staged_version_ = 0;  // highest version held or staged
  bool abort_requested_ = false;
  std::set<std::string> open_ids_;  // groups submitted and not yet returned
  int64_t version_snapshot_ = 0;
  int64_t live_snapshot_ = 0;
  EngineStats stats_snapshot_;
};

}  // namespace relay::rollout
