#pragma once

// The critic of PPO with a value model: the policy's architecture with a
// scalar head where the LM head was, as transformers builds
// <Arch>ForTokenClassification with num_labels = 1 (the model verl's critic
// loads): V at every position from the final hidden state through `score`,
// Linear(hidden, 1) with a bias.
//
// Alignment as the policy's log-probs (policy.h): the value at position t is
// that of the state after tokens[0..t], from which token t + 1 is drawn, so
// for prompt length P response token j gets the value at P - 1 + j (verl:
// values[:, -R - 1 : -1]); trainer::gather_response lays it out.
//
// Directories: load_value_model reads a critic directory (one with
// score.weight) or a causal LM (its decoder; the head is then initialised
// from a seed, as transformers initialises a new classification head), so a
// critic starts from the policy's own checkpoint. save_value_model writes a
// directory transformers loads as <Arch>ForTokenClassification.

#include <cstdint>
#include <string>

#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include "relay/common/status.h"
#include "relay/model/checkpoint.h"
#include "relay/model/policy.h"

namespace relay::model {

class ValueModelImpl : public torch::nn::Module {
 public:
  // REQUIRES: validate(config).ok(). Placeholder weights until
  // init_value_head/a load fills them.
  explicit ValueModelImpl(const PolicyConfig& config);

  // The architecture's config (as the policy it was built from: untied
  // embeddings stay untied in what is saved, though the critic has no LM head).
  const PolicyConfig& config() const { return config_; }

  // Values [B, T - 1], fp32, for positions 0..T-2 (position t: the state
  // after tokens[0..t]); padding positions (t >= lengths[b] - 1) are 0.
  // `sequence_starts` packs rows as ScoreOptions has it. Differentiable.
  at::Tensor values(const at::Tensor& input_ids, const at::Tensor& lengths = {},
                    const at::Tensor& sequence_starts = {});

  void set_activation_checkpointing(bool on) { trunk_->set_activation_checkpointing(on); }
  // The decoder run as the policy runs it (RoPE, masks, checkpointing, layer hooks).
  PolicyImpl& trunk() { return *trunk_; }

  Decoder model{nullptr};            // "model.*": shared with trunk()
  torch::nn::Linear score{nullptr};  // "score.weight" [1, H], "score.bias" [1]

 private:
  PolicyConfig config_;
  Policy trunk_;  // tied config: no LM head of its own; not a registered child
};
TORCH_MODULE(ValueModel);

// The value head from a seed: weight N(0, initializer_range), bias 0 (as
// transformers' _init_weights for a new Linear), drawn on the CPU in fp32.
void init_value_head(ValueModelImpl& critic, uint64_t seed, double initializer_range = 0.02);

// A critic over a copy of `policy`'s decoder weights (its LM head left out)
// with the head from init_value_head(seed), on the policy's device and in
// its dtype: verl's default critic, initialised from the actor's checkpoint.
// REQUIRES: `policy` carries no LoRA adapters.
ValueModel value_model_from_policy(const PolicyImpl& policy, uint64_t seed);

// A critic directory, or a causal LM's whose decoder it takes and whose
// lm_head it ignores, with the head from init_value_head(seed). Errors name
// the directory and tensor as load_policy's do.
StatusOr<ValueModel> load_value_model(const std::string& dir, const LoadOptions& options = {},
                                      uint64_t seed = 0);

// config.json (architectures <Arch>ForTokenClassification, num_labels 1) and
// the weights, through a staging directory as save_policy does.
// SaveOptions::lora_base is not used (a critic has no adapters).
Status save_value_model(ValueModelImpl& critic, const std::string& dir,
                        const SaveOptions& options = {});

}  // namespace relay::model
