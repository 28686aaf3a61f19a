#include "relay/rollout/teacher.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "relay/model/policy.h"
#include "relay/model/tokenizer.h"
#include "relay/model/torch_error.h"

namespace relay::rollout {

Teacher::Teacher(std::shared_ptr<model::PolicyImpl> model, uint64_t digest, TeacherOptions options)
    : model_(std::move(model)), digest_(digest), options_(options) {
  for (at::Tensor& p : model_->parameters()) p.set_requires_grad(false);
  model_->eval();
}

Teacher::~Teacher() = default;

Status Teacher::score(std::vector<TrajectoryGroup>& groups) {
  std::vector<Trajectory*> all;
  std::vector<std::string> names;
  for (TrajectoryGroup& g : groups) {
    for (size_t i = 0; i < g.trajectories.size(); ++i) {
      all.push_back(&g.trajectories[i]);
      names.push_back(absl::StrCat("group '", g.group_id, "' trajectories[", i, "]"));
    }
  }
  return score(all, names);
}

Status Teacher::score(const std::vector<Trajectory*>& trajectories,
                      const std::vector<std::string>& names) {
  const auto start = std::chrono::steady_clock::now();
  const model::PolicyConfig& config = model_->config();
  const size_t n = trajectories.size();
  std::vector<int64_t> length(n);
  for (size_t i = 0; i < n; ++i) {
    const Trajectory& t = *trajectories[i];
    length[i] = static_cast<int64_t>(t.prompt_tokens.size() + t.response_tokens.size());
    const std::string& name = i < names.size() ? names[i] : "a trajectory";
    if (length[i] > config.max_position_embeddings) {
      return InvalidArgumentError(
          absl::StrCat("trainer.distill.teacher: ", name, " has ", length[i],
                       " tokens, more than the teacher's context (max_position_embeddings ",
                       config.max_position_embeddings, ")"));
    }
    for (const auto* ids : {&t.prompt_tokens, &t.response_tokens}) {
      for (int64_t id : *ids) {
        if (id < 0 || id >= config.vocab_size) {
          return InvalidArgumentError(absl::StrCat("trainer.distill.teacher: ", name, ": token id ",
                                                   id, " is outside the teacher's vocabulary [0, ",
                                                   config.vocab_size, ")"));
        }
      }
    }
  }
  // Longest first, so each pass's first row fixes its width.
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return length[a] > length[b]; });
  at::Tensor weight = model_->parameters().front();
  const c10::Device device = weight.device();
  model::ScoreOptions so;
  so.temperature = 1.0;
  so.vocab_limit = options_.vocab_limit;
  // Written into the trajectories only once every pass succeeded.
  std::vector<std::vector<float>> scored(n);
  size_t next = 0;
  while (next < n) {
    const int64_t width = length[order[next]];
    const int64_t rows = std::max<int64_t>(1, options_.batch_tokens / std::max<int64_t>(1, width));
    const size_t end = std::min(n, next + static_cast<size_t>(rows));
    const auto B = static_cast<int64_t>(end - next);
    at::Tensor ids = torch::zeros({B, width}, torch::kInt64);
    at::Tensor lengths = torch::empty({B}, torch::kInt64);
    // The positions read below (the model's response tokens): the LM head
    // skips prompts and environment tokens.
    at::Tensor read = torch::zeros({B, std::max<int64_t>(0, width - 1)}, torch::kBool);
    auto ids_a = ids.accessor<int64_t, 2>();
    auto read_a = read.accessor<bool, 2>();
    for (int64_t b = 0; b < B; ++b) {
      const Trajectory& t = *trajectories[order[next + b]];
      int64_t k = 0;
      for (int64_t id : t.prompt_tokens) ids_a[b][k++] = id;
      for (int64_t id : t.response_tokens) ids_a[b][k++] = id;
      lengths[b] = k;
      const auto P = static_cast<int64_t>(t.prompt_tokens.size());
      for (size_t j = 0; j < t.response_tokens.size(); ++j) {
        const int64_t at = P - 1 + static_cast<int64_t>(j);
        if (at >= 0 && !t.is_env_token(j)) read_a[b][at] = true;
      }
    }
    so.scored = read;
    at::Tensor logprobs;
    try {
      torch::NoGradGuard no_grad;
      logprobs = model_->score(ids.to(device), lengths.to(device), so)
                     .to(torch::kCPU, torch::kFloat32)
                     .contiguous();
    } catch (const std::exception& e) {
      // Out of memory among them: the pass is B x width tokens.
      return InternalError(absl::StrCat("trainer.distill.teacher: scoring ", B,
                                        " sequences of up to ", width,
                                        " tokens failed: ", model::exception_message(e)));
    }
    auto lp = logprobs.accessor<float, 2>();
    for (int64_t b = 0; b < B; ++b) {
      const size_t i = order[next + b];
      const Trajectory& t = *trajectories[i];
      const auto P = static_cast<int64_t>(t.prompt_tokens.size());
      std::vector<float>& out = scored[i];
      out.resize(t.response_tokens.size());
      for (size_t j = 0; j < out.size(); ++j) {
        // Response token j is scored at position P - 1 + j (invariant 4);
        // without a prompt the first has no position (nothing predicts it)
        // and, like environment tokens, no teacher score.
        const int64_t at = P - 1 + static_cast<int64_t>(j);
        out[j] = t.is_env_token(j) || at < 0 ? std::numeric_limits<float>::quiet_NaN() : lp[b][at];
      }
    }
    stats_.tokens += ids.size(0) > 0 ? lengths.sum().item<int64_t>() : 0;
    ++stats_.passes;
    next = end;
  }
  for (size_t i = 0; i < n; ++i) {
    trajectories[i]->teacher_logprobs = std::move(scored[i]);
    trajectories[i]->teacher_digest = digest_;
  }
  stats_.responses += static_cast<int64_t>(n);
  stats_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return OkStatus();
}

