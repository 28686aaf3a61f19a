#include "relay/trainer/rollout_correction.h"

#include <torch/types.h>
#include <torch/utils.h>

#include <cmath>
#include <sstream>

namespace relay::trainer {
namespace {

std::string shape_of(const at::Tensor& t) {
  std::ostringstream os;
  os << t.sizes();
  return os.str();
}

// "[b, j]" of the first true entry of a [B, L] bool tensor.
std::string first_index(const at::Tensor& flags) {
  at::Tensor idx = flags.nonzero();
  return absl::StrCat("[", idx[0][0].item<int64_t>(), ", ", idx[0][1].item<int64_t>(), "]");
}

double ratio_or_zero(double num, double den) { return den > 0 ? num / den : 0.0; }

Status check_shape(const at::Tensor& t, const char* name, const at::Tensor& like) {
  if (!t.defined()) return InvalidArgumentError(absl::StrCat(name, ": undefined tensor"));
  if (t.sizes() != like.sizes()) {
    return InvalidArgumentError(absl::StrCat(name, ": shape ", shape_of(t),
                                             " does not match behavior_logprobs ", shape_of(like)));
  }
  return OkStatus();
}

// Masked log-probs must be finite: a NaN or inf there would turn every
// aggregate it touches (a sequence weight, the batch mean) into NaN.
Status check_finite(const at::Tensor& logp, const char* name, const at::Tensor& mask) {
  at::Tensor bad_entries = logp.isfinite().logical_not().logical_and(mask);
  const int64_t n = bad_entries.sum().item<int64_t>();
  if (n == 0) return OkStatus();
  return InvalidArgumentError(absl::StrCat(
      name, ": ", n, " masked entries are not finite (first at ", first_index(bad_entries), ")"));
}

Status check_inputs(const RolloutCorrectionInputs& in, const RolloutCorrectionOptions& o) {
  const at::Tensor& behav = in.behavior_logprobs;
  if (!behav.defined() || behav.dim() != 2 || !at::isFloatingType(behav.scalar_type())) {
    return InvalidArgumentError(absl::StrCat(
        "behavior_logprobs: must be a [B, L] floating-point tensor, got ",
        behav.defined() ? absl::StrCat(shape_of(behav), " ", c10::toString(behav.scalar_type()))
                        : std::string("undefined")));
  }
  RELAY_RETURN_IF_ERROR(check_shape(in.response_mask, "response_mask", behav));
  if (in.old_logprobs.defined() || !o.bypass) {
    RELAY_RETURN_IF_ERROR(check_shape(in.old_logprobs, "old_logprobs", behav));
    if (!at::isFloatingType(in.old_logprobs.scalar_type())) {
      return InvalidArgumentError(absl::StrCat("old_logprobs: must be floating-point, got ",
                                               c10::toString(in.old_logprobs.scalar_type())));
    }
  }
  if (in.token_versions.defined()) {
    RELAY_RETURN_IF_ERROR(check_shape(in.token_versions, "token_versions", behav));
    if (!c10::isIntegralType(in.token_versions.scalar_type(), /*includeBool=*/false)) {
      return InvalidArgumentError(absl::StrCat("token_versions: must be an integer tensor, got ",
                                               c10::toString(in.token_versions.scalar_type())));
    }
  }
  at::Tensor mask =
      in.response_mask.scalar_type() == torch::kBool ? in.response_mask : in.response_mask.ne(0);
  RELAY_RETURN_IF_ERROR(check_finite(behav, "behavior_logprobs", mask));
  if (in.old_logprobs.defined())
    RELAY_RETURN_IF_ERROR(check_finite(in.old_logprobs, "old_logprobs", mask));
  if (in.token_versions.defined()) {
    // A version outside [0, trainer_version] is a bookkeeping bug upstream;
    // attributing it to engine or staleness would hide it.
    at::Tensor v = in.token_versions.to(torch::kLong);
    at::Tensor negative = v.lt(0).logical_and(mask);
    if (negative.any().item<bool>()) {
      return InvalidArgumentError(absl::StrCat(
          "token_versions: masked token at ", first_index(negative),
          " has a negative version; every trained token needs the version that sampled it"));
    }
    at::Tensor future = v.gt(in.trainer_version).logical_and(mask);
    if (future.any().item<bool>()) {
      at::Tensor idx = future.nonzero();
      const int64_t b = idx[0][0].item<int64_t>(), j = idx[0][1].item<int64_t>();
      return InvalidArgumentError(absl::StrCat("token_versions: masked token at [", b, ", ", j,
                                               "] has version ", v[b][j].item<int64_t>(),
                                               " > trainer_version ", in.trainer_version));
    }
  }
  return OkStatus();
}

// Per-sequence aggregate [B, 1] of a per-token statistic over `mask`: the sum
// (sequence level) or the mean over the sequence's masked tokens (geometric).
at::Tensor aggregate(const at::Tensor& x, const at::Tensor& mask, CorrectionLevel level) {
  at::Tensor s = torch::where(mask, x, torch::zeros_like(x)).sum(-1, /*keepdim=*/true);
  if (level == CorrectionLevel::kGeometric) {
    s = s / mask.sum(-1, /*keepdim=*/true).to(s.scalar_type()).clamp_min(1.0);
  }
  return s;
}

// true where the token passes the rejection test ([B, L]). `log_r` is raw
// (finite, 0 outside the mask); comparisons of the ratio happen in log space,
// so they need no clamp.
at::Tensor rejection_pass(const at::Tensor& log_r, const at::Tensor& mask,
                          const RolloutCorrectionOptions& o) {
  at::Tensor stat;
  switch (o.rs_criterion) {
    case RejectionCriterion::kRatio:
      stat = log_r;
      break;
    case RejectionCriterion::kK1:
      stat = -log_r;
      break;
    case RejectionCriterion::kK2:
      stat = 0.5 * log_r.square();
      break;
    case RejectionCriterion::kK3: {
      at::Tensor c = log_r.clamp(-o.log_clamp, o.log_clamp);
      stat = c.exp() - 1.0 - c;
      break;
    }
  }
  if (o.rs_level != CorrectionLevel::kToken) stat = aggregate(stat, mask, o.rs_level);
  at::Tensor pass;
  switch (o.rs_criterion) {
    case RejectionCriterion::kRatio: {
      const double lower = o.rs_threshold_lower > 0 ? o.rs_threshold_lower : 1.0 / o.rs_threshold;
      pass = stat.ge(std::log(lower)).logical_and(stat.le(std::log(o.rs_threshold)));
      break;
    }
    case RejectionCriterion::kK1:
      pass = stat.abs().le(o.rs_threshold);
      break;
    case RejectionCriterion::kK2:
    case RejectionCriterion::kK3:
      pass = stat.le(o.rs_threshold);
      break;
  }
  return pass.expand_as(mask);
}

MismatchStats mismatch_stats(const at::Tensor& log_r, const at::Tensor& sel, double log_clamp) {
  MismatchStats s;
  at::Tensor l = log_r.masked_select(sel);
  s.num_tokens = l.numel();
  if (s.num_tokens == 0) return s;
  at::Tensor c = l.clamp(-log_clamp, log_clamp);
  at::Tensor r = c.exp();
  s.k1 = (-l).mean().item<double>();
  s.k3 = (r - 1.0 - c).mean().item<double>();
  s.abs_log_ratio_mean = l.abs().mean().item<double>();
  s.abs_log_ratio_max = l.abs().max().item<double>();
  s.ratio_mean = r.mean().item<double>();
  return s;
}

void put(std::map<std::string, double>& out, const std::string& prefix, const MismatchStats& s) {
  out[prefix + "/num_tokens"] = static_cast<double>(s.num_tokens);
  out[prefix + "/k1"] = s.k1;
  out[prefix + "/k3"] = s.k3;
  out[prefix + "/abs_log_ratio_mean"] = s.abs_log_ratio_mean;
  out[prefix + "/abs_log_ratio_max"] = s.abs_log_ratio_max;
  out[prefix + "/ratio_mean"] = s.ratio_mean;
}

// What every step of rollout_correction reads: the mask as bool, the raw
// log r = log pi_old - log pi_behav in float64 (0 outside the mask, so padding,
// possibly NaN, never reaches a sum; 0 everywhere without old_logprobs), and
// the token and sequence counts the fractions divide by.
struct Ratios {
  at::Tensor mask;   // [B, L] bool
  at::Tensor log_r;  // [B, L] float64
  double n_tokens = 0;
  double n_seqs = 0;  // sequences with at least one masked token
};

Ratios log_ratios(const RolloutCorrectionInputs& in) {
  Ratios r;
  r.mask =
      in.response_mask.scalar_type() == torch::kBool ? in.response_mask : in.response_mask.ne(0);
  const at::Tensor behav = in.behavior_logprobs.detach().to(torch::kFloat64);
  r.log_r = torch::zeros_like(behav);
  if (in.old_logprobs.defined()) {
    r.log_r = torch::where(r.mask, in.old_logprobs.detach().to(torch::kFloat64) - behav, r.log_r);
  }
  r.n_tokens = r.mask.sum().item<double>();
  r.n_seqs = r.mask.any(-1).sum().item<double>();
  return r;
}

// Diagnostics over the input mask: how far behind the trainer the tokens are,
// and the mismatch split into engine (same version) and staleness (older).
void measure_mismatch(const RolloutCorrectionInputs& in, const RolloutCorrectionOptions& o,
                      const Ratios& r, RolloutCorrectionMetrics& m) {
  at::Tensor engine = r.mask;
  at::Tensor stale = torch::zeros_like(r.mask);
  if (in.token_versions.defined()) {
    at::Tensor v = in.token_versions.to(torch::kLong);
    engine = v.eq(in.trainer_version).logical_and(r.mask);
    stale = v.lt(in.trainer_version).logical_and(r.mask);
    if (r.n_tokens > 0) {
      at::Tensor lag = (in.trainer_version - v).masked_select(r.mask).to(torch::kFloat64);
      m.version_lag_mean = lag.mean().item<double>();
      m.version_lag_max = lag.max().item<double>();
    }
  }
  if (in.old_logprobs.defined()) {
    m.all = mismatch_stats(r.log_r, r.mask, o.log_clamp);
    m.engine = mismatch_stats(r.log_r, engine, o.log_clamp);
    m.staleness = mismatch_stats(r.log_r, stale, o.log_clamp);
  }
}

// The tokens kept after rejection and veto ([B, L] bool). In bypass mode
// pi_old is pi_behav: log r = 0, which passes every test, so they are skipped.
at::Tensor reject(const RolloutCorrectionOptions& o, const Ratios& r, RolloutCorrectionMetrics& m) {
  at::Tensor keep = r.mask;
  if (!o.bypass && o.rs_level != CorrectionLevel::kNone) {
    keep = keep.logical_and(rejection_pass(r.log_r, r.mask, o));
    at::Tensor removed = r.mask.logical_and(keep.logical_not());
    m.rs_rejected_token_fraction = ratio_or_zero(removed.sum().item<double>(), r.n_tokens);
    m.rs_rejected_sequence_fraction = ratio_or_zero(removed.any(-1).sum().item<double>(), r.n_seqs);
  }
  if (!o.bypass && o.veto_threshold > 0) {
    at::Tensor catastrophic = r.log_r.lt(std::log(o.veto_threshold)).logical_and(r.mask);
    at::Tensor vetoed = catastrophic.any(-1, /*keepdim=*/true);
    keep = keep.logical_and(vetoed.logical_not());
    m.veto_fraction = ratio_or_zero(vetoed.sum().item<double>(), r.n_seqs);
    m.catastrophic_token_fraction = ratio_or_zero(catastrophic.sum().item<double>(), r.n_tokens);
  }
  at::Tensor removed = r.mask.logical_and(keep.logical_not());
  m.rejected_token_fraction = ratio_or_zero(removed.sum().item<double>(), r.n_tokens);
  m.rejected_sequence_fraction = ratio_or_zero(removed.any(-1).sum().item<double>(), r.n_seqs);
  return keep;
}

// Truncated IS weights, [B, L] for the token level and [B, 1] per sequence
// otherwise, with where the truncation bit from above (high) and below (low).
struct IsWeights {
  at::Tensor w, high, low;
  bool per_sequence = false;
};

IsWeights is_weights(const RolloutCorrectionOptions& o, const Ratios& r) {
  const CorrectionLevel level = o.bypass ? CorrectionLevel::kNone : o.is_level;
  IsWeights iw;
  iw.per_sequence = level == CorrectionLevel::kSequence || level == CorrectionLevel::kGeometric;
  iw.w = torch::ones_like(r.log_r);
  iw.high = torch::zeros_like(r.mask);
  iw.low = torch::zeros_like(r.mask);
  if (level == CorrectionLevel::kNone) return iw;
  at::Tensor log_w = iw.per_sequence ? aggregate(r.log_r, r.mask, level) : r.log_r;
  at::Tensor raw = log_w.clamp(-o.log_clamp, o.log_clamp).exp();
  iw.high = raw.gt(o.is_threshold);
  if (o.is_mode == IsWeightMode::kClip) {
    const double lower = o.is_threshold_lower > 0 ? o.is_threshold_lower : 1.0 / o.is_threshold;
    iw.low = raw.lt(lower);
    iw.w = raw.clamp(lower, o.is_threshold);
  } else {
    iw.low = torch::zeros_like(iw.high);
    iw.w = raw.clamp_max(o.is_threshold);
  }
  return iw;
}

// Weight statistics over the kept units (tokens, or sequences for the
// sequence levels), and the optional division by their mean.
void summarize_weights(const RolloutCorrectionOptions& o, const at::Tensor& keep, IsWeights& iw,
                       RolloutCorrectionMetrics& m) {
  at::Tensor units = iw.per_sequence ? keep.any(-1, /*keepdim=*/true) : keep;
  at::Tensor uw = iw.w.masked_select(units);
  const int64_t n_units = uw.numel();
  if (n_units == 0) return;
  m.is_truncated_fraction_upper =
      iw.high.masked_select(units).to(torch::kFloat64).mean().item<double>();
  m.is_truncated_fraction_lower =
      iw.low.masked_select(units).to(torch::kFloat64).mean().item<double>();
  m.is_truncated_fraction = m.is_truncated_fraction_upper + m.is_truncated_fraction_lower;
  const double sum = uw.sum().item<double>();
  const double sum_sq = uw.square().sum().item<double>();
  m.is_weight_mean = sum / static_cast<double>(n_units);
  m.is_weight_min = uw.min().item<double>();
  m.is_weight_max = uw.max().item<double>();
  m.is_weight_ess = sum_sq > 0 ? sum * sum / (static_cast<double>(n_units) * sum_sq) : 0.0;
  if (o.is_batch_normalize && m.is_weight_mean > 0) {
    m.is_batch_norm_factor = m.is_weight_mean;
    iw.w = iw.w / m.is_batch_norm_factor;
  }
}

}  // namespace

// ------------------------------------------------------------------- names

// ----------------------------------------------------------------- options

// ---------------------------------------------------------------- the layer

StatusOr<RolloutCorrectionResult> rollout_correction(const RolloutCorrectionInputs& in,
                                                     const RolloutCorrectionOptions& o) {
  RELAY_RETURN_IF_ERROR(check_options(o, "rollout_correction"));
  RELAY_RETURN_IF_ERROR(check_inputs(in, o));

  const Ratios r = log_ratios(in);
  RolloutCorrectionResult result;
  result.anchor_logprobs = o.bypass ? in.behavior_logprobs : in.old_logprobs;
  measure_mismatch(in, o, r, result.metrics);
  const at::Tensor keep = reject(o, r, result.metrics);
  IsWeights iw = is_weights(o, r);
  summarize_weights(o, keep, iw, result.metrics);
  // w is finite (clamped), so multiplying by the mask is exact zeroing.
  result.weights = (iw.w * keep.to(torch::kFloat64)).to(torch::kFloat32);
  result.response_mask = keep.clone();  // never an alias of the caller's mask
  return result;
}

void append_metrics(const RolloutCorrectionMetrics& m, std::map<std::string, double>& out,
                    const std::string& prefix) {
  out[prefix + "rejected_token_fraction"] = m.rejected_token_fraction;
  out[prefix + "rejected_sequence_fraction"] = m.rejected_sequence_fraction;
  out[prefix + "rs/rejected_token_fraction"] = m.rs_rejected_token_fraction;
  out[prefix + "rs/rejected_sequence_fraction"] = m.rs_rejected_sequence_fraction;
  out[prefix + "veto_fraction"] = m.veto_fraction;
  out[prefix + "catastrophic_token_fraction"] = m.catastrophic_token_fraction;
  out[prefix + "is_truncated_fraction"] = m.is_truncated_fraction;
  out[prefix + "is_truncated_fraction/upper"] = m.is_truncated_fraction_upper;
  out[prefix + "is_truncated_fraction/lower"] = m.is_truncated_fraction_lower;
  out[prefix + "is_weight/mean"] = m.is_weight_mean;
  out[prefix + "is_weight/min"] = m.is_weight_min;
  out[prefix + "is_weight/max"] = m.is_weight_max;
  out[prefix + "is_weight/ess"] = m.is_weight_ess;
  out[prefix + "is_weight/batch_norm_factor"] = m.is_batch_norm_factor;
  put(out, prefix + "all", m.all);
  put(out, prefix + "engine", m.engine);
  put(out, prefix + "staleness", m.staleness);
  out[prefix + "version_lag/mean"] = m.version_lag_mean;
  out[prefix + "version_lag/max"] = m.version_lag_max;
}

}  // namespace relay::trainer
