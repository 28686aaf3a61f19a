// The entropy bonus (relay/trainer/policy_loss.h): per-token entropy from
// the logits, the bonus as a loss term, and the controller that adapts its
// coefficient toward a target entropy.

#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <vector>

#include "relay/trainer/policy_loss.h"
#include "trainer/policy_loss_internal.h"

namespace relay::trainer {

using internal::as_bool;

at::Tensor entropy_from_logits(const at::Tensor& logits, const at::Tensor& response_mask,
                               int64_t chunk_size) {
  TORCH_CHECK(logits.dim() == 3, "entropy_from_logits: logits must be [B, L, V], got ",
              logits.sizes());
  TORCH_CHECK(chunk_size > 0, "entropy_from_logits: chunk_size must be > 0");
  const int64_t b = logits.size(0), l = logits.size(1), v = logits.size(2);
  at::Tensor flat = logits.reshape({b * l, v});
  at::Tensor idx = as_bool(response_mask).reshape({b * l}).nonzero().squeeze(1);
  at::Tensor out = torch::zeros({b * l}, logits.options().dtype(torch::kFloat32));
  if (idx.numel() == 0) return out.reshape({b, l}) + 0.0 * logits.sum(-1).to(torch::kFloat32);
  std::vector<at::Tensor> parts;
  for (int64_t start = 0; start < idx.numel(); start += chunk_size) {
    at::Tensor rows = idx.slice(0, start, std::min(start + chunk_size, idx.numel()));
    at::Tensor z = flat.index_select(0, rows).to(torch::kFloat32);
    at::Tensor log_p = torch::log_softmax(z, -1);
    // H = logsumexp(z) - sum p z = -sum p log p.
    parts.push_back(-(log_p.exp() * log_p).sum(-1));
  }
  return out.scatter(0, idx, torch::cat(parts)).reshape({b, l});
}

at::Tensor entropy_bonus_loss(const at::Tensor& entropy, const at::Tensor& response_mask,
                              double coef, LossAggMode agg_mode,
                              const GlobalNormalizer& normalizer) {
  return -coef * aggregate_loss(entropy, response_mask, agg_mode, normalizer);
}

// ------------------------------------------------------------ entropy control

EntropyController::EntropyController(const EntropyControlOptions& options)
    : options_(options), value_(options.coef) {}

double EntropyController::coef_for(double entropy) const {
  if (options_.target <= 0) return value_;
  return entropy < options_.target ? value_ : 0.0;
}

void EntropyController::update(double entropy) {
  if (options_.target <= 0) return;
  const double step = entropy < options_.target ? options_.delta : -options_.delta;
  value_ = std::clamp(value_ + step, 0.0, options_.max_coef);
}

}  // namespace relay::trainer
