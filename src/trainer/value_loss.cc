// The critic's clipped value loss (relay/trainer/value_loss.h).

#include "relay/trainer/value_loss.h"

#include <torch/types.h>
#include <torch/utils.h>

#include <limits>

#include "trainer/policy_loss_internal.h"

namespace relay::trainer {

using internal::as_bool;
using internal::fraction;
using internal::masked_mean;

ValueLossResult value_loss(const at::Tensor& values, const at::Tensor& old_values,
                           const at::Tensor& returns, const at::Tensor& response_mask,
                           const ValueLossOptions& options, const GlobalNormalizer& normalizer) {
  const at::Tensor m = as_bool(response_mask);
  const at::Tensor old = old_values.detach();
  const at::Tensor ret = returns.detach();
  const at::Tensor clipped =
      torch::max(torch::min(values, old + options.clip_range), old - options.clip_range);
  const at::Tensor l1 = (values - ret).pow(2);
  const at::Tensor l2 = (clipped - ret).pow(2);
  ValueLossResult r;
  r.loss = 0.5 * aggregate_loss(torch::max(l1, l2), m, options.agg_mode, normalizer);
  r.clip_fraction = fraction(l2.detach().gt(l1.detach()), m);
  r.value_mean = masked_mean(values, m);
  return r;
}

double explained_variance(const at::Tensor& values, const at::Tensor& returns,
                          const at::Tensor& response_mask) {
  torch::NoGradGuard no_grad;
  const at::Tensor m = as_bool(response_mask);
  const at::Tensor v = values.detach().to(torch::kFloat64).masked_select(m);
  const at::Tensor ret = returns.detach().to(torch::kFloat64).masked_select(m);
  constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  if (ret.numel() < 2) return kNaN;
  const double var_returns = ret.var(/*unbiased=*/true).item<double>();
  if (!(var_returns > 0)) return kNaN;
  return 1.0 - (ret - v).var(/*unbiased=*/true).item<double>() / var_returns;
}

}  // namespace relay::trainer
