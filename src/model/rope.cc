#include "relay/model/rope.h"

#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <cmath>

namespace relay::model {
namespace {

// arange(0, d, 2) as int64, then fp32, divided by d: the exponent of every
// rope type's base frequencies.
at::Tensor exponents(int64_t dim) {
  return torch::arange(0, dim, 2, torch::kInt64).to(torch::kFloat32) / static_cast<double>(dim);
}

// 1 / base^(2i / d) in fp32, as transformers writes it.
at::Tensor base_inv_freq(double base, int64_t dim) {
  return 1.0 / torch::pow(torch::scalar_tensor(base, torch::kFloat32), exponents(dim));
}

double yarn_mscale(double scale, double mscale) {
  return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

RopeFrequencies yarn(const PolicyConfig& c, int64_t dim) {
  const RopeScaling& r = c.rope_scaling;
  const double base = c.rope_theta, factor = r.factor;
  const double original = r.original_max_position_embeddings > 0
                              ? static_cast<double>(r.original_max_position_embeddings)
                              : static_cast<double>(c.max_position_embeddings);
  RopeFrequencies out;
  if (r.attention_factor > 0) {
    out.attention_scaling = r.attention_factor;
  } else if (r.mscale > 0 && r.mscale_all_dim > 0) {
    out.attention_scaling = yarn_mscale(factor, r.mscale) / yarn_mscale(factor, r.mscale_all_dim);
  } else {
    out.attention_scaling = yarn_mscale(factor, 1.0);
  }
  // The dimension at which a frequency makes `rotations` turns over the
  // original context.
  auto correction_dim = [&](double rotations) {
    return (dim * std::log(original / (rotations * 2 * M_PI))) / (2 * std::log(base));
  };
  double low = correction_dim(r.beta_fast), high = correction_dim(r.beta_slow);
  if (r.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;  // transformers' guard against a zero-width ramp

  at::Tensor pos_freqs = torch::pow(torch::scalar_tensor(base, torch::kFloat32), exponents(dim));
  at::Tensor extrapolation = 1.0 / pos_freqs;
  at::Tensor interpolation = 1.0 / (factor * pos_freqs);
  at::Tensor ramp =
      ((torch::arange(dim / 2, torch::kFloat32) - low) / (high - low)).clamp(0.0, 1.0);
  at::Tensor extrapolation_factor = 1 - ramp;
  out.inv_freq = interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor;
  return out;
}

at::Tensor llama3(const PolicyConfig& c, int64_t dim) {
  const RopeScaling& r = c.rope_scaling;
  const double old_context = r.original_max_position_embeddings > 0
                                 ? static_cast<double>(r.original_max_position_embeddings)
                                 : static_cast<double>(c.max_position_embeddings);
  const double low_wavelen = old_context / r.low_freq_factor;
  const double high_wavelen = old_context / r.high_freq_factor;
  at::Tensor inv_freq = base_inv_freq(c.rope_theta, dim);
  at::Tensor wavelen = (2 * M_PI) / inv_freq;
  // Long wavelengths are interpolated (/ factor), short ones kept, and the
  // band between them blended smoothly.
  at::Tensor scaled = torch::where(wavelen.gt(low_wavelen), inv_freq / r.factor, inv_freq);
  at::Tensor smooth =
      (old_context / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
  at::Tensor smoothed = (1 - smooth) * scaled / r.factor + smooth * scaled;
  at::Tensor medium =
      wavelen.lt(high_wavelen).logical_not().logical_and(wavelen.gt(low_wavelen).logical_not());
  return torch::where(medium, smoothed, scaled);
}

at::Tensor dynamic(const PolicyConfig& c, int64_t dim, int64_t seq_len) {
  const RopeScaling& r = c.rope_scaling;
  const int64_t max_pos = c.max_position_embeddings;
  if (seq_len <= max_pos) {
    // transformers' value at construction, in Python floats: the scaled base
    // at L = M, which is theta up to rounding.
    const double ratio =
        (r.factor * static_cast<double>(max_pos)) / static_cast<double>(max_pos) - (r.factor - 1);
    const double base =
        c.rope_theta * std::pow(ratio, static_cast<double>(dim) / static_cast<double>(dim - 2));
    return base_inv_freq(base, dim);
  }
  // Past M transformers recomputes from a tensor length, in fp32.
  at::Tensor L = torch::scalar_tensor(seq_len, torch::kInt64);
  at::Tensor ratio = (r.factor * L) / static_cast<double>(max_pos) - (r.factor - 1);
  at::Tensor base =
      c.rope_theta * ratio.pow(static_cast<double>(dim) / static_cast<double>(dim - 2));
  return 1.0 / base.pow(exponents(dim));
}

}  // namespace

RopeFrequencies rope_frequencies(const PolicyConfig& config, int64_t seq_len) {
  const int64_t dim = config.resolved_head_dim();
  const std::string& type = config.rope_scaling.rope_type;
  RopeFrequencies out;
  if (type == "yarn") return yarn(config, dim);
  if (type == "llama3") {
    out.inv_freq = llama3(config, dim);
  } else if (type == "linear") {
    out.inv_freq = base_inv_freq(config.rope_theta, dim) / config.rope_scaling.factor;
  } else if (type == "dynamic") {
    out.inv_freq = dynamic(config, dim, seq_len);
  } else {
    out.inv_freq = base_inv_freq(config.rope_theta, dim);
  }
  return out;
}

at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& positions, const at::Tensor& inv_freq,
                      double attention_scaling) {
  // freqs [B, T, D/2] -> emb [B, T, D] = cat(freqs, freqs); cos/sin in fp32.
  at::Tensor freqs = positions.to(torch::kFloat32).unsqueeze(-1) * inv_freq;
  at::Tensor emb = torch::cat({freqs, freqs}, -1);
  at::Tensor cos = emb.cos(), sin = emb.sin();
  if (attention_scaling != 1.0) {
    cos = cos * attention_scaling;
    sin = sin * attention_scaling;
  }
  cos = cos.unsqueeze(1).to(x.scalar_type());
  sin = sin.unsqueeze(1).to(x.scalar_type());
  const int64_t half = x.size(-1) / 2;
  at::Tensor rotated = torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * cos + rotated * sin;
}

}  // namespace relay::model
