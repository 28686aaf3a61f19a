#pragma once

// Where a process computes (run.device) and in which precision its forward
// passes run (run.autocast). Kept apart from the model code: a policy is
// device-agnostic (its inputs follow its weights), and only the binaries
// decide where the weights live.

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <optional>
#include <string>

#include "relay/common/status.h"
#include "relay/model/precision.h"

namespace relay::model {

// True when this build has CUDA (RELAY_WITH_CUDA) and a GPU is visible.
bool cuda_available();

// Bytes of memory this process could still allocate on `device`: on the CPU
// the kernel's MemAvailable, or the cgroup's limit minus its usage when that
// is less; on a GPU the device's free memory. -1 when it cannot be read.
int64_t free_memory_bytes(c10::Device device);

// This process's resident set and its peak since start (or since the last
// reset_peak_rss()), in bytes, from /proc/self/status; -1 when unreadable.
int64_t current_rss_bytes();
int64_t peak_rss_bytes();
// Restarts the peak from the current resident set (Linux >= 4.0); false
// when the kernel refused.
bool reset_peak_rss();

// The caching allocator's peak of bytes in tensors on a GPU since the last
// reset_device_peak(); -1 on the CPU or without CUDA.
int64_t device_peak_bytes(c10::Device device);
void reset_device_peak(c10::Device device);

// "cpu", "cuda" (= cuda:<local_rank>, one GPU per rank on a node) or
// "cuda:<i>". InvalidArgument naming run.device for anything else, for cuda
// in a build without CUDA or on a machine without a GPU, and for an index
// past the visible GPUs.
StatusOr<c10::Device> parse_device(const std::string& name, int local_rank = 0);

// model.dtype as a tensor type.
c10::ScalarType scalar_type(Precision precision);

// run.autocast as the precision AutocastGuard takes: nullopt for kNone.
std::optional<c10::ScalarType> autocast_type(Autocast autocast);

// The autocast precision in force on this thread for `device_type` (CPU or
// CUDA), or nullopt when autocast is off there.
std::optional<c10::ScalarType> current_autocast(c10::DeviceType device_type);

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
