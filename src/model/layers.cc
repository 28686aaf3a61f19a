#include "relay/model/layers.h"

#include <atomic>
#include <cmath>
#include <limits>
#include <optional>
#include <vector>

#include <torch/nn/init.h>
#include <torch/types.h>
#include <torch/utils.h>
#include <torch/version.h>

#include "absl/strings/str_cat.h"
#include "model/decode_attention.h"
#include "model/row_linear.h"
#include "relay/model/kv_cache.h"
#include "relay/model/rope.h"

// at::scaled_dot_product_attention arrived in LibTorch 2.0, its enable_gqa
// argument (query heads sharing key/value heads without repeating them) in 2.5.
#if TORCH_VERSION_MAJOR >= 2
#define RELAY_HAS_SDPA 1
#endif
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 5)
#define RELAY_SDPA_HAS_GQA 1
#endif

namespace relay::model {
namespace {

#ifdef RELAY_HAS_SDPA
constexpr AttentionImplementation kDefaultAttention = AttentionImplementation::kSdpa;
#else
constexpr AttentionImplementation kDefaultAttention = AttentionImplementation::kEager;
#endif
std::atomic<AttentionImplementation> g_attention{kDefaultAttention};

at::Tensor eager_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const at::Tensor& mask) {
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3);
  const int64_t KVH = k.size(1), S = k.size(2);
  const int64_t rep = H / KVH;
  // Heads h = g * rep + r share kv head g: fold r into the query axis.
  at::Tensor qg = q.reshape({B, KVH, rep * T, D});
  at::Tensor scores = torch::matmul(qg, k.transpose(-1, -2)).to(torch::kFloat32);
  scores = scores.mul(1.0 / std::sqrt(static_cast<double>(D))).view({B, KVH, rep, T, S});
  scores = scores.masked_fill(mask.view({B, 1, 1, T, S}).logical_not(),
                              -std::numeric_limits<float>::infinity());
  at::Tensor probs = torch::softmax(scores, -1).to(v.scalar_type()).view({B, KVH, rep * T, S});
  return torch::matmul(probs, v).view({B, H, T, D});
}

#ifdef RELAY_HAS_SDPA
at::Tensor sdpa_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const at::Tensor& mask) {
  const int64_t B = q.size(0), T = q.size(2), S = k.size(2);
  // A bool mask (true = attend); a float one would be added to the scores.
  const at::Tensor m = mask.to(torch::kBool).view({B, 1, T, S});
#ifdef RELAY_SDPA_HAS_GQA
  return at::scaled_dot_product_attention(q, k, v, m, /*dropout_p=*/0.0, /*is_causal=*/false,
                                          /*scale=*/std::nullopt, /*enable_gqa=*/true);
#else
  // transformers' repeat_kv: query head h reads the copy of kv head h / rep.
  const int64_t rep = q.size(1) / k.size(1);
  if (rep == 1) return at::scaled_dot_product_attention(q, k, v, m);
  return at::scaled_dot_product_attention(q, k.repeat_interleave(rep, 1),
                                          v.repeat_interleave(rep, 1), m);
#endif
}
#endif

}  // namespace

bool sdpa_available() {
#ifdef RELAY_HAS_SDPA
  return true;
#else
  return false;
#endif
}

AttentionImplementation attention_implementation() { return g_attention.load(); }

bool set_attention_implementation(AttentionImplementation implementation) {
  if (implementation == AttentionImplementation::kSdpa && !sdpa_available()) return false;
  g_attention.store(implementation);
  return true;
}

const char* attention_implementation_name(AttentionImplementation implementation) {
  return implementation == AttentionImplementation::kSdpa ? "sdpa" : "eager";
}

