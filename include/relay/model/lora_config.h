#pragma once

// LoRA's options (trainer.lora), apart from lora.h so that option structs
// can hold them without LibTorch's headers.

#include <cstdint>
#include <string>
#include <vector>

#include "relay/common/problems.h"

namespace relay::model {

// trainer.lora. PEFT's LoraConfig fields r, lora_alpha, lora_dropout,
// target_modules, with PEFT's defaults (but rank 0, which means no adapters).
struct LoraConfig {
  int64_t rank = 0;    // r; 0 = off
  double alpha = 8;    // lora_alpha: the update is scaled by alpha / rank
  double dropout = 0;  // lora_dropout on the adapter's input, training passes only
  // Projection names (the last component of the module's name), or
  // "all-linear" for all seven. PEFT's default for Llama and Qwen2.
  std::vector<std::string> targets = {"q_proj", "v_proj"};

  bool enabled() const { return rank > 0; }
  double scaling() const { return alpha / static_cast<double>(rank); }
};

// The projections a target list names: q_proj, k_proj, v_proj, o_proj,
// gate_proj, up_proj, down_proj ("all-linear" = all of them; MoE experts'
// projections match by the same names, the router never).
inline const std::vector<std::string> kLoraProjections = {
    "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};

// Rules on the fields, reported as rank, alpha, dropout, targets under
// `problems` (trainer.lora.*). Nothing is checked while rank is 0.
void check(const LoraConfig& config, Problems problems);

}  // namespace relay::model
