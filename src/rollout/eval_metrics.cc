#include "relay/rollout/eval_metrics.h"

namespace relay::rollout {

bool is_correct(const Score& score) {
  auto it = score.sub_scores.find("correct");
  if (it != score.sub_scores.end()) return it->second >= 0.5;
  return score.reward >= 1.0;
}

double pass_at_k(int64_t n, int64_t c, int64_t k) {
  if (n - c < k) return 1.0;  // every k-subset holds a correct sample
  // C(n-c, k) / C(n, k) = prod_{i = n-c+1}^{n} (1 - k / i)
  double fail = 1.0;
  for (int64_t i = n - c + 1; i <= n; ++i) fail *= 1.0 - static_cast<double>(k) / i;
  return 1.0 - fail;
}

std::vector<int64_t> pass_at_k_values(int64_t n) {
  std::vector<int64_t> ks;
  for (int64_t k = 1; k < n; k *= 2) ks.push_back(k);
  if (n >= 1) ks.push_back(n);
  return ks;
}

std::map<int64_t, double> mean_pass_at_k(const std::vector<int64_t>& correct_per_prompt,
                                         int64_t n) {
  std::map<int64_t, double> out;
  if (correct_per_prompt.empty()) return out;
  for (int64_t k : pass_at_k_values(n)) {
    double sum = 0;
    for (int64_t c : correct_per_prompt) sum += pass_at_k(n, c, k);
    out[k] = sum / static_cast<double>(correct_per_prompt.size());
  }
  return out;
}

}  // namespace relay::rollout