Status apply_attention_choice(AttentionChoice choice) {
  if (choice == AttentionChoice::kEager) {
    set_attention_implementation(AttentionImplementation::kEager);
  } else if (!set_attention_implementation(AttentionImplementation::kSdpa) &&
             choice == AttentionChoice::kSdpa) {
    return InvalidArgumentError(absl::StrCat(
        "model.attn_implementation: sdpa needs at::scaled_dot_product_attention, which LibTorch ",
        TORCH_VERSION, " does not have (2.0+); use auto or eager"));
  }
  return OkStatus();
}

RMSNormImpl::RMSNormImpl(int64_t dim, double eps) : eps_(eps) {
  weight = register_parameter("weight", torch::ones({dim}));
}

at::Tensor RMSNormImpl::forward(const at::Tensor& x) {
  at::Tensor xf = x.to(torch::kFloat32);
  at::Tensor variance = xf.pow(2).mean(-1, /*keepdim=*/true);
  xf = xf * torch::rsqrt(variance + eps_);
  return weight * xf.to(x.scalar_type());
}

ProjectionImpl::ProjectionImpl(int64_t in_features, int64_t out_features, bool with_bias) {
  // torch::nn::Linear's initialisation, draw for draw, so a policy built
  // without a checkpoint or init_weights() starts where it always did.
  weight = register_parameter("weight", torch::empty({out_features, in_features}));
  torch::nn::init::kaiming_uniform_(weight, std::sqrt(5.0));
  if (with_bias) {
    bias = register_parameter("bias", torch::empty({out_features}));
    const double bound = 1.0 / std::sqrt(static_cast<double>(in_features));
    torch::nn::init::uniform_(bias, -bound, bound);
  }
}

void ProjectionImpl::add_adapter(int64_t rank, double scaling, double dropout) {
  TORCH_CHECK(!lora_A, "Projection: the adapter is already there");
  auto on_weight = torch::TensorOptions().dtype(weight.scalar_type()).device(weight.device());
  lora_A = register_module("lora_A", LoraMatrix(torch::zeros({rank, weight.size(1)}, on_weight)));
  lora_B = register_module("lora_B", LoraMatrix(torch::zeros({weight.size(0), rank}, on_weight)));
  scaling_ = scaling;
  dropout_ = dropout;
}

at::Tensor ProjectionImpl::forward(const at::Tensor& x) {
  at::Tensor y = row_linear(x, weight, bias);
  if (!lora_A || !adapter_enabled_) return y;
  at::Tensor in = x.to(lora_A->weight.scalar_type());
  if (dropout_ > 0 && is_training() && torch::GradMode::is_enabled()) {
    in = torch::dropout(in, dropout_, /*train=*/true);
  }
  at::Tensor delta = torch::linear(torch::linear(in, lora_A->weight), lora_B->weight);
  return y + (delta * scaling_).to(y.scalar_type());
}

at::Tensor grouped_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const at::Tensor& mask) {
#ifdef RELAY_HAS_SDPA
  if (g_attention.load(std::memory_order_relaxed) == AttentionImplementation::kSdpa) {
    return sdpa_attention(q, k, v, mask);
  }
#endif
  return eager_attention(q, k, v, mask);
}

AttentionImpl::AttentionImpl(const PolicyConfig& config, int64_t layer_index)
    : layer_index_(layer_index),
      num_heads_(config.num_attention_heads),
      num_kv_heads_(config.num_key_value_heads),
      head_dim_(config.resolved_head_dim()) {
  const int64_t hidden = config.hidden_size;
  // Qwen2Attention: q/k/v always biased, o never. Llama and Qwen3: all four
  // follow attention_bias.
  const bool qwen2 = config.model_type == "qwen2";
  const bool qkv_bias = config.attention_bias || qwen2;
  const bool o_bias = config.attention_bias && !qwen2;
  q_proj = register_module("q_proj", Projection(hidden, num_heads_ * head_dim_, qkv_bias));
  k_proj = register_module("k_proj", Projection(hidden, num_kv_heads_ * head_dim_, qkv_bias));
  v_proj = register_module("v_proj", Projection(hidden, num_kv_heads_ * head_dim_, qkv_bias));
  o_proj = register_module("o_proj", Projection(num_heads_ * head_dim_, hidden, o_bias));
  if (config.has_qk_norm()) {
    q_norm = register_module("q_norm", RMSNorm(head_dim_, config.rms_norm_eps));
    k_norm = register_module("k_norm", RMSNorm(head_dim_, config.rms_norm_eps));
  }
}

