#include "relay/rollout/prefix.h"

#include <algorithm>
#include <cmath>

#include "relay/rollout/sampler.h"

namespace relay::rollout {

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
