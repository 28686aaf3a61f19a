#include "relay/rollout/engine_options.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace relay::rollout {

void check(const SamplingOptions& s, Problems p) {
  p.positive("temperature", s.temperature);
  p.at_least("top_k", s.top_k, 0);
  if (!(s.top_p > 0 && s.top_p <= 1)) p.add("top_p", "must be in (0, 1]", s.top_p);
}

void check(const PrefixOptions& prefix, Problems p) {
  if (prefix.n_prefix < -1) p.add("n_prefix", "must be >= -1", prefix.n_prefix);
  p.in_range("min_ratio", prefix.min_ratio, 0, 1);
  if (!(prefix.max_ratio >= 0 && prefix.max_ratio <= 1)) {
    p.add("max_ratio", "must be in [0, 1]", prefix.max_ratio);
  } else if (prefix.min_ratio >= 0 && prefix.min_ratio <= 1 &&
             prefix.max_ratio < prefix.min_ratio) {
    p.add("max_ratio",
          absl::StrCat("must be >= ", p.path("min_ratio"), " (", format_double(prefix.min_ratio),
                       ")"),
          prefix.max_ratio);
  }
  p.at_least("steps", prefix.steps, 1);
  p.at_least("max_len", prefix.max_len, 0);
  if (prefix.strategy == PrefixStrategy::kFixed && prefix.share_across_group) {
    // A fixed set gives each prefixed sample its own ratio; sharing one contradicts it.
    p.add("share_across_group", "must be false with strategy 'fixed', got true");
  }
}

void check(const EpisodeOptions& e, Problems p) {
  p.at_least("max_turns", e.max_turns, 1);
  p.at_least("max_tokens", e.max_tokens, 0);
}

int64_t EngineOptions::response_budget(bool is_episode, int64_t turn_tokens) const {
  const int64_t per_turn = turn_tokens > 0 ? turn_tokens : max_new_tokens;
  if (!is_episode) return per_turn;
  return episode.max_tokens > 0 ? episode.max_tokens : episode.max_turns * per_turn;
}

void check(const EngineOptions& o, Problems p) {
  p.at_least("num_slots", o.num_slots, 1);
  p.at_least("max_seq_len", o.max_seq_len, 0);
  p.at_least("max_new_tokens", o.max_new_tokens, 1);
  check(o.sampling, p);
  p.at_least("vocab_limit", o.vocab_limit, 0);
  if (!(o.kv_cache_gb >= 0) || !std::isfinite(o.kv_cache_gb)) {
    p.add("kv_cache_gb", "must be >= 0 (0 = kv_cache_fraction of free memory)", o.kv_cache_gb);
  }
  if (!(o.kv_cache_fraction > 0 && o.kv_cache_fraction <= 1)) {
    p.add("kv_cache_fraction", "must be in (0, 1]", o.kv_cache_fraction);
  }
  p.at_least("kv_block_size", o.kv_block_size, 1);
  check(o.prefix, p.at("prefix"));
  check(o.episode, p.at("episode"));
}

}  // namespace relay::rollout
