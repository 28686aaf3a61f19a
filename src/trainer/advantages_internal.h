#pragma once

// What the advantage code shares (private to src/trainer): the fp64 casts
// the estimators compute in, and the input checks behind compute_advantages
// and the data controls (defined in advantage_inputs.cc).

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

#include "relay/common/status.h"
#include "relay/trainer/advantages.h"

namespace relay::trainer::internal {

inline at::Tensor as_f64(const at::Tensor& t) { return t.to(at::kDouble); }
inline at::Tensor mask_f64(const at::Tensor& mask) { return mask.ne(0).to(at::kDouble); }

// "[4, 7]", for messages.
std::string shape_str(const at::Tensor& t);

// The element types an input may have; kMask = bool or numeric.
enum class Kind { kFloat, kInt, kBool, kMask };

// A per-trajectory tensor [B] of `kind` (finite when kFloat). InvalidArgument
// naming `name` otherwise.
Status check_vector(const char* name, const at::Tensor& t, int64_t batch, Kind kind);
// The response mask: 2-D [B, L], bool or numeric.
Status check_mask(const at::Tensor& mask);
// Every input estimator `e` reads is present, shaped like the mask and of
// its type; and the batch is one `e` can run on (enough tokens to whiten,
// two samples per group for grpo_passk).
Status validate_inputs(const AdvantageInputs& in, AdvantageEstimator e);

}  // namespace relay::trainer::internal
