#include "relay/comm/weight_sync/weight_publisher.h"

#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "relay/model/safetensors.h"

namespace relay::comm {

WeightPublisher::WeightPublisher(int keep) : keep_(std::max(1, keep)) {}

Status WeightPublisher::publish(int64_t version,
                                const std::unordered_map<std::string, at::Tensor>& tensors) {
  const int64_t latest = latest_version();
  if (version <= latest) {
    return InvalidArgumentError(absl::StrCat("publish: version ", version,
                                             " is not above the latest published (", latest, ")"));
  }
  auto snap = std::make_shared<WeightSnapshot>();
  std::unordered_map<std::string, at::Tensor> host;
  for (const auto& [name, t] : tensors) {
    host.emplace(name, t.detach().to(torch::kCPU).contiguous().clone());
  }
  RELAY_ASSIGN_OR_RETURN(snap->manifest, model::weight_manifest(host, version));
  for (const model::TensorSpec& spec : snap->manifest.tensors) {
    snap->tensors.push_back(host.at(spec.name));
    snap->total_bytes += spec.num_bytes;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    snapshots_.push_back(std::move(snap));
    while (static_cast<int>(snapshots_.size()) > keep_) snapshots_.pop_front();
  }
  cv_.notify_all();
  return OkStatus();
}

int64_t WeightPublisher::latest_locked() const {
  return snapshots_.empty() ? -1 : snapshots_.back()->manifest.version;
}

int64_t WeightPublisher::latest_version() const {
  std::lock_guard<std::mutex> lock(mu_);
  return latest_locked();
}

StatusOr<std::shared_ptr<const WeightSnapshot>> WeightPublisher::snapshot(int64_t version) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (snapshots_.empty()) return NotFoundError("weights: nothing published yet");
  if (version < 0) return snapshots_.back();
  for (const auto& s : snapshots_) {
    if (s->manifest.version == version) return s;
  }
  return NotFoundError(absl::StrCat("weights: version ", version, " is not kept (latest ",
                                    snapshots_.back()->manifest.version, ")"));
}

int64_t WeightPublisher::wait_for_version(int64_t after, std::chrono::milliseconds timeout,
                                          const std::function<bool()>& stop) const {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return latest_locked() > after || (stop && stop());
  });
  return latest_locked();
}

void WeightPublisher::wake_waiters() const {
  // Taking the lock orders this after any waiter's look at `stop`: one that
  // looked before the flag was set is asleep by now and gets the notify.
  { std::lock_guard<std::mutex> lock(mu_); }
  cv_.notify_all();
}

void for_each_chunk(const WeightSnapshot& snapshot, uint64_t chunk_bytes,
                    const std::function<bool(uint64_t, const char*, uint64_t)>& emit) {
  chunk_bytes = std::max<uint64_t>(1, chunk_bytes);
  std::string buffer;
  uint64_t offset = 0;  // of buffer's first byte
  for (size_t i = 0; i < snapshot.tensors.size(); ++i) {
    const char* data = static_cast<const char*>(snapshot.tensors[i].data_ptr());
    uint64_t left = snapshot.manifest.tensors[i].num_bytes;
    while (left > 0) {
      const uint64_t take = std::min<uint64_t>(left, chunk_bytes - buffer.size());
      buffer.append(data, take);
      data += take;
      left -= take;
      if (buffer.size() == chunk_bytes) {
        if (!emit(offset, buffer.data(), buffer.size())) return;
        offset += buffer.size();
        buffer.clear();
      }
    }
  }
  if (!buffer.empty()) emit(offset, buffer.data(), buffer.size());
}

StatusOr<WeightAssembler> WeightAssembler::create(model::WeightManifest manifest) {
  WeightAssembler a;
  for (const model::TensorSpec& spec : manifest.tensors) {
    RELAY_ASSIGN_OR_RETURN(model::DType dtype, model::parse_dtype(spec.dtype));
    at::Tensor t =
        torch::empty(spec.shape, torch::TensorOptions().dtype(model::to_scalar_type(dtype)));
    if (static_cast<uint64_t>(t.numel()) * t.element_size() != spec.num_bytes) {
      return DataLossError(absl::StrCat("weights version ", manifest.version, ": ", spec.name, ": ",
                                        spec.num_bytes, " bytes do not fit shape and dtype"));
    }
    a.total_ += spec.num_bytes;
    a.tensors_.push_back(std::move(t));
  }
  a.manifest_ = std::move(manifest);
  return a;
}

Status WeightAssembler::add(uint64_t offset, const char* data, uint64_t size) {
  if (offset != received_) {
    return DataLossError(absl::StrCat("weights version ", manifest_.version, ": bytes at offset ",
                                      offset, " after ", received_));
  }
  if (size > total_ - received_) {
    return DataLossError(absl::StrCat("weights version ", manifest_.version, ": received ",
                                      received_ + size, " bytes, the manifest says ", total_));
  }
  while (size > 0) {
    const uint64_t room = manifest_.tensors[tensor_].num_bytes - tensor_done_;
    const uint64_t take = std::min(room, size);
    std::memcpy(static_cast<char*>(tensors_[tensor_].data_ptr()) + tensor_done_, data, take);
    data += take;
    size -= take;
    received_ += take;
    tensor_done_ += take;
    if (tensor_done_ == manifest_.tensors[tensor_].num_bytes) {
      ++tensor_;
      tensor_done_ = 0;
    }
  }
  return OkStatus();
}

StatusOr<std::unordered_map<std::string, at::Tensor>> WeightAssembler::finish() {
  if (received_ != total_) {
    return DataLossError(absl::StrCat("weights version ", manifest_.version, ": received ",
                                      received_, " bytes, the manifest says ", total_));
  }
  std::unordered_map<std::string, at::Tensor> out;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    out.emplace(manifest_.tensors[i].name, std::move(tensors_[i]));
  }
  tensors_.clear();
  RELAY_ASSIGN_OR_RETURN(model::WeightManifest check,
                         model::weight_manifest(out, manifest_.version));
  if (check.digest != manifest_.digest) {
    return DataLossError(absl::StrCat("weights version ", manifest_.version, ": digest ",
                                      check.digest, " of the received bytes is not the published ",
                                      manifest_.digest));
  }
  return out;
}

StatusOr<std::unordered_map<std::string, at::Tensor>> tensors_from_bytes(
    const model::WeightManifest& manifest, const std::string& bytes) {
  RELAY_ASSIGN_OR_RETURN(WeightAssembler a, WeightAssembler::create(manifest));
  RELAY_RETURN_IF_ERROR(a.add(0, bytes.data(), bytes.size()));
  return a.finish();
}

}  // namespace relay::comm
