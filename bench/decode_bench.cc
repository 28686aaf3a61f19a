// Decode throughput of the KV-cache path against a baseline measured in the
// same run: re-running the full forward over the whole sequence every step
// (what a cache-less sampler does). Both produce the same tokens (greedy), so
// the ratio is the speed-up the cache buys at this size.
//
//   decode_bench [--batch 8] [--prompt 32] [--new 64] [--layers 4] [--hidden 256] [--reps 3]

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "relay/model/kv_cache.h"
#include "relay/model/policy.h"

namespace {

using Clock = std::chrono::steady_clock;
using relay::model::KVCache;
using relay::model::Policy;

int64_t arg(int argc, char** argv, const char* name, int64_t fallback) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], name) == 0) return std::atoll(argv[i + 1]);
  }
  return fallback;
}

// Returns seconds; writes the generated tokens to *out.
double decode_cached(Policy& p, const at::Tensor& prompt, int64_t steps, at::Tensor* out) {
  const int64_t B = prompt.size(0), P = prompt.size(1);
  auto start = Clock::now();
  KVCache cache(p->config(), B, P + steps, torch::kFloat32, torch::kCPU);
  at::Tensor slots = torch::arange(B);
  at::Tensor logits = p->extend(prompt, torch::full({B}, P, torch::kInt64), slots, cache);
  std::vector<at::Tensor> tokens;
  for (int64_t s = 0; s < steps; ++s) {
    at::Tensor next = logits.argmax(-1);
    tokens.push_back(next);
    if (s + 1 < steps)
      logits = p->extend(next.view({B, 1}), torch::ones({B}, torch::kInt64), slots, cache);
  }
  *out = torch::stack(tokens, 1);
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double decode_recompute(Policy& p, const at::Tensor& prompt, int64_t steps, at::Tensor* out) {
  auto start = Clock::now();
  at::Tensor seq = prompt;
  for (int64_t s = 0; s < steps; ++s) {
    at::Tensor next = p->forward(seq).select(1, seq.size(1) - 1).argmax(-1);
    seq = torch::cat({seq, next.view({-1, 1})}, 1);
  }
  *out = seq.narrow(1, prompt.size(1), steps);
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t B = arg(argc, argv, "--batch", 8), P = arg(argc, argv, "--prompt", 32);
  const int64_t N = arg(argc, argv, "--new", 64), reps = arg(argc, argv, "--reps", 3);
  relay::model::PolicyConfig c;
  c.vocab_size = 1024;
  c.hidden_size = arg(argc, argv, "--hidden", 256);
  c.intermediate_size = c.hidden_size * 8 / 3;
  c.num_hidden_layers = arg(argc, argv, "--layers", 4);
  c.num_attention_heads = 8;
  c.num_key_value_heads = 4;
  c.max_position_embeddings = P + N;
  Policy policy(c);
  relay::model::init_weights(*policy, 0);
  policy->eval();
  torch::NoGradGuard no_grad;
  at::Tensor prompt = torch::randint(c.vocab_size, {B, P}, torch::kInt64);

  std::vector<double> cached, recompute;
  at::Tensor a, b;
  for (int64_t r = 0; r < reps; ++r) {  // interleaved, so drift hits both alike
    cached.push_back(decode_cached(policy, prompt, N, &a));
    recompute.push_back(decode_recompute(policy, prompt, N, &b));
  }
  const bool same = torch::equal(a, b);
  const double tc = median(cached), tr = median(recompute);
  std::printf(
      "decode_bench: batch %lld, prompt %lld, new %lld, layers %lld, hidden %lld, threads %d\n",
      (long long)B, (long long)P, (long long)N, (long long)c.num_hidden_layers,
      (long long)c.hidden_size, at::get_num_threads());
  std::printf("  kv-cache   %8.1f tokens/s  (median of %lld, %.3f s)\n", B * N / tc,
              (long long)reps, tc);
  std::printf("  recompute  %8.1f tokens/s  (baseline, %.3f s)\n", B * N / tr, tr);
  std::printf("  speed-up   %8.2fx   same tokens: %s\n", tr / tc, same ? "yes" : "NO");
  return same ? 0 : 1;
}
