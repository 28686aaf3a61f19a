#include "relay/model/lora.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "relay/common/file_io.h"
#include "relay/model/layers.h"
#include "relay/model/policy.h"
#include "relay/model/safetensors.h"
#include "relay/model/weight_manifest.h"

namespace relay::model {
namespace fs = std::filesystem;
namespace {

constexpr char kAdapterConfigFile[] = "adapter_config.json";
constexpr char kAdapterWeightsFile[] = "adapter_model.safetensors";
// PEFT saves a causal LM's adapter tensors under the PeftModel's prefix.
constexpr char kPeftPrefix[] = "base_model.model.";

// The module name's last component ("model.layers.0.self_attn.q_proj" -> "q_proj").
std::string last_component(const std::string& name) {
  const size_t dot = name.rfind('.');
  return dot == std::string::npos ? name : name.substr(dot + 1);
}

bool is_adapter_parameter(const std::string& name) {
  return absl::StrContains(name, ".lora_A.") || absl::StrContains(name, ".lora_B.");
}

// Every projection of the policy by module name, in registration order.
std::vector<std::pair<std::string, ProjectionImpl*>> projections(const PolicyImpl& policy) {
  std::vector<std::pair<std::string, ProjectionImpl*>> out;
  for (const auto& item : policy.named_modules("", /*include_self=*/false)) {
    if (auto* p = item.value()->as<ProjectionImpl>()) out.emplace_back(item.key(), p);
  }
  return out;
}

std::set<std::string> expand_targets(const std::vector<std::string>& targets) {
  std::set<std::string> out;
  for (const std::string& t : targets) {
    if (t == "all-linear") {
      out.insert(kLoraProjections.begin(), kLoraProjections.end());
    } else {
      out.insert(t);
    }
  }
  return out;
}

}  // namespace

Status attach_lora(PolicyImpl& policy, const LoraConfig& config, uint64_t seed) {
  Problems problems("trainer.lora");
  check(config, problems);
  if (!problems.empty()) return problems.status();
  if (!config.enabled()) return InvalidArgumentError("trainer.lora.rank: 0 attaches no adapter");
  if (has_lora(policy)) {
    return FailedPreconditionError("LoRA: the policy already has adapters");
  }
  const std::set<std::string> targets = expand_targets(config.targets);
  std::vector<ProjectionImpl*> adapted;
  for (const auto& [name, p] : projections(policy)) {
    if (targets.count(last_component(name)) == 0) continue;
    p->add_adapter(config.rank, config.scaling(), config.dropout);
    adapted.push_back(p);
  }
  if (adapted.empty()) {
    return InvalidArgumentError(absl::StrCat("trainer.lora.targets: no projection of the model is ",
                                             absl::StrJoin(config.targets, " or ")));
  }
  // PEFT's init_lora_weights=True: A as nn.Linear's default (kaiming_uniform_
  // with a = sqrt(5), which is U(-1/sqrt(in), 1/sqrt(in))), B zero.
  torch::NoGradGuard no_grad;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  for (ProjectionImpl* p : adapted) {
    at::Tensor& a = p->lora_A->weight;
    const double bound = 1.0 / std::sqrt(static_cast<double>(a.size(1)));
    a.copy_(torch::empty(a.sizes(), torch::kFloat32).uniform_(-bound, bound, gen));
  }
  for (auto& item : policy.named_parameters()) {
    item.value().set_requires_grad(is_adapter_parameter(item.key()));
  }
  return OkStatus();
}

bool has_lora(const PolicyImpl& policy) {
  for (const auto& [name, p] : projections(policy)) {
    if (p->has_adapter()) return true;
  }
  return false;
}

std::optional<LoraConfig> lora_config(const PolicyImpl& policy) {
  std::optional<LoraConfig> out;
  std::set<std::string> names;
  for (const auto& [name, p] : projections(policy)) {
    if (!p->has_adapter()) continue;
    if (!out) {
      out.emplace();
      out->rank = p->lora_A->weight.size(0);
      out->alpha = p->scaling() * static_cast<double>(out->rank);
      out->dropout = p->dropout();
    }
    names.insert(last_component(name));
  }
  if (out) {
    out->targets.clear();
    for (const std::string& t : kLoraProjections) {
      if (names.count(t)) out->targets.push_back(t);
    }
  }
  return out;
}

std::vector<std::string> adapter_names(const PolicyImpl& policy) {
  std::vector<std::string> out;
  for (const auto& item : policy.named_parameters()) {
    if (is_adapter_parameter(item.key())) out.push_back(item.key());
  }
  std::sort(out.begin(), out.end());
  return out;
}

StatusOr<uint64_t> base_digest(const PolicyImpl& policy) {
  std::unordered_map<std::string, at::Tensor> base;
  for (const auto& item : policy.named_parameters()) {
    if (!is_adapter_parameter(item.key())) base.emplace(item.key(), item.value());
  }
  RELAY_ASSIGN_OR_RETURN(WeightManifest m, weight_manifest(base, 0));
  return m.digest;
}

StatusOr<std::unordered_map<std::string, at::Tensor>> published_weights(
    const PolicyImpl& policy, std::optional<uint64_t>* base_digest_cache) {
  if (!has_lora(policy)) return parameter_tensors(policy);
  std::optional<uint64_t> local;
  std::optional<uint64_t>& digest = base_digest_cache != nullptr ? *base_digest_cache : local;
  if (!digest) {
    RELAY_ASSIGN_OR_RETURN(uint64_t d, base_digest(policy));
    digest = d;
  }
  std::unordered_map<std::string, at::Tensor> out;
  for (const auto& item : policy.named_parameters()) {
    if (is_adapter_parameter(item.key())) out[item.key()] = item.value().detach().clone();
  }
  out[kBaseDigestTensor] = torch::tensor({static_cast<int64_t>(*digest)}, torch::kInt64);
  return out;
}

AdaptersDisabled::AdaptersDisabled(PolicyImpl& policy) : policy_(policy) {
  for (const auto& [name, p] : projections(policy_)) p->set_adapter_enabled(false);
}

AdaptersDisabled::~AdaptersDisabled() {
  for (const auto& [name, p] : projections(policy_)) p->set_adapter_enabled(true);
}

std::unordered_map<std::string, at::Tensor> merged_weights(const PolicyImpl& policy) {
  torch::NoGradGuard no_grad;
  std::unordered_map<std::string, at::Tensor> out;
  for (const auto& [name, p] : projections(policy)) {
    if (!p->has_adapter()) continue;
    const at::Tensor& w = p->weight;
    at::Tensor delta = torch::matmul(p->lora_B->weight.to(torch::kFloat32),
                                     p->lora_A->weight.to(torch::kFloat32)) *
                       p->scaling();
    out[name + ".weight"] = (w.to(torch::kFloat32) + delta).to(w.scalar_type());
  }
  return out;
}

Policy base_policy(const PolicyImpl& policy) {
  Policy base(policy.config());
  torch::NoGradGuard no_grad;
  const auto from = policy.named_parameters();
  for (auto& item : base->named_parameters()) {
    item.value().set_data(from[item.key()].detach());
    item.value().set_requires_grad(true);
  }
  base->eval();
  return base;
}

Policy merged_policy(const PolicyImpl& policy) {
  Policy merged = base_policy(policy);
  torch::NoGradGuard no_grad;
  auto params = merged->named_parameters();
  for (auto& [name, w] : merged_weights(policy)) params[name].set_data(w);
  return merged;
}

// ---------------------------------------------------------------------------
// PEFT's files.

Status write_peft_adapter(const PolicyImpl& policy, const std::string& dir,
                          const std::string& base_model, c10::ScalarType dtype) {
  const std::optional<LoraConfig> config = lora_config(policy);
  if (!config) return FailedPreconditionError("LoRA: the policy has no adapters to write");
  auto number = [](double x) {
    return x == std::floor(x) && std::abs(x) < 1e15 ? nlohmann::json(static_cast<int64_t>(x))
                                                    : nlohmann::json(x);
  };
  // PEFT's LoraConfig as save_pretrained writes it, for the options relay
  // has; the rest at PEFT's defaults, which is what relay computes.
  nlohmann::json j = {
      {"peft_type", "LORA"},
      {"task_type", "CAUSAL_LM"},
      {"base_model_name_or_path", base_model},
      {"r", config->rank},
      {"lora_alpha", number(config->alpha)},
      {"lora_dropout", config->dropout},
      {"target_modules", config->targets},
      {"bias", "none"},
      {"fan_in_fan_out", false},
      {"inference_mode", true},
      {"init_lora_weights", true},
      {"use_rslora", false},
      {"use_dora", false},
      {"modules_to_save", nullptr},
      {"layers_to_transform", nullptr},
      {"layers_pattern", nullptr},
      {"rank_pattern", nlohmann::json::object()},
      {"alpha_pattern", nlohmann::json::object()},
      {"revision", nullptr},
  };
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  {
    torch::NoGradGuard no_grad;
    auto params = policy.named_parameters();
    for (const std::string& name : adapter_names(policy)) {
      at::Tensor t = params[name].detach();
      if (dtype != c10::ScalarType::Undefined) t = t.to(dtype);
      tensors.emplace_back(kPeftPrefix + name, t.to(torch::kCPU).contiguous());
    }
  }
  RELAY_RETURN_IF_ERROR(
      write_file_atomic((fs::path(dir) / kAdapterConfigFile).string(), j.dump(2) + "\n"));
  return write_safetensors((fs::path(dir) / kAdapterWeightsFile).string(), tensors,
                           {{"format", "pt"}});
}

bool is_peft_adapter_dir(const std::string& dir) {
  std::error_code ec;
  return fs::is_regular_file(fs::path(dir) / kAdapterConfigFile, ec);
}

StatusOr<PeftAdapter> read_peft_adapter(const std::string& dir) {
  const std::string file = (fs::path(dir) / kAdapterConfigFile).string();
  RELAY_ASSIGN_OR_RETURN(std::string text, read_file(file));
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return DataLossError(absl::StrCat(file, ": not a JSON object"));
  auto bad = [&](const std::string& key, const std::string& what) {
    return InvalidArgumentError(absl::StrCat(file, ": ", key, ": ", what));
  };
  auto has = [&](const char* key) { return j.contains(key) && !j[key].is_null(); };
  if (!has("peft_type") || j["peft_type"] != "LORA") {
    return bad("peft_type", "relay reads LORA adapters only");
  }
  PeftAdapter a;
  if (!has("r") || !j["r"].is_number_integer() || j["r"].get<int64_t>() < 1) {
    return bad("r", "expected an integer >= 1");
  }
  a.config.rank = j["r"].get<int64_t>();
  if (has("lora_alpha")) {
    if (!j["lora_alpha"].is_number()) return bad("lora_alpha", "expected a number");
    a.config.alpha = j["lora_alpha"].get<double>();
  }
  if (has("lora_dropout")) {
    if (!j["lora_dropout"].is_number()) return bad("lora_dropout", "expected a number");
    a.config.dropout = j["lora_dropout"].get<double>();
  }
  if (!has("target_modules")) return bad("target_modules", "missing");
  const nlohmann::json& tm = j["target_modules"];
  a.config.targets.clear();
  if (tm.is_string()) {
    a.config.targets.push_back(tm.get<std::string>());
  } else if (tm.is_array()) {
    for (const auto& t : tm) {
      if (!t.is_string()) return bad("target_modules", "expected strings");
      a.config.targets.push_back(t.get<std::string>());
    }
  } else {
    return bad("target_modules", "expected a list of module names");
  }
  // PEFT options that change the math relay does not implement.
  for (const char* flag : {"use_dora", "use_rslora", "fan_in_fan_out"}) {
    if (has(flag) && j[flag] == true) return bad(flag, "true is not supported");
  }
  if (has("bias") && j["bias"] != "none") return bad("bias", "only \"none\" is supported");
  for (const char* list : {"modules_to_save", "layers_to_transform"}) {
    if (has(list) && !(j[list].is_array() && j[list].empty())) {
      return bad(list, "not supported (every targeted layer, nothing else trained)");
    }
  }
  for (const char* pattern : {"rank_pattern", "alpha_pattern"}) {
    if (has(pattern) && !(j[pattern].is_object() && j[pattern].empty())) {
      return bad(pattern, "per-module ranks and alphas are not supported");
    }
  }
  Problems problems(file);
  check(a.config, problems);
  if (!problems.empty()) return problems.status();
  if (!has("base_model_name_or_path") || !j["base_model_name_or_path"].is_string() ||
      j["base_model_name_or_path"].get<std::string>().empty()) {
    return bad("base_model_name_or_path", "expected the base model's directory");
  }
  const fs::path base(j["base_model_name_or_path"].get<std::string>());
  std::error_code ec;
  a.base_model = base.is_absolute() || fs::is_directory(base, ec) ? base.string()
                                                                  : (fs::path(dir) / base).string();

  const std::string weights = (fs::path(dir) / kAdapterWeightsFile).string();
  RELAY_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsReader> reader,
                         SafetensorsReader::open(weights));
  for (const TensorEntry& e : reader->entries()) {
    if (!absl::StartsWith(e.name, kPeftPrefix) || !is_adapter_parameter(e.name)) {
      return InvalidArgumentError(
          absl::StrCat(weights, ": tensor '", e.name,
                       "' is not a LoRA matrix of a causal LM (base_model.model.<module>."
                       "lora_A.weight or lora_B.weight)"));
    }
    RELAY_ASSIGN_OR_RETURN(at::Tensor t, reader->tensor(e.name));
    a.tensors[e.name.substr(sizeof(kPeftPrefix) - 1)] = std::move(t);
  }
  return a;
}

