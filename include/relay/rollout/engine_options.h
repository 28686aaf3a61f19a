#pragma once

// The generation engine's options (relay/rollout/engine.h) and the sampler's,
// with their rules. No LibTorch: the config layer binds the `rollout:`
// section's engine keys straight onto EngineOptions (relay/rollout/option_keys.h),
// and the same check() runs in Engine::create, so each rule is stated once.
// Keys in problems are the section's flat YAML keys ("temperature", not
// "sampling.temperature").

#include <cstdint>
#include <optional>
#include <vector>

#include "relay/common/name_table.h"
#include "relay/common/problems.h"
#include "relay/model/precision.h"
#include "relay/rollout/trajectory.h"

namespace relay::rollout {

struct SamplingOptions {
  double temperature = 1.0;          // > 0; logits are divided by it
  int64_t top_k = 0;                 // keep the k most likely tokens; 0 = off
  double top_p = 1.0;                // keep the smallest set with mass >= top_p; 1 = off
  bool greedy = false;               // argmax; the recorded log-prob is then raw_logprobs' value
  bool record_raw_logprobs = false;  // also return log p(token) at temperature 1, untruncated
};

// How a prefix ratio is drawn (relay/rollout/prefix.h has the formulas).
enum class PrefixStrategy { kRandom, kLinear, kLinearMax, kReverseLinear, kFixed };
inline const NameTable<PrefixStrategy> kPrefixStrategyNames{
    "prefix strategy",
    {{"random", PrefixStrategy::kRandom},
     {"linear", PrefixStrategy::kLinear},
     {"linear_max", PrefixStrategy::kLinearMax},
     {"reverse_linear", PrefixStrategy::kReverseLinear},
     {"fixed", PrefixStrategy::kFixed}}};

// Prefix-guided (off-policy) sampling, as in LUFFY: some of a group's samples
// start from a forced prefix of the prompt's target solution. The prefix
// length is floor(ratio x target length), capped at max_len.
struct PrefixOptions {
  int n_prefix = 0;  // samples per group given a prefix; -1 = all K; 0 = off
  PrefixStrategy strategy = PrefixStrategy::kRandom;
  double min_ratio = 0.0;  // ratios lie in [min_ratio, max_ratio] within [0, 1]
  double max_ratio = 0.8;
  int64_t steps = 300;              // training steps over which linear schedules move
  bool share_across_group = false;  // one ratio for all prefixed samples of a group
  int64_t max_len = 8192;           // at most this many forced tokens
};

// Multi-turn episodes (engine.h, "Episodes"): the limits on a group submitted
// with PromptGroup::episode. max_new_tokens bounds each model turn.
struct EpisodeOptions {
  int64_t max_turns = 4;  // model turns; an environment that asks for more ends it as tool_budget
  // Response tokens of an episode, the model's and the environment's
  // together (the KV budget reserves prompt + this much); 0 = max_turns x
  // max_new_tokens.
  int64_t max_tokens = 0;
};

// rollout.dtype: the precision the engine holds its weights in, and so
// runs its products, activations and KV cache in; `model` keeps the
// policy's (model.dtype). vLLM's `dtype`, less its `auto` (the checkpoint's
// torch_dtype): relay's model.dtype is already the policy's precision.
enum class EngineDtype { kModel, kFloat32, kBFloat16, kFloat16 };
inline const NameTable<EngineDtype> kEngineDtypeNames{"dtype",
                                                      {{"model", EngineDtype::kModel},
                                                       {"float32", EngineDtype::kFloat32},
                                                       {"bfloat16", EngineDtype::kBFloat16},
                                                       {"float16", EngineDtype::kFloat16}}};

// The precision rollout.dtype names; none for `model` (the policy's own).
inline std::optional<model::Precision> engine_precision(EngineDtype dtype) {
  switch (dtype) {
    case EngineDtype::kFloat32:
      return model::Precision::kFloat32;
    case EngineDtype::kBFloat16:
      return model::Precision::kBFloat16;
    case EngineDtype::kFloat16:
      return model::Precision::kFloat16;
    case EngineDtype::kModel:
      break;
  }
  return std::nullopt;
}

// rollout.decode_graphs: decode steps in fixed shapes, replayed as CUDA
// graphs (model/decode_graphs.h). auto = on a CUDA device, where the
// model's dense layers allow it; on = also on the CPU, without a graph (the
// fixed-shape step eagerly, which gains nothing: for tests), and an
// error where the model does not allow it; off = never.
enum class DecodeGraphMode { kAuto, kOn, kOff };
inline const NameTable<DecodeGraphMode> kDecodeGraphModeNames{"decode_graphs",
                                                              {{"auto", DecodeGraphMode::kAuto},
                                                               {"on", DecodeGraphMode::kOn},
                                                               {"off", DecodeGraphMode::kOff}}};

struct EngineOptions {
  int64_t num_slots = 64;       // sequences decoding at once, at most
  int64_t max_seq_len = 0;      // positions per sequence; 0 = the model's max_position_embeddings
  int64_t max_new_tokens = 32;  // response tokens per sample, forced prefix included
  SamplingOptions sampling;     // greedy is allowed (evaluation)
  std::vector<int64_t> stop_tokens;  // a sampled stop token ends its sequence and is kept
  InterruptPolicy interrupt = InterruptPolicy::kRecompute;
  PrefixOptions prefix;
  // The model's forward passes under autocast in this precision (run.autocast).
  model::Autocast autocast = model::Autocast::kNone;
  // The weights' precision in the engine (rollout.dtype): Engine::create
  // converts its policy, and update_weights() converts every version as it
  // lands, so a trainer in fp32 can feed an engine in bf16. Log-probs come
  // from fp32 logits either way; they are the lower-precision model's
  // (Trajectory::behavior_logprobs), and the trainer's mismatch metrics
  // measure how far they are from its own.
  EngineDtype dtype = EngineDtype::kModel;
  // rollout.fp32_lm_head: with weights in bf16 or fp16 (rollout.dtype or
  // model.dtype), the logits are computed in fp32 from an fp32 LM head
  // (model::PolicyImpl::set_fp32_lm_head), kept from the fp32 weights the
  // engine was given and refreshed from every fp32 version that lands, so
  // they are not rounded to bf16 (about 0.4% of a logit's size). Like
  // SGLang's enable_fp32_lm_head, which widens the model-precision head it
  // holds; relay keeps the trainer's own fp32 values when it receives them.
  // Costs an fp32 copy of the head. No effect when the weights are fp32.
  bool fp32_lm_head = false;
  // Ids [0, vocab_limit) may be sampled: the tokenizer's vocabulary, when the
  // model's embedding is padded past it (Qwen2.5: 151,936 rows for 151,665
  // tokens). The rest are outside the sampling distribution, which is
  // renormalised over the support; the trainer scores over the same support
  // (model::ScoreOptions::vocab_limit). 0 = every id of the model.
  int64_t vocab_limit = 0;
  // KV-cache memory in GiB; 0 = the smaller of num_slots x max_seq_len
  // positions and kv_cache_fraction of the memory free on the model's device
  // when the engine is created. Sequences are admitted while the budget can
  // hold prompt + max_new_tokens for each; the others wait.
  double kv_cache_gb = 0;
  double kv_cache_fraction = 0.5;  // (0, 1]; used when kv_cache_gb is 0
  int64_t kv_block_size = 16;      // positions per KV-cache block
  DecodeGraphMode decode_graphs = DecodeGraphMode::kAuto;
  // MoE models: record each position's routing into the trajectories
  // (Trajectory::routed_experts), for router replay in the trainer.
  bool record_routing = true;
  EpisodeOptions episode;

  // Response tokens one sequence may reach: its turn limit (turn_tokens, or
  // max_new_tokens when 0), or an episode's token budget.
  int64_t response_budget(bool episode, int64_t turn_tokens = 0) const;
};

// The rules on each, every broken one reported. What depends on the model
// (stop tokens and vocab_limit within its vocabulary, a KV budget that holds
// one sequence) is checked by Engine::create.
void check(const SamplingOptions& options, Problems problems);
void check(const PrefixOptions& options, Problems problems);
void check(const EpisodeOptions& options, Problems problems);
void check(const EngineOptions& options, Problems problems);

}  // namespace relay::rollout
