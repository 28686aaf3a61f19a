#pragma once

// Model directories in Hugging Face layout: config.json, model.safetensors (or
// model-0000i-of-0000N.safetensors + model.safetensors.index.json), and the
// tokenizer file. relay reads what transformers writes and writes what
// transformers reads.

#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include "relay/common/status.h"
#include "relay/model/policy.h"

namespace relay::model {

struct LoadOptions {
  c10::ScalarType dtype = c10::ScalarType::Float;  // parameters are converted to this
  c10::Device device = c10::Device(c10::DeviceType::CPU);
};

// Builds the policy that config.json describes and fills every parameter from
// the safetensors files. A PEFT LoRA adapter directory (lora.h; one with
// adapter_config.json and no config.json) loads as its base model with the
// adapter attached. Errors name the directory and tensor: a missing
// tensor, a shape that disagrees with config.json, or a tensor the
// architecture does not have (RoPE inv_freq buffers and a duplicated tied
// lm_head are accepted and ignored).
StatusOr<Policy> load_policy(const std::string& dir, const LoadOptions& options = {});

struct SaveOptions {
  // dtype the weights are written in; Undefined = as they are in memory.
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  uint64_t max_shard_bytes = 5ull << 30;  // larger models are sharded with an index
  bool overwrite = false;                 // replace an existing directory
  // Other files written with the checkpoint (file name -> contents), e.g. the
  // tokenizer, so they appear in `dir` in the same atomic rename.
  std::map<std::string, std::string> extra_files;
  // A policy with LoRA adapters is written as a PEFT adapter directory
  // (adapter_config.json, adapter_model.safetensors) whose base model is
  // this directory; it must be set then. The base itself is not written.
  std::string lora_base;
  // More to write into the staging directory before it is renamed into
  // place (a run checkpoint's critic/ subdirectory), so it appears with the
  // rest or not at all. Null = nothing.
  std::function<Status(const std::string& staging)> write_more;
};

// Writes config.json and the weights (or, with adapters, the adapter). Everything goes to a staging
// directory first and is renamed into place, so `dir` is either the old checkpoint or the complete
// new one, never half of each.
Status save_policy(PolicyImpl& policy, const std::string& dir, const SaveOptions& options = {});

// config.json's torch_dtype spelling ("float32" | "bfloat16" | "float16") <-> ScalarType.
// (safetensors.h's dtype_name is the file format's spelling, "F32".)
StatusOr<c10::ScalarType> parse_torch_dtype(const std::string& name);
std::string torch_dtype_name(c10::ScalarType dtype);

}  // namespace relay::model