at::Tensor AttentionImpl::forward(const at::Tensor& x, const ForwardContext& ctx) {
  const int64_t B = x.size(0), T = x.size(1);
  at::Tensor q = q_proj(x).view({B, T, num_heads_, head_dim_});
  at::Tensor k = k_proj(x).view({B, T, num_kv_heads_, head_dim_});
  at::Tensor v = v_proj(x).view({B, T, num_kv_heads_, head_dim_}).transpose(1, 2);
  if (q_norm) {  // Qwen3: normalise each head's vector, then rotate
    q = q_norm(q);
    k = k_norm(k);
  }
  q = apply_rope(q.transpose(1, 2), ctx.positions, ctx.inv_freq, ctx.rope_scaling);
  k = apply_rope(k.transpose(1, 2), ctx.positions, ctx.inv_freq, ctx.rope_scaling);

  if (ctx.cache != nullptr) {
    // Write the valid new keys/values into their rows of the cache's flat
    // storage, then gather every row's first kv_len positions back.
    at::Tensor& cache_k = ctx.cache->keys(layer_index_);
    at::Tensor& cache_v = ctx.cache->values(layer_index_);
    auto flat = [&](const at::Tensor& t) {
      return t.transpose(1, 2)
          .reshape({B * T, num_kv_heads_, head_dim_})
          .index_select(0, ctx.write_rows);
    };
    cache_k.index_copy_(0, ctx.write_index, flat(k).to(cache_k.scalar_type()));
    cache_v.index_copy_(0, ctx.write_index, flat(v).to(cache_v.scalar_type()));
    if (T == 1) {
      // A decode step: attention reads the cache where it lies, if it can.
      const at::Tensor out = paged_decode_attention(q, cache_k, cache_v, ctx.read_index, ctx.mask);
      if (out.defined()) {
        return o_proj(out.transpose(1, 2).reshape({B, T, num_heads_ * head_dim_}));
      }
    }
    auto gather = [&](const at::Tensor& storage) {
      return storage.index_select(0, ctx.read_index.view(-1))
          .view({B, ctx.kv_len, num_kv_heads_, head_dim_})
          .transpose(1, 2)
          .to(q.scalar_type());
    };
    k = gather(cache_k);
    v = gather(cache_v);
  }

  at::Tensor out = grouped_attention(q, k, v, ctx.mask);
  return o_proj(out.transpose(1, 2).reshape({B, T, num_heads_ * head_dim_}));
}

MlpImpl::MlpImpl(int64_t h, int64_t f) {
  gate_proj = register_module("gate_proj", Projection(h, f, false));
  up_proj = register_module("up_proj", Projection(h, f, false));
  down_proj = register_module("down_proj", Projection(f, h, false));
}

at::Tensor MlpImpl::forward(const at::Tensor& x) {
  return down_proj(torch::silu(gate_proj(x)) * up_proj(x));
}

SparseMoeImpl::SparseMoeImpl(const PolicyConfig& config)
    : num_experts_(config.num_experts),
      top_k_(config.num_experts_per_tok),
      norm_topk_prob_(config.norm_topk_prob) {
  gate = register_module(
      "gate",
      torch::nn::Linear(torch::nn::LinearOptions(config.hidden_size, num_experts_).bias(false)));
  experts = register_module("experts", torch::nn::ModuleList());
  for (int64_t e = 0; e < num_experts_; ++e) {
    experts->push_back(Mlp(config.hidden_size, config.moe_intermediate_size));
  }
}

