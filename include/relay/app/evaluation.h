#pragma once

// Held-out evaluation with the rollout engine: greedy accuracy (and pass@k
// with samples) on the prompts a PromptSplit keeps out of training, and the
// training loop's Evaluator over it.

#include <cstdint>
#include <map>
#include <string>

#include "relay/app/setup.h"
#include "relay/app/training_loop.h"
#include "relay/common/metrics.h"

namespace relay::app {

struct EvalOptions {
  // Samples per prompt for pass@k at `temperature`; 0 = greedy only.
  int64_t n = 0;
  double temperature = 1.0;
  int64_t batch = 64;    // prompts generated together
  std::string progress;  // label of a progress display; empty = none
};

struct EvalResult {
  int64_t prompts = 0;
  double accuracy = 0;                  // greedy responses that are correct (rollout::is_correct)
  double reward = 0;                    // mean greedy reward
  int64_t n = 0;                        // samples per prompt behind pass_at_k
  std::map<int64_t, double> pass_at_k;  // k -> mean pass@k (k = 1, 2, 4, ..., n)
  double sample_reward = 0;             // mean reward of the samples
  // Episodes (task.environment): greedy episodes that called a tool at least
  // once and had no call refused; -1 without episodes.
  double tool_use = -1;
  // As metrics: accuracy, reward, with samples pass@<k> and sample_reward,
  // with episodes tool_use.
  std::map<std::string, double> metrics() const;
};

// Held-out evaluation with the rollout engine: each held-out prompt answered
// greedily, and with o.n > 0 also sampled n times (seeds from run.seed and
// the prompt's position, so the figures are reproducible). With
// task.environment each answer is a whole episode, run by the engine and the
// environment as in training and scored by its last model turn.
StatusOr<EvalResult> evaluate_held_out(const RolloutSetup& s, const model::Policy& policy,
                                       const PromptSplit& split, rollout::SafeVerifier& verifier,
                                       const EvalOptions& o);

// Greedy accuracy on the held-out prompts (evaluate_held_out's accuracy).
StatusOr<double> evaluate(const RolloutSetup& s, const model::Policy& policy,
                          const PromptSplit& split, rollout::SafeVerifier& verifier);

// How an evaluation is shown and recorded.
enum class EvalReport {
  // relay-trainer: "eval <label>: accuracy A on N held-out prompts[  pass@k P...]"
  // with a progress display, every EvalResult metric recorded; nothing
  // (NaN) without held-out prompts.
  kRun,
  // relay train-local: the greedy accuracy alone, in its own lines.
  kLocal,
};

// The loop's evaluations of held-out prompts, recorded as phase "eval".
class HeldOutEvaluator : public Evaluator {
 public:
  // Everything must outlive the evaluator; `options` gives n and the
  // temperature (kRun; kLocal evaluates greedily only).
  HeldOutEvaluator(const RolloutSetup& s, const PromptSplit& split, rollout::SafeVerifier* verifier,
                   MetricsSink* metrics, EvalReport report, const EvalOptions& options = {});
  StatusOr<double> evaluate(int64_t step, const std::string& label,
                            const model::Policy& policy) override;

 private:
  StatusOr<double> evaluate_local(int64_t step, const std::string& label,
                                  const model::Policy& policy);
  const RolloutSetup& s_;
  PromptSplit split_;
  rollout::SafeVerifier* verifier_;
  MetricsSink* metrics_;
  EvalReport report_;
  EvalOptions options_;
};

}  // namespace relay::app
