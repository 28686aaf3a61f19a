#pragma once

// What identifies one version of the weights as the trainer publishes it:
// every parameter's name, shape, dtype and size in a fixed order, and one
// digest over all their bytes (proto/relay/v1/weights.proto). Workers verify
// the digest before they swap to a version and report it in every
// trajectory's version_digests, so a trajectory names exactly the weights
// that sampled it.

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include <ATen/core/Tensor.h>

#include "relay/common/status.h"

namespace relay::model {

class PolicyImpl;

struct TensorSpec {
  std::string name;  // Hugging Face parameter name
  std::vector<int64_t> shape;
  std::string dtype;  // safetensors spelling: F32, BF16, ...
  uint64_t num_bytes = 0;
};

struct WeightManifest {
  int64_t version = 0;
  std::vector<TensorSpec> tensors;  // sorted by name
  uint64_t digest = 0;              // XXH3-64 over every tensor's bytes in this order
};

// The manifest of `tensors` (name -> tensor, any device; bytes are read in
// row-major order from a contiguous host copy). Names are sorted, so two
// processes holding the same weights agree whatever their map order.
// InvalidArgument for a dtype safetensors cannot name.
StatusOr<WeightManifest> weight_manifest(const std::unordered_map<std::string, at::Tensor>& tensors,
                                         int64_t version);
// The same with digest 0, for a caller that hashes the bytes while it copies
// them anyway (comm::WeightPublisher).
StatusOr<WeightManifest> weight_manifest_without_digest(
    const std::unordered_map<std::string, at::Tensor>& tensors, int64_t version);
// The same for a policy's parameters.
StatusOr<WeightManifest> weight_manifest(const PolicyImpl& policy, int64_t version);

}  // namespace relay::model
