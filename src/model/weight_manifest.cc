#include "relay/model/weight_manifest.h"

#include <torch/types.h>
#include <torch/utils.h>
#include <xxhash.h>

#include <algorithm>
#include <memory>

#include "absl/strings/str_cat.h"
#include "relay/model/policy.h"
#include "relay/model/safetensors.h"

namespace relay::model {

StatusOr<WeightManifest> weight_manifest(const std::unordered_map<std::string, at::Tensor>& tensors,
                                         int64_t version) {
  std::vector<std::string> names;
  names.reserve(tensors.size());
  for (const auto& [name, t] : tensors) names.push_back(name);
  std::sort(names.begin(), names.end());

  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state(XXH3_createState(),
                                                                 &XXH3_freeState);
  XXH3_64bits_reset(state.get());
  WeightManifest m;
  m.version = version;
  for (const std::string& name : names) {
    const at::Tensor& t = tensors.at(name);
    StatusOr<DType> dtype = from_scalar_type(t.scalar_type());
    if (!dtype.ok()) {
      return InvalidArgumentError(
          absl::StrCat("weight manifest: ", name, ": ", std::string(dtype.status().message())));
    }
    at::Tensor host = t.detach().to(torch::kCPU).contiguous();
    TensorSpec spec;
    spec.name = name;
    spec.shape.assign(t.sizes().begin(), t.sizes().end());
    spec.dtype = std::string(dtype_name(*dtype));
    spec.num_bytes = static_cast<uint64_t>(host.numel()) * host.element_size();
    XXH3_64bits_update(state.get(), host.data_ptr(), spec.num_bytes);
    m.tensors.push_back(std::move(spec));
  }
  m.digest = XXH3_64bits_digest(state.get());
  return m;
}

StatusOr<WeightManifest> weight_manifest(const PolicyImpl& policy, int64_t version) {
  std::unordered_map<std::string, at::Tensor> tensors;
  for (const auto& item : policy.named_parameters()) tensors.emplace(item.key(), item.value());
  return weight_manifest(tensors, version);
}

}  // namespace relay::model
