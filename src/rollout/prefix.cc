#include "relay/rollout/prefix.h"

#include <algorithm>
#include <cmath>

#include "relay/rollout/sampler.h"

namespace relay::rollout {

StatusOr<PrefixOptions> prefix_options(const PrefixConfig& config) {
  PrefixOptions o;
  static const std::pair<const char*, PrefixStrategy> kNames[] = {
      {"random", PrefixStrategy::kRandom},
      {"linear", PrefixStrategy::kLinear},
      {"linear_max", PrefixStrategy::kLinearMax},
      {"reverse_linear", PrefixStrategy::kReverseLinear},
      {"fixed", PrefixStrategy::kFixed}};
  bool found = false;
  for (const auto& [name, strategy] : kNames) {
    if (config.strategy == name) {
      o.strategy = strategy;
      found = true;
    }
  }
  if (!found) {
    return InvalidArgumentError(
        absl::StrCat("rollout.prefix.strategy: unknown strategy '", config.strategy, "'"));
  }
  if (config.n_prefix < -1) {
    return InvalidArgumentError(
        absl::StrCat("rollout.prefix.n_prefix: must be >= -1, got ", config.n_prefix));
  }
  if (!(config.min_ratio >= 0 && config.max_ratio <= 1 && config.min_ratio <= config.max_ratio)) {
    return InvalidArgumentError(
        absl::StrCat("rollout.prefix: need 0 <= min_ratio <= max_ratio <= 1, got min_ratio ",
                     config.min_ratio, " and max_ratio ", config.max_ratio));
  }
  if (config.steps < 1) {
    return InvalidArgumentError(
        absl::StrCat("rollout.prefix.steps: must be >= 1, got ", config.steps));
  }
  if (config.max_len < 0) {
    return InvalidArgumentError(
        absl::StrCat("rollout.prefix.max_len: must be >= 0, got ", config.max_len));
  }
  if (o.strategy == PrefixStrategy::kFixed && config.share_across_group) {
    return InvalidArgumentError(
        "rollout.prefix.share_across_group: must be false with strategy 'fixed'");
  }
  o.n_prefix = config.n_prefix;
  o.min_ratio = config.min_ratio;
  o.max_ratio = config.max_ratio;
  o.steps = config.steps;
  o.share_across_group = config.share_across_group;
  o.max_len = config.max_len;
  return o;
}

const char* prefix_strategy_name(PrefixStrategy strategy) {
  switch (strategy) {
    case PrefixStrategy::kRandom:
      return "random";
    case PrefixStrategy::kLinear:
      return "linear";
    case PrefixStrategy::kLinearMax:
      return "linear_max";
    case PrefixStrategy::kReverseLinear:
      return "reverse_linear";
    case PrefixStrategy::kFixed:
      return "fixed";
  }
  return "?";
}

namespace {

// Which tenth of the schedule step s falls in: 0..9 (9 from `steps` on).
int64_t window(int64_t step, int64_t steps) {
  if (step <= 0) return 0;
  return std::min<int64_t>(9, (step * 10) / steps);
}

// One draw of the strategy's ratio (every strategy but fixed).
double draw(const PrefixOptions& o, int64_t step, SequenceRng& rng) {
  const double lo = o.min_ratio, span = o.max_ratio - o.min_ratio;
  switch (o.strategy) {
    case PrefixStrategy::kRandom:
      return lo + span * rng.uniform();
    case PrefixStrategy::kLinear: {
      const double progress =
          std::min(1.0, static_cast<double>(std::max<int64_t>(step, 0)) / o.steps);
      return o.max_ratio - span * progress;
    }
    case PrefixStrategy::kLinearMax:
      return lo + span * (10 - window(step, o.steps)) / 10.0 * rng.uniform();
    case PrefixStrategy::kReverseLinear:
      return lo + span * (window(step, o.steps) + 1) / 10.0 * rng.uniform();
    case PrefixStrategy::kFixed:
      break;
  }
  return lo;
}

}  // namespace

std::vector<double> prefix_ratios(const PrefixOptions& o, int k, int64_t step, uint64_t seed) {
  std::vector<double> ratios(std::max(k, 0), 0.0);
  const int n = o.n_prefix < 0 ? k : std::min(o.n_prefix, k);
  if (n <= 0) return ratios;
  SequenceRng rng(seed);
  if (o.strategy == PrefixStrategy::kFixed) {
    for (int i = 0; i < n; ++i) {
      ratios[i] = n == 1
                      ? o.min_ratio
                      : o.min_ratio + (o.max_ratio - o.min_ratio) * i / static_cast<double>(n - 1);
    }
    return ratios;
  }
  // The first draw is the group's shared ratio; without sharing it is unused,
  // and each prefixed sample draws its own from the same stream.
  const double shared = draw(o, step, rng);
  for (int i = 0; i < n; ++i) ratios[i] = o.share_across_group ? shared : draw(o, step, rng);
  return ratios;
}

int64_t prefix_length(double ratio, int64_t target_len, int64_t max_len) {
  if (!(ratio > 0) || target_len <= 0) return 0;
  const auto n = static_cast<int64_t>(std::floor(std::min(ratio, 1.0) * target_len));
  return std::min(n, max_len);
}

}  // namespace relay::rollout
