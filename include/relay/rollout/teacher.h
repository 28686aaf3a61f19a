#pragma once

// On-policy distillation's teacher (trainer.distill; docs/algorithms.md,
// "On-policy distillation"). A frozen model with the student's tokenizer
// scores every sampled response where it was sampled, once the response is
// finished: the rollout worker before it submits a group, or train-local's
// in-process source. Its log-prob of each response token is then part of
// the stored trajectory (Trajectory::teacher_logprobs), so what the student
// was pulled towards can be audited after the run, and the trainer needs no
// copy of the teacher.
//
// The teacher's distribution is Thinking Machines' (tinker-cookbook's
// compute_logprobs): temperature 1, no top-k / top-p, over the student's
// vocabulary (ids [0, vocab_limit)). Scoring is a forward pass over prompt +
// response without a KV cache, batched by tokens; it never samples.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "relay/common/status.h"
#include "relay/rollout/trajectory.h"

namespace relay::model {
class PolicyImpl;
class Tokenizer;
}  // namespace relay::model

namespace relay::rollout {

struct TeacherOptions {
  // Ids [0, vocab_limit) are the support of the teacher's softmax: the
  // student's tokenizer vocabulary, which is what the student samples from.
  // 0 = every id of the teacher's model.
  int64_t vocab_limit = 0;
  // Tokens per forward pass, counted as rows x the longest row (padding
  // included); a longer sequence is scored alone.
  int64_t batch_tokens = 8192;
};

// Statistics of the scoring so far (one Teacher, all calls).
struct TeacherStats {
  int64_t responses = 0;
  int64_t tokens = 0;  // prompt + response tokens run through the teacher
  int64_t passes = 0;  // forward passes
  double seconds = 0;  // wall time spent scoring
};

class Teacher {
 public:
  // `model` is frozen here (no gradients, eval mode). `digest` names its
  // weights (model::weight_manifest) and is stamped on every trajectory
  // scored. REQUIRES: model non-null.
  Teacher(std::shared_ptr<model::PolicyImpl> model, uint64_t digest, TeacherOptions options);
  ~Teacher();

  // Fills teacher_logprobs and teacher_digest of every sample of every
  // group. The greedy baselines (ReMax) are never trained on and are left
  // alone. Environment tokens get NaN. InvalidArgument, naming the group,
  // when a sequence is longer than the teacher's context or holds an id
  // outside its vocabulary; nothing is written then.
  Status score(std::vector<TrajectoryGroup>& groups);
  // The same for trajectories given one by one (`names` for errors).
  Status score(const std::vector<Trajectory*>& trajectories, const std::vector<std::string>& names);

  uint64_t digest() const { return digest_; }
  const model::PolicyImpl& model() const { return *model_; }
  const TeacherStats& stats() const { return stats_; }

 private:
  std::shared_ptr<model::PolicyImpl> model_;
  uint64_t digest_ = 0;
  TeacherOptions options_;
  TeacherStats stats_;
};

// Why a student with tokenizer `student` cannot learn from a teacher with
// `teacher`, or nullopt when the two are the same tokenizer: the same
// vocabulary size, special ids (eos, bos, pad), the text of every id, and
// the ids of a probe text. Distillation compares log-probs of the same ids,
// so any difference would pull the student towards the wrong tokens.
std::optional<std::string> tokenizer_difference(const model::Tokenizer& student,
                                                const model::Tokenizer& teacher);

}  // namespace relay::rollout
