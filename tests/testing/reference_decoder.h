#pragma once

// An independent, deliberately naive forward pass of the decoders relay
// implements, written from transformers' modeling files (Llama, Qwen2, Qwen3,
// Qwen3-MoE) rather than from relay's layers: explicit repeat_kv, a full
// causal softmax per head, RoPE from a rotation of each pair, and the MoE
// block as a dense loop over every expert with zero weight for the experts
// a token was not routed to. Tests compare relay's fast paths with it.
// Reads the weights from the policy's named parameters; fp64 throughout, so
// its own rounding is far below the tolerances compared against.

#include <torch/types.h>
#include <torch/utils.h>

#include <cmath>
#include <string>

#include "relay/model/policy.h"
#include "relay/model/rope.h"

namespace relay::testing {

class ReferenceDecoder {
 public:
  explicit ReferenceDecoder(model::PolicyImpl& policy) : config_(policy.config()) {
    for (const auto& item : policy.named_parameters()) {
      weights_[item.key()] = item.value().detach().to(torch::kFloat64);
    }
  }

  // Logits [T, V] of one unpadded sequence ids [T].
  at::Tensor logits(const std::vector<int64_t>& ids) const {
    const auto T = static_cast<int64_t>(ids.size());
    at::Tensor h = w("model.embed_tokens.weight").index_select(0, torch::tensor(ids));
    for (int64_t l = 0; l < config_.num_hidden_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      at::Tensor a = attention(rms_norm(h, w(p + "input_layernorm.weight")), p, T);
      h = h + a;
      at::Tensor n = rms_norm(h, w(p + "post_attention_layernorm.weight"));
      h = h + (config_.is_moe_layer(l) ? moe(n, p + "mlp.") : mlp(n, p + "mlp."));
    }
    h = rms_norm(h, w("model.norm.weight"));
    const std::string head =
        config_.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
    return torch::matmul(h, w(head).t());
  }

  // Experts chosen per token of `ids` in MoE layer `layer` (layer index, not
  // MoE index), [T, k], sorted ascending.
  at::Tensor routing(const std::vector<int64_t>& ids, int64_t layer) const {
    routing_layer_ = layer;
    logits(ids);
    routing_layer_ = -1;
    return routed_;
  }

 private:
  const at::Tensor& w(const std::string& name) const { return weights_.at(name); }

  at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight) const {
    return x / torch::sqrt(x.pow(2).mean(-1, true) + config_.rms_norm_eps) * weight;
  }

  at::Tensor linear(const at::Tensor& x, const std::string& name) const {
    at::Tensor y = torch::matmul(x, w(name + ".weight").t());
    if (weights_.count(name + ".bias")) y = y + w(name + ".bias");
    return y;
  }

  // x [T, heads, D]: rotate pair (i, i + D/2) of position t by t * inv_freq_i.
  at::Tensor rope(const at::Tensor& x) const {
    const model::RopeFrequencies f = model::rope_frequencies(config_, x.size(0));
    const int64_t T = x.size(0), D = x.size(2), half = D / 2;
    at::Tensor out = x.clone();
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t i = 0; i < half; ++i) {
        const double angle = static_cast<double>(t) * f.inv_freq[i].item<float>();
        const double c = std::cos(angle) * f.attention_scaling;
        const double s = std::sin(angle) * f.attention_scaling;
        at::Tensor a = x[t].select(1, i), b = x[t].select(1, i + half);  // [heads]
        out[t].select(1, i).copy_(a * c - b * s);
        out[t].select(1, i + half).copy_(b * c + a * s);
      }
    }
    return out;
  }

  at::Tensor attention(const at::Tensor& x, const std::string& p, int64_t T) const {
    const int64_t H = config_.num_attention_heads, KVH = config_.num_key_value_heads;
    const int64_t D = config_.resolved_head_dim();
    at::Tensor q = linear(x, p + "self_attn.q_proj").view({T, H, D});
    at::Tensor k = linear(x, p + "self_attn.k_proj").view({T, KVH, D});
    at::Tensor v = linear(x, p + "self_attn.v_proj").view({T, KVH, D});
    if (config_.has_qk_norm()) {
      q = rms_norm(q, w(p + "self_attn.q_norm.weight"));
      k = rms_norm(k, w(p + "self_attn.k_norm.weight"));
    }
    q = rope(q);
    k = rope(k);
    // repeat_kv: head h reads kv head h / (H / KVH).
    k = k.repeat_interleave(H / KVH, 1);
    v = v.repeat_interleave(H / KVH, 1);
    at::Tensor out = torch::zeros({T, H, D}, x.options());
    for (int64_t h = 0; h < H; ++h) {
      at::Tensor scores = torch::matmul(q.select(1, h), k.select(1, h).t()) / std::sqrt(double(D));
      at::Tensor causal = torch::ones({T, T}, torch::kBool).triu(1);
      scores = scores.masked_fill(causal, -INFINITY);
      out.select(1, h).copy_(torch::matmul(torch::softmax(scores, -1), v.select(1, h)));
    }
    return linear(out.reshape({T, H * D}), p + "self_attn.o_proj");
  }

  at::Tensor mlp(const at::Tensor& x, const std::string& p) const {
    return linear(torch::silu(linear(x, p + "gate_proj")) * linear(x, p + "up_proj"),
                  p + "down_proj");
  }

  // Every expert on every token; a token's weights are 0 outside its top-k.
  at::Tensor moe(const at::Tensor& x, const std::string& p) const {
    const int64_t E = config_.num_experts, k = config_.num_experts_per_tok;
    at::Tensor probs = torch::softmax(linear(x, p + "gate"), -1);
    at::Tensor top = std::get<1>(probs.topk(k, -1));
    at::Tensor keep = torch::zeros_like(probs).scatter(1, top, 1.0);
    at::Tensor weights = probs * keep;
    if (config_.norm_topk_prob) weights = weights / weights.sum(-1, true);
    if (routing_layer_ >= 0 && p == "model.layers." + std::to_string(routing_layer_) + ".mlp.") {
      routed_ = std::get<0>(top.sort(-1));
    }
    at::Tensor out = torch::zeros_like(x);
    for (int64_t e = 0; e < E; ++e) {
      out = out +
            weights.select(1, e).unsqueeze(1) * mlp(x, p + "experts." + std::to_string(e) + ".");
    }
    return out;
  }

  model::PolicyConfig config_;
  std::map<std::string, at::Tensor> weights_;
  mutable int64_t routing_layer_ = -1;
  mutable at::Tensor routed_;
};

}  // namespace relay::testing
