// The critic: the policy's decoder with a scalar head
// (relay/model/value_model.h).

#include "relay/model/value_model.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <filesystem>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "model/model_directory.h"
#include "relay/common/file_io.h"
#include "relay/model/hf_config.h"
#include "relay/model/safetensors.h"

namespace relay::model {
namespace fs = std::filesystem;

namespace {

PolicyConfig without_lm_head(PolicyConfig config) {
  config.tie_word_embeddings = true;  // the trunk builds no lm_head
  return config;
}

// Tensors a critic directory or a causal LM may carry that the critic does
// not have: the LM head, and RoPE buffers of older Llama checkpoints.
bool ignorable(const std::string& name) {
  return name == "lm_head.weight" || absl::EndsWith(name, "rotary_emb.inv_freq");
}

const char* kHeadWeight = "score.weight";
const char* kHeadBias = "score.bias";

}  // namespace

ValueModelImpl::ValueModelImpl(const PolicyConfig& config)
    : config_(config), trunk_(without_lm_head(config)) {
  model = register_module("model", trunk_->model);
  score = register_module(
      "score", torch::nn::Linear(torch::nn::LinearOptions(config.hidden_size, 1).bias(true)));
}

at::Tensor ValueModelImpl::values(const at::Tensor& input_ids, const at::Tensor& lengths,
                                  const at::Tensor& sequence_starts) {
  const int64_t B = input_ids.size(0), T = input_ids.size(1);
  TORCH_CHECK(T >= 2, "ValueModel: values need sequences of >= 2 tokens, got T = ", T);
  const at::Tensor hidden = trunk_->hidden_states(input_ids, lengths, nullptr, sequence_starts);
  at::Tensor v = score->forward(hidden.narrow(1, 0, T - 1)).squeeze(-1).to(torch::kFloat32);
  if (lengths.defined()) {
    at::Tensor len = lengths.to(v.device(), torch::kInt64).view({B, 1});
    v = v.masked_fill(torch::arange(T - 1, len.options()).view({1, T - 1}).ge(len - 1), 0.0);
  }
  if (sequence_starts.defined()) {
    // A packed sequence's last position is followed by another sequence.
    at::Tensor starts = sequence_starts.to(v.device(), torch::kInt64);
    v = v.masked_fill(starts.narrow(1, 1, T - 1).ne(starts.narrow(1, 0, T - 1)), 0.0);
  }
  return v;
}

void init_value_head(ValueModelImpl& critic, uint64_t seed, double initializer_range) {
  torch::NoGradGuard no_grad;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  at::Tensor w = torch::empty(critic.score->weight.sizes(), torch::kFloat32)
                     .normal_(0.0, initializer_range, gen);
  critic.score->weight.copy_(w);
  critic.score->bias.zero_();
}

ValueModel value_model_from_policy(const PolicyImpl& policy, uint64_t seed) {
  ValueModel critic(policy.config());
  init_value_head(*critic, seed);
  const at::Tensor first = policy.parameters().front();  // a copy: parameters() is a temporary
  critic->to(first.device(), first.scalar_type());
  torch::NoGradGuard no_grad;
  const auto theirs = policy.named_parameters();
  for (auto& item : critic->model->named_parameters()) {
    const at::Tensor* src = theirs.find("model." + item.key());
    TORCH_CHECK(src != nullptr, "value_model_from_policy: the policy has no 'model.", item.key(),
                "'");
    item.value().copy_(*src);
  }
  critic->eval();
  return critic;
}

StatusOr<ValueModel> load_value_model(const std::string& dir, const LoadOptions& options,
                                      uint64_t seed) {
  if (!fs::is_directory(dir))
    return NotFoundError(absl::StrCat("model directory not found: ", dir));
  RELAY_ASSIGN_OR_RETURN(PolicyConfig config,
                         read_hf_config((fs::path(dir) / "config.json").string()));
  RELAY_ASSIGN_OR_RETURN(CheckpointTensors tensors, CheckpointTensors::open(dir));
  try {
    ValueModel critic(config);
    init_value_head(*critic, seed);
    // A critic (or a reward model's score head, which has no bias) brings
    // its head; a causal LM does not, and keeps the one just drawn.
    const bool has_head = tensors.contains(kHeadWeight);
    const bool has_bias = tensors.contains(kHeadBias);
    torch::NoGradGuard no_grad;
    RELAY_RETURN_IF_ERROR(fill_parameters(
        *critic, tensors, dir, absl::StrCat("a ", config.model_type, " critic"),
        [&](const std::string& name) {
          return (name == kHeadWeight && !has_head) || (name == kHeadBias && !has_bias);
        },
        ignorable));
    critic->to(options.device, options.dtype);
    critic->eval();
    return critic;
  } catch (const c10::Error& e) {
    return InternalError(absl::StrCat(dir, ": ", e.what_without_backtrace()));
  }
}

Status save_value_model(ValueModelImpl& critic, const std::string& dir,
                        const SaveOptions& options) {
  return save_model_directory(dir, options, [&](const std::string& staging) -> Status {
    c10::ScalarType saved = options.dtype;
    const std::vector<std::pair<std::string, at::Tensor>> tensors =
        tensors_for_save(critic, options.dtype, &saved);
    PolicyConfig config = critic.config();
    config.torch_dtype = torch_dtype_name(saved);
    RELAY_RETURN_IF_ERROR(validate(config));
    // The policy's config.json, as a token classifier with one label.
    nlohmann::ordered_json j = nlohmann::ordered_json::parse(to_hf_config_json(config));
    for (auto& arch : j["architectures"]) {
      std::string name = arch.get<std::string>();
      if (absl::EndsWith(name, "ForCausalLM")) {
        name = name.substr(0, name.size() - 11) + "ForTokenClassification";
      }
      arch = name;
    }
    j["num_labels"] = 1;
    j["id2label"] = {{"0", "LABEL_0"}};
    j["label2id"] = {{"LABEL_0", 0}};
    RELAY_RETURN_IF_ERROR(
        write_file_atomic((fs::path(staging) / "config.json").string(), j.dump(2) + "\n"));
    return write_checkpoint_tensors(staging, tensors, options.max_shard_bytes);
  });
}

}  // namespace relay::model
