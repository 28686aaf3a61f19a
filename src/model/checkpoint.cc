#include "relay/model/checkpoint.h"

#include <torch/types.h>
#include <torch/utils.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <set>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "model/model_directory.h"
#include "relay/common/file_io.h"
#include "relay/model/hf_config.h"
#include "relay/model/lora.h"
#include "relay/model/safetensors.h"

namespace relay::model {
namespace fs = std::filesystem;

StatusOr<c10::ScalarType> parse_torch_dtype(const std::string& name) {
  if (name == "float32") return c10::ScalarType::Float;
  if (name == "bfloat16") return c10::ScalarType::BFloat16;
  if (name == "float16") return c10::ScalarType::Half;
  return InvalidArgumentError(
      absl::StrCat("dtype: must be float32, bfloat16 or float16, got '", name, "'"));
}

std::string torch_dtype_name(c10::ScalarType dtype) {
  switch (dtype) {
    case c10::ScalarType::Float:
      return "float32";
    case c10::ScalarType::BFloat16:
      return "bfloat16";
    case c10::ScalarType::Half:
      return "float16";
    default:
      return c10::toString(dtype);
  }
}

namespace {

// Tensors a checkpoint may carry that are not parameters of the model.
bool ignorable(const std::string& name, const PolicyConfig& config) {
  if (absl::EndsWith(name, "rotary_emb.inv_freq")) return true;  // older Llama checkpoints
  return config.tie_word_embeddings && name == "lm_head.weight";
}

// An adapter directory: its base model with the adapter on top.
StatusOr<Policy> load_adapter_policy(const std::string& dir, const LoadOptions& options) {
  RELAY_ASSIGN_OR_RETURN(PeftAdapter adapter, read_peft_adapter(dir));
  StatusOr<Policy> base = load_policy(adapter.base_model, options);
  if (!base.ok()) {
    return Status(base.status().code(), absl::StrCat(dir,
                                                     ": its base model (adapter_config.json "
                                                     "base_model_name_or_path): ",
                                                     base.status().message()));
  }
  Policy policy = *std::move(base);
  RELAY_RETURN_IF_ERROR(attach_lora(*policy, adapter.config, /*seed=*/0));
  RELAY_RETURN_IF_ERROR(load_adapter_tensors(*policy, adapter, dir));
  return policy;
}

// config.json and the weights of `policy` into `staging`.
Status write_full_policy(PolicyImpl& policy, const fs::path& staging, const SaveOptions& options) {
  c10::ScalarType saved_dtype = options.dtype;
  const std::vector<std::pair<std::string, at::Tensor>> tensors =
      tensors_for_save(policy, options.dtype, &saved_dtype);
  PolicyConfig config = policy.config();
  config.torch_dtype = torch_dtype_name(saved_dtype);
  RELAY_RETURN_IF_ERROR(write_hf_config(config, (staging / "config.json").string()));
  return write_checkpoint_tensors(staging.string(), tensors, options.max_shard_bytes);
}

}  // namespace

std::vector<std::pair<std::string, at::Tensor>> tensors_for_save(torch::nn::Module& model,
                                                                 c10::ScalarType dtype,
                                                                 c10::ScalarType* saved) {
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  torch::NoGradGuard no_grad;
  for (const auto& item : model.named_parameters()) {
    at::Tensor t = item.value().detach();
    if (dtype != c10::ScalarType::Undefined) t = t.to(dtype);
    *saved = t.scalar_type();
    tensors.emplace_back(item.key(), t.to(torch::kCPU).contiguous());
  }
  return tensors;
}

Status fill_parameters(torch::nn::Module& model, const CheckpointTensors& tensors,
                       const std::string& dir, const std::string& what,
                       const std::function<bool(const std::string&)>& keep,
                       const std::function<bool(const std::string&)>& ignorable) {
  std::set<std::string> used;
  for (auto& item : model.named_parameters()) {
    const std::string& name = item.key();
    if (keep && keep(name)) continue;
    at::Tensor& param = item.value();
    const TensorEntry* entry = tensors.entry(name);
    if (entry == nullptr) {
      return InvalidArgumentError(absl::StrCat(dir, ": missing tensor '", name, "'"));
    }
    if (c10::IntArrayRef(entry->shape) != param.sizes()) {
      return InvalidArgumentError(
          absl::StrCat(dir, ": tensor '", name, "' has shape [", absl::StrJoin(entry->shape, ", "),
                       "], config.json implies [", absl::StrJoin(param.sizes(), ", "), "]"));
    }
    RELAY_ASSIGN_OR_RETURN(at::Tensor value, tensors.tensor(name));
    param.copy_(value);
    used.insert(name);
  }
  std::vector<std::string> unexpected;
  for (const std::string& name : tensors.names()) {
    if (!used.count(name) && !ignorable(name)) unexpected.push_back(name);
  }
  if (!unexpected.empty()) {
    if (unexpected.size() > 5) unexpected.resize(5);
    return InvalidArgumentError(
        absl::StrCat(dir, ": tensors ", what, " does not have: ", absl::StrJoin(unexpected, ", ")));
  }
  return OkStatus();
}

StatusOr<Policy> load_policy(const std::string& dir, const LoadOptions& options) {
  if (!fs::is_directory(dir))
    return NotFoundError(absl::StrCat("model directory not found: ", dir));
  if (!fs::exists(fs::path(dir) / "config.json") && is_peft_adapter_dir(dir)) {
    return load_adapter_policy(dir, options);
  }
  RELAY_ASSIGN_OR_RETURN(PolicyConfig config,
                         read_hf_config((fs::path(dir) / "config.json").string()));
  RELAY_ASSIGN_OR_RETURN(CheckpointTensors tensors, CheckpointTensors::open(dir));
  try {
    Policy policy(config);
    torch::NoGradGuard no_grad;
    RELAY_RETURN_IF_ERROR(fill_parameters(
        *policy, tensors, dir, absl::StrCat("the ", config.model_type, " architecture"), nullptr,
        [&config](const std::string& name) { return ignorable(name, config); }));
    policy->to(options.device, options.dtype);
    policy->eval();
    return policy;
  } catch (const c10::Error& e) {
    return InternalError(absl::StrCat(dir, ": ", e.what_without_backtrace()));
  }
}

Status save_model_directory(const std::string& dir, const SaveOptions& options,
                            const std::function<Status(const std::string& staging)>& write) {
  const fs::path target(dir);
  std::error_code ec;
  if (fs::exists(target) && !options.overwrite) {
    return AlreadyExistsError(absl::StrCat(dir, ": already exists (pass overwrite to replace it)"));
  }
  const fs::path staging = target.string() + ".partial-" + std::to_string(::getpid());
  fs::remove_all(staging, ec);
  fs::create_directories(staging, ec);
  if (ec)
    return InternalError(absl::StrCat("cannot create ", staging.string(), ": ", ec.message()));

  auto fail = [&](Status s) {
    std::error_code ignored;
    fs::remove_all(staging, ignored);
    return s;
  };

  Status s = write(staging.string());
  if (s.ok() && options.write_more) s = options.write_more(staging.string());
  for (const auto& [name, contents] : options.extra_files) {
    if (!s.ok()) break;
    if (name.empty() || name.find('/') != std::string::npos || name == "config.json") {
      s = InvalidArgumentError(absl::StrCat("extra file name '", name, "' is not allowed"));
      break;
    }
    s = write_file_atomic((staging / name).string(), contents);
  }
  if (!s.ok()) return fail(s);

  // Keep any other files already in the directory (a tokenizer, notes):
  // copy them over unless the new checkpoint writes a file of that name.
  if (fs::exists(target)) {
    for (const auto& e : fs::directory_iterator(target)) {
      const std::string name = e.path().filename().string();
      const bool weights =
          absl::EndsWith(name, ".safetensors") || name == "model.safetensors.index.json";
      if (!weights && !fs::exists(staging / name))
        fs::copy(e.path(), staging / name, fs::copy_options::recursive, ec);
      if (ec)
        return fail(
            InternalError(absl::StrCat("cannot keep ", e.path().string(), ": ", ec.message())));
    }
    const fs::path old = target.string() + ".old-" + std::to_string(::getpid());
    fs::rename(target, old, ec);
    if (ec) return fail(InternalError(absl::StrCat("cannot replace ", dir, ": ", ec.message())));
    fs::rename(staging, target, ec);
    if (ec) {
      fs::rename(old, target, ec);
      return fail(InternalError(absl::StrCat("cannot move checkpoint into ", dir)));
    }
    fs::remove_all(old, ec);
    return OkStatus();
  }
  if (target.has_parent_path()) fs::create_directories(target.parent_path(), ec);
  fs::rename(staging, target, ec);
  if (ec)
    return fail(
        InternalError(absl::StrCat("cannot move checkpoint into ", dir, ": ", ec.message())));
  return OkStatus();
}

Status save_policy(PolicyImpl& policy, const std::string& dir, const SaveOptions& options) {
  if (has_lora(policy) && options.lora_base.empty()) {
    return FailedPreconditionError(
        absl::StrCat(dir,
                     ": the policy has LoRA adapters, which are saved with the path of their base "
                     "model (SaveOptions::lora_base), and none was given"));
  }
  return save_model_directory(dir, options, [&](const std::string& staging) {
    if (has_lora(policy)) {
      return write_peft_adapter(policy, staging, options.lora_base, options.dtype);
    }
    return write_full_policy(policy, staging, options);
  });
}

}  // namespace relay::model
