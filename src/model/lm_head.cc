#include "relay/model/lm_head.h"

#include <torch/torch.h>

#include <algorithm>
#include <vector>

namespace relay::model {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// One chunk's tempered fp32 logits: exactly the forward's operations.
at::Tensor chunk_logits(const at::Tensor& h, const at::Tensor& w, double temperature) {
  at::Tensor z = torch::nn::functional::linear(h, w).to(torch::kFloat32);
  return temperature != 1.0 ? z / temperature : z;
}

// Writes the chunk's scores into logp[start:] (and entropy[start:]).
void score_chunk(const at::Tensor& z, const at::Tensor& targets, at::Tensor& logp,
                 at::Tensor& entropy, int64_t start) {
  at::Tensor lse = z.logsumexp(-1);
  const int64_t len = z.size(0);
  logp.narrow(0, start, len).copy_(z.gather(1, targets.view({-1, 1})).squeeze(1) - lse);
  if (entropy.defined()) {
    entropy.narrow(0, start, len).copy_(lse - (torch::softmax(z, -1) * z).sum(-1));
  }
}

class ChunkedTokenScores : public torch::autograd::Function<ChunkedTokenScores> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& hidden,
                               const at::Tensor& weight, const at::Tensor& targets,
                               double temperature, int64_t chunk, bool with_entropy,
                               int64_t keep_bytes) {
    const int64_t n = hidden.size(0);
    auto f32 = hidden.options().dtype(torch::kFloat32);
    at::Tensor logp = torch::empty({n}, f32);
    at::Tensor entropy = with_entropy ? torch::empty({n}, f32) : at::Tensor();
    // The dtype the product ran in (autocast may lower it); backward
    // recomputes in the same one.
    c10::ScalarType compute = hidden.scalar_type();
    // The first chunks' log-softmax, kept for backward while they fit in
    // keep_bytes: backward then skips their logits' recomputation.
    variable_list kept;
    {
      torch::NoGradGuard no_grad;
      int64_t kept_bytes = 0;
      for (int64_t start = 0; start < n; start += chunk) {
        const int64_t len = std::min(chunk, n - start);
        at::Tensor h = hidden.narrow(0, start, len);
        at::Tensor raw = torch::nn::functional::linear(h, weight);
        compute = raw.scalar_type();
        at::Tensor z = raw.to(torch::kFloat32);
        if (temperature != 1.0) z = z / temperature;
        score_chunk(z, targets.narrow(0, start, len), logp, entropy, start);
        const int64_t bytes = z.numel() * 4;
        if (static_cast<int64_t>(kept.size()) * chunk == start &&
            kept_bytes + bytes <= keep_bytes) {
          kept.push_back(torch::log_softmax(z, -1));
          kept_bytes += bytes;
        }
      }
    }
    variable_list saved = {hidden, weight, targets};
    saved.insert(saved.end(), kept.begin(), kept.end());
    ctx->save_for_backward(saved);
    ctx->saved_data["temperature"] = temperature;
    ctx->saved_data["chunk"] = chunk;
    ctx->saved_data["compute"] = static_cast<int64_t>(compute);
    return {logp, with_entropy ? entropy : torch::zeros({0}, f32)};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& hidden = saved[0];
    const at::Tensor& weight = saved[1];
    const at::Tensor& targets = saved[2];
    const double temperature = ctx->saved_data["temperature"].toDouble();
    const int64_t chunk = ctx->saved_data["chunk"].toInt();
    const auto compute = static_cast<c10::ScalarType>(ctx->saved_data["compute"].toInt());
    const size_t kept = saved.size() - 3;  // chunks whose log-softmax forward kept
    const at::Tensor& g_logp = grads[0];
    const at::Tensor& g_ent = grads[1];
    const bool need_h = ctx->needs_input_grad(0), need_w = ctx->needs_input_grad(1);

    torch::NoGradGuard no_grad;
    const int64_t n = hidden.size(0);
    at::Tensor w = weight.to(compute);
    // dW accumulates in place (beta = 1) when it has the product's dtype: no
    // [V, H] temporary per chunk (545 MB for Qwen2.5-0.5B's head), which
    // also spares the BLAS zeroing one and the kernel mapping it afresh.
    const bool w_in_place = weight.scalar_type() == compute;
    at::Tensor g_hidden = need_h ? torch::empty(hidden.sizes(), hidden.options()) : at::Tensor();
    at::Tensor g_weight;
    if (need_w) {
      g_weight = w_in_place ? torch::empty(weight.sizes(), weight.options())
                            : torch::zeros(weight.sizes(), weight.options());
    }
    const bool ent = g_ent.defined() && g_ent.numel() > 0;
    for (int64_t start = 0; start < n; start += chunk) {
      const int64_t len = std::min(chunk, n - start);
      at::Tensor h = hidden.narrow(0, start, len).to(compute);
      at::Tensor logp_all;
      const size_t index = static_cast<size_t>(start / chunk);
      if (index < kept) {
        logp_all = saved[3 + index];
      } else {
        at::Tensor z = torch::nn::functional::linear(h, w).to(torch::kFloat32);
        if (temperature != 1.0) z = z / temperature;
        logp_all = torch::log_softmax(z, -1);
      }
      at::Tensor p = logp_all.exp();
      at::Tensor t = targets.narrow(0, start, len).view({-1, 1});
      // gz = dL/dz, built in place over the chunk's buffers:
      //   from logp:     g (onehot - p)
      //   from entropy:  -g_H p (log p + H)
      at::Tensor gz;
      if (ent) {
        at::Tensor H = -(p * logp_all).sum(-1, /*keepdim=*/true);
        at::Tensor g_h = g_ent.narrow(0, start, len).to(torch::kFloat32).view({-1, 1});
        // A kept chunk's buffer is autograd's saved tensor: not written.
        gz = (index < kept ? logp_all.add(H) : logp_all.add_(H)).mul_(p).mul_(-g_h);
        if (g_logp.defined()) {
          at::Tensor g = g_logp.narrow(0, start, len).to(torch::kFloat32).view({-1, 1});
          gz.sub_(p.mul_(g));
          gz.scatter_add_(1, t, g);
        }
      } else {
        logp_all.reset();
        if (g_logp.defined()) {
          at::Tensor g = g_logp.narrow(0, start, len).to(torch::kFloat32).view({-1, 1});
          gz = p.mul_(-g);
          gz.scatter_add_(1, t, g);
        } else {
          gz = p.zero_();
        }
      }
      p.reset();
      if (temperature != 1.0) gz.div_(temperature);
      at::Tensor gzc = gz.to(compute);
      gz.reset();
      if (need_h) {
        at::Tensor dst = g_hidden.narrow(0, start, len);  // rows of a contiguous tensor
        if (g_hidden.scalar_type() == compute) {
          torch::mm_out(dst, gzc, w);
        } else {
          dst.copy_(torch::mm(gzc, w));
        }
      }
      if (need_w) {
        if (!w_in_place) {
          g_weight.add_(torch::mm(gzc.t(), h).to(weight.scalar_type()));
        } else if (start == 0) {
          torch::mm_out(g_weight, gzc.t(), h);
        } else {
          g_weight.addmm_(gzc.t(), h);
        }
      }
    }
    return {g_hidden,     g_weight,     at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

int64_t lm_head_chunk_tokens(int64_t vocab) {
  constexpr int64_t kChunkBytes = int64_t{256} << 20;
  const int64_t fit = kChunkBytes / (std::max<int64_t>(1, vocab) * 4);
  return std::clamp<int64_t>(fit, 16, 1024);
}

TokenScores lm_head_token_scores(const at::Tensor& hidden, const at::Tensor& weight,
                                 const at::Tensor& targets, double temperature,
                                 int64_t chunk_tokens, bool with_entropy, int64_t keep_bytes) {
  TORCH_CHECK(hidden.dim() == 2 && weight.dim() == 2 && hidden.size(1) == weight.size(1),
              "lm_head_token_scores: hidden ", hidden.sizes(), " and weight ", weight.sizes(),
              " do not fit");
  TORCH_CHECK(targets.numel() == hidden.size(0), "lm_head_token_scores: ", targets.numel(),
              " targets for ", hidden.size(0), " positions");
  TORCH_CHECK(chunk_tokens >= 1, "lm_head_token_scores: chunk_tokens must be >= 1");
  TORCH_CHECK(keep_bytes >= 0, "lm_head_token_scores: keep_bytes must be >= 0");
  at::Tensor t = targets.to(hidden.device(), torch::kInt64).reshape({-1});
  TokenScores out;
  const bool grad =
      torch::GradMode::is_enabled() && (hidden.requires_grad() || weight.requires_grad());
  if (!grad) {
    const int64_t n = hidden.size(0);
    auto f32 = hidden.options().dtype(torch::kFloat32);
    out.logprobs = torch::empty({n}, f32);
    if (with_entropy) out.entropy = torch::empty({n}, f32);
    for (int64_t start = 0; start < n; start += chunk_tokens) {
      const int64_t len = std::min(chunk_tokens, n - start);
      score_chunk(chunk_logits(hidden.narrow(0, start, len), weight, temperature),
                  t.narrow(0, start, len), out.logprobs, out.entropy, start);
    }
    return out;
  }
  variable_list r = ChunkedTokenScores::apply(hidden, weight, t, temperature, chunk_tokens,
                                              with_entropy, keep_bytes);
  out.logprobs = r[0];
  if (with_entropy) out.entropy = r[1];
  return out;
}

}  // namespace relay::model
