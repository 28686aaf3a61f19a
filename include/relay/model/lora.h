#pragma once

// LoRA adapters (Hu et al. 2021), with PEFT's semantics and file layout.
//
// A targeted projection W (layers.h, Projection) computes
//   y = x W^T + b + B(A(dropout(x))) * alpha / rank
// with A [rank, in] drawn as PEFT draws it (torch's kaiming_uniform_ with
// a = sqrt(5), i.e. U(-1/sqrt(in), 1/sqrt(in))) and B [out, rank] zero, so a
// fresh adapter leaves the model exactly as it was. Every other parameter
// (embeddings, norms, LM head, the projections' own W and b) is frozen: the
// optimizer never sees it, and the base model, adapters switched off, is the
// KL reference.
//
// Files: a PEFT adapter directory, adapter_config.json plus
// adapter_model.safetensors whose tensors are named as PEFT saves them,
// base_model.model.<parameter name> (model.layers.0.self_attn.q_proj.lora_A.weight
// -> base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight).
// Supported: PEFT's plain LoRA (no DoRA, rsLoRA, bias training, per-layer
// rank or alpha patterns, modules_to_save); anything else is refused by
// name when read.

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <ATen/core/Tensor.h>

#include "relay/common/status.h"
#include "relay/model/lora_config.h"

namespace relay::model {

class PolicyImpl;
class Policy;

// Gives each targeted projection of `policy` an adapter in its weights'
// dtype and device (A from a CPU generator seeded with `seed`, in parameter
// order; B zero) and freezes every other parameter.
// FailedPrecondition when the policy already has adapters;
// InvalidArgument for a config check() rejects.
Status attach_lora(PolicyImpl& policy, const LoraConfig& config, uint64_t seed);

// True when any projection carries an adapter.
bool has_lora(const PolicyImpl& policy);
// The config the policy's adapters were attached with (nullopt: none).
std::optional<LoraConfig> lora_config(const PolicyImpl& policy);
// Names of the adapter parameters (…lora_A.weight, …lora_B.weight), sorted.
std::vector<std::string> adapter_names(const PolicyImpl& policy);

// The name of the one tensor of a LoRA weight version that is not a
// parameter: the base weights' digest (int64 [1], the XXH3-64 bits of
// base_digest()), so a worker whose base differs from the trainer's refuses
// the version instead of sampling from a different model.
inline constexpr char kBaseDigestTensor[] = "relay.lora.base_digest";
// XXH3-64 over every frozen (non-adapter) parameter, in weight_manifest()'s
// order and bytes.
StatusOr<uint64_t> base_digest(const PolicyImpl& policy);

// What one weight version ships to rollout workers, detached host-or-device
// copies by name: every parameter, or with adapters only the adapter
// matrices plus kBaseDigestTensor (the base never changes in a LoRA run).
// `base_digest_cache` (may be null) keeps the base digest between calls, so
// hashing the base happens once per process, not per version.
StatusOr<std::unordered_map<std::string, at::Tensor>> published_weights(
    const PolicyImpl& policy, std::optional<uint64_t>* base_digest_cache = nullptr);

// While alive, every adapter of `policy` is switched off: the policy
// computes as its base model does (the KL reference).
class AdaptersDisabled {
 public:
  explicit AdaptersDisabled(PolicyImpl& policy);
  ~AdaptersDisabled();
  AdaptersDisabled(const AdaptersDisabled&) = delete;
  AdaptersDisabled& operator=(const AdaptersDisabled&) = delete;

 private:
  PolicyImpl& policy_;
};

// A policy without adapters whose parameters share `policy`'s base tensors
// (no copy): the base model, to save or to serve as it is.
Policy base_policy(const PolicyImpl& policy);
// A policy without adapters holding the merged weights (merged_weights())
// where `policy` has adapters and sharing its other tensors.
Policy merged_policy(const PolicyImpl& policy);

// W + scaling * B A for every adapted projection of `policy`, by the
// projection weight's name, computed in fp32 and returned in W's dtype
// (PEFT's merge_and_unload()). The policy is not changed.
std::unordered_map<std::string, at::Tensor> merged_weights(const PolicyImpl& policy);

// PEFT's two files for `policy`'s adapters, written into the existing
// directory `dir`: adapter_config.json (base_model_name_or_path =
// `base_model`) and adapter_model.safetensors (in the adapters' dtype, or
// `dtype` when defined). FailedPrecondition without adapters.
Status write_peft_adapter(const PolicyImpl& policy, const std::string& dir,
                          const std::string& base_model,
                          c10::ScalarType dtype = c10::ScalarType::Undefined);

// A PEFT adapter directory as read: its config, its base model path and its
// tensors under relay's parameter names.
struct PeftAdapter {
  LoraConfig config;
  std::string base_model;  // base_model_name_or_path, relative paths resolved against `dir`
  std::unordered_map<std::string, at::Tensor> tensors;  // CPU
};
// True when `dir` holds adapter_config.json.
bool is_peft_adapter_dir(const std::string& dir);
// Errors name the file and field (an unsupported PEFT option, a tensor name
// outside base_model.model.*).
StatusOr<PeftAdapter> read_peft_adapter(const std::string& dir);
// Copies the adapter's tensors into `policy`'s adapters, which must be
// exactly those tensors by name and shape (errors name `dir` and the tensor).
Status load_adapter_tensors(PolicyImpl& policy, const PeftAdapter& adapter, const std::string& dir);

}  // namespace relay::model