Status load_adapter_tensors(PolicyImpl& policy, const PeftAdapter& adapter,
                            const std::string& dir) {
  torch::NoGradGuard no_grad;
  auto params = policy.named_parameters();
  const std::vector<std::string> names = adapter_names(policy);
  for (const std::string& name : names) {
    auto it = adapter.tensors.find(name);
    if (it == adapter.tensors.end()) {
      return InvalidArgumentError(
          absl::StrCat(dir, ": ", kAdapterWeightsFile, " has no tensor '", kPeftPrefix, name, "'"));
    }
    at::Tensor& p = params[name];
    if (it->second.sizes() != p.sizes()) {
      return InvalidArgumentError(absl::StrCat(
          dir, ": tensor '", kPeftPrefix, name, "' has shape [",
          absl::StrJoin(it->second.sizes(), ", "), "], the adapter config and base model imply [",
          absl::StrJoin(p.sizes(), ", "), "]"));
    }
  }
  if (adapter.tensors.size() != names.size()) {
    for (const auto& [name, t] : adapter.tensors) {
      if (!std::binary_search(names.begin(), names.end(), name)) {
        return InvalidArgumentError(absl::StrCat(dir, ": tensor '", kPeftPrefix, name,
                                                 "' adapts nothing the base model has"));
      }
    }
  }
  for (const std::string& name : names) params[name].copy_(adapter.tensors.at(name));
  return OkStatus();
}

}  // namespace relay::model
