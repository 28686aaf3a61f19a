#include "relay/model/weight_manifest.h"

#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <memory>

#include "absl/strings/str_cat.h"
#include "relay/common/xxh3.h"
#include "relay/model/policy.h"
#include "relay/model/safetensors.h"

namespace relay::model {

StatusOr<WeightManifest> weight_manifest_without_digest(
    const std::unordered_map<std::string, at::Tensor>& tensors, int64_t version) {
  std::vector<std::string> names;
  names.reserve(tensors.size());
  for (const auto& [name, t] : tensors) names.push_back(name);
  std::sort(names.begin(), names.end());

  WeightManifest m;
  m.version = version;
  for (const std::string& name : names) {
    const at::Tensor& t = tensors.at(name);
    StatusOr<DType> dtype = from_scalar_type(t.scalar_type());
    if (!dtype.ok()) {
      return InvalidArgumentError(
          absl::StrCat("weight manifest: ", name, ": ", std::string(dtype.status().message())));
    }
    TensorSpec spec;
    spec.name = name;
    spec.shape.assign(t.sizes().begin(), t.sizes().end());
    spec.dtype = std::string(dtype_name(*dtype));
    spec.num_bytes = static_cast<uint64_t>(t.numel()) * t.element_size();
    m.tensors.push_back(std::move(spec));
  }
  return m;
}

StatusOr<WeightManifest> weight_manifest(const std::unordered_map<std::string, at::Tensor>& tensors,
                                         int64_t version) {
  RELAY_ASSIGN_OR_RETURN(WeightManifest m, weight_manifest_without_digest(tensors, version));
  Xxh3Stream state;
  for (const TensorSpec& spec : m.tensors) {
    at::Tensor host = tensors.at(spec.name).detach().to(torch::kCPU).contiguous();
    state.update(host.data_ptr(), spec.num_bytes);
  }
  m.digest = state.digest();
  return m;
}

StatusOr<WeightManifest> weight_manifest(const PolicyImpl& policy, int64_t version) {
  std::unordered_map<std::string, at::Tensor> tensors;
  for (const auto& item : policy.named_parameters()) tensors.emplace(item.key(), item.value());
  return weight_manifest(tensors, version);
}

}  // namespace relay::model
