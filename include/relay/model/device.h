#pragma once

// Where a process computes (run.device) and in which precision its forward
// passes run (run.autocast). Kept apart from the model code: a policy is
// device-agnostic (its inputs follow its weights), and only the binaries
// decide where the weights live.

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <optional>
#include <string>

#include "relay/common/status.h"

namespace relay::model {

// True when this build has CUDA (RELAY_WITH_CUDA) and a GPU is visible.
bool cuda_available();

// "cpu", "cuda" (= cuda:<local_rank>, one GPU per rank on a node) or
// "cuda:<i>". InvalidArgument naming run.device for anything else, for cuda
// in a build without CUDA or on a machine without a GPU, and for an index
// past the visible GPUs.
StatusOr<c10::Device> parse_device(const std::string& name, int local_rank = 0);

// run.autocast: "none" (nullopt), "bfloat16" or "float16".
StatusOr<std::optional<c10::ScalarType>> parse_autocast(const std::string& name);

// Runs the forward passes of its scope under autocast for `device_type`
// (CPU or CUDA) in `dtype`: matrix products in the low precision, other ops
// as LibTorch's per-device autocast lists say. (Policy::score casts the
// logits to fp32 itself, so log-probs and entropies are fp32 either way.)
// Nothing when `dtype` is empty. Scopes nest; the cast-weight cache is
// cleared when the outermost one ends, as torch.autocast does. Autocast
// state is per thread: open the guard on the thread that runs the model.
class AutocastGuard {
 public:
  AutocastGuard(c10::DeviceType device_type, std::optional<c10::ScalarType> dtype);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  bool active_ = false;
  bool cuda_ = false;
  bool was_enabled_ = false;
  c10::ScalarType was_dtype_ = c10::ScalarType::Float;
};

}  // namespace relay::model
