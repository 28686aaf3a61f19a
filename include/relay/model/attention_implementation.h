#pragma once

// Which kernels compute attention (layers.h's grouped_attention), under the
// names transformers gives the same choice (`attn_implementation`):
//   eager  the explicit products: scores in fp32, softmax, then the values,
//          with the query heads folded onto their key/value head (no repeated
//          keys materialised). Keeps [B, H, T, S] probabilities for backward.
//   sdpa   at::scaled_dot_product_attention (LibTorch >= 2.0): fused kernels
//          (memory-efficient attention on CUDA, which keeps one logsumexp per
//          query for backward instead of the probabilities; a fused CPU
//          kernel). Keys and values are repeated per query head before
//          LibTorch 2.5, as transformers' repeat_kv does (enable_gqa after).
// The two agree to rounding. Decode steps on the CPU read the paged cache
// with their own kernel (decode_attention.h) whichever is chosen.
//
// Torch-free: the config names the choice (model.attn_implementation).

#include "relay/common/name_table.h"
#include "relay/common/status.h"

namespace relay::model {

enum class AttentionImplementation { kEager, kSdpa };

// model.attn_implementation: auto is sdpa where the LibTorch has it, else eager.
enum class AttentionChoice { kAuto, kEager, kSdpa };
inline const NameTable<AttentionChoice> kAttentionChoiceNames{"attention implementation",
                                                              {{"auto", AttentionChoice::kAuto},
                                                               {"eager", AttentionChoice::kEager},
                                                               {"sdpa", AttentionChoice::kSdpa}}};

bool sdpa_available();

// The process's implementation: sdpa where available until set otherwise.
AttentionImplementation attention_implementation();
// kSdpa on a LibTorch without it is refused (returns false) and leaves the
// choice as it was.
bool set_attention_implementation(AttentionImplementation implementation);
const char* attention_implementation_name(AttentionImplementation implementation);

// Sets the process's implementation from model.attn_implementation; sdpa on
// a LibTorch older than 2.0 is an error naming the key and the version.
Status apply_attention_choice(AttentionChoice choice);

}  // namespace relay::model