at::Tensor SparseMoeImpl::forward(const at::Tensor& x, MoeRouting* routing, int64_t moe_index) {
  const int64_t H = x.size(-1);
  at::Tensor flat = x.reshape({-1, H});
  const int64_t N = flat.size(0);
  at::Tensor probs = torch::softmax(gate(flat), -1, torch::kFloat32);  // [N, E], fp32
  auto top = probs.topk(top_k_, -1);
  at::Tensor weights = std::get<0>(top);
  at::Tensor chosen = std::get<1>(top);  // [N, k]
  if (routing != nullptr && routing->recorded.defined()) {
    at::Tensor recorded = routing->recorded.select(1, moe_index).to(chosen.device());  // [N, k]
    TORCH_CHECK(recorded.size(0) == N && recorded.size(1) == top_k_, "SparseMoe: the record holds ",
                recorded.sizes(), " ids for ", N, " rows of ", top_k_, " experts");
    at::Tensor has = recorded.ge(0).all(-1);  // rows with a recorded choice
    routing->differs.push_back(
        has.logical_and(std::get<0>(recorded.sort(-1)).ne(std::get<0>(chosen.sort(-1))).any(-1)));
    if (routing->replay) {
      TORCH_CHECK(recorded.lt(num_experts_).all().item<bool>(),
                  "SparseMoe: a replayed expert id is outside [0, ", num_experts_, ")");
      chosen = torch::where(has.unsqueeze(1), recorded, chosen);
      weights = probs.gather(1, chosen);
    }
  }
  if (norm_topk_prob_) weights = weights / weights.sum(-1, /*keepdim=*/true);
  weights = weights.to(x.scalar_type());
  if (routing != nullptr && routing->record) routing->chosen.push_back(chosen.detach());

  // Gather each expert's (token, slot) pairs: sort the N * k choices by
  // expert; one read of the per-expert counts tells where each run starts.
  at::Tensor by_expert = chosen.reshape(-1);
  at::Tensor order = std::get<1>(by_expert.sort(/*stable=*/true, /*dim=*/0, /*descending=*/false));
  at::Tensor counts = torch::bincount(by_expert, {}, num_experts_).to(torch::kCPU);
  const int64_t* count = counts.data_ptr<int64_t>();
  at::Tensor token_of = order.div(top_k_, "floor");
  at::Tensor weight_of = weights.reshape(-1).index_select(0, order);
  at::Tensor out = torch::zeros_like(flat);
  int64_t start = 0;
  for (int64_t e = 0; e < num_experts_; ++e) {
    if (count[e] == 0) continue;
    at::Tensor rows = token_of.narrow(0, start, count[e]);
    at::Tensor y = experts[e]->as<MlpImpl>()->forward(flat.index_select(0, rows)) *
                   weight_of.narrow(0, start, count[e]).unsqueeze(1);
    out.index_add_(0, rows, y.to(out.scalar_type()));
    start += count[e];
  }
  return out.view(x.sizes());
}

DecoderLayerImpl::DecoderLayerImpl(const PolicyConfig& config, int64_t layer_index)
    : moe_index_(config.moe_layer_index(layer_index)) {
  input_layernorm =
      register_module("input_layernorm", RMSNorm(config.hidden_size, config.rms_norm_eps));
  self_attn = register_module("self_attn", Attention(config, layer_index));
  post_attention_layernorm =
      register_module("post_attention_layernorm", RMSNorm(config.hidden_size, config.rms_norm_eps));
  if (moe_index_ >= 0) {
    moe = register_module("mlp", SparseMoe(config));
  } else {
    mlp = register_module("mlp", Mlp(config.hidden_size, config.intermediate_size));
  }
}

at::Tensor DecoderLayerImpl::forward(const at::Tensor& x, const ForwardContext& ctx) {
  at::Tensor h = x + self_attn(input_layernorm(x), ctx);
  at::Tensor n = post_attention_layernorm(h);
  return h + (moe ? moe->forward(n, ctx.routing, moe_index_) : mlp(n));
}

}  // namespace relay::model