std::optional<std::string> tokenizer_difference(const model::Tokenizer& student,
                                                const model::Tokenizer& teacher) {
  if (student.vocab_size() != teacher.vocab_size()) {
    return absl::StrCat("the student's tokenizer has ", student.vocab_size(),
                        " tokens, the teacher's ", teacher.vocab_size());
  }
  const std::pair<const char*, std::pair<int64_t, int64_t>> specials[] = {
      {"eos", {student.eos_id(), teacher.eos_id()}},
      {"bos", {student.bos_id(), teacher.bos_id()}},
      {"pad", {student.pad_id(), teacher.pad_id()}}};
  for (const auto& [name, ids] : specials) {
    if (ids.first != ids.second) {
      return absl::StrCat("the ", name, " id is ", ids.first, " for the student, ", ids.second,
                          " for the teacher");
    }
  }
  for (int64_t id = 0; id < student.vocab_size(); ++id) {
    StatusOr<std::string> a = student.decode({id});
    StatusOr<std::string> b = teacher.decode({id});
    // A byte-level piece that is not whole UTF-8 fails to decode alone: the
    // same failure on both sides is agreement.
    if (a.ok() != b.ok() || (a.ok() && *a != *b)) {
      return absl::StrCat("token ", id, " is '", a.ok() ? *a : "(no text)", "' for the student, '",
                          b.ok() ? *b : "(no text)", "' for the teacher");
    }
  }
  // The merges decide how text splits; a probe of digits, words, spaces and
  // multi-byte text catches a tokenizer with the same pieces merged otherwise.
  const std::string probe =
      "The answer: 12+345=357.\n  Let's think\tstep by step. \xc3\xa9t\xc3\xa9";
  StatusOr<std::vector<int64_t>> a = student.encode(probe);
  StatusOr<std::vector<int64_t>> b = teacher.encode(probe);
  if (a.ok() != b.ok() || (a.ok() && *a != *b)) {
    return std::string("the two tokenizers split the same text into different ids");
  }
  return std::nullopt;
}

}  // namespace relay::rollout
