#include "relay/comm/weight_sync/weight_publisher.h"

#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <cstring>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "relay/model/safetensors.h"

namespace relay::comm {

namespace {

// Copy and hash in pieces that stay in L2, so each byte is read from memory once.
constexpr uint64_t kPieceBytes = uint64_t{256} << 10;

}  // namespace

WeightPublisher::WeightPublisher(int keep, uint64_t block_bytes)
    : keep_(std::max(1, keep)), block_bytes_(std::max<uint64_t>(1, block_bytes)) {}

Status WeightPublisher::publish(int64_t version,
                                const std::unordered_map<std::string, at::Tensor>& tensors) {
  const int64_t latest = latest_version();
  if (version <= latest) {
    return InvalidArgumentError(absl::StrCat("publish: version ", version,
                                             " is not above the latest published (", latest, ")"));
  }
  auto snap = std::make_shared<WeightSnapshot>();
  RELAY_ASSIGN_OR_RETURN(snap->manifest, model::weight_manifest_without_digest(tensors, version));
  for (const model::TensorSpec& spec : snap->manifest.tensors) snap->total_bytes += spec.num_bytes;
  snap->payload = payload_for(snap->total_bytes);
  // However this ends, readers waiting on a rebuild are let go (after an
  // exception with nothing kept: the replaced version's payload is gone).
  absl::Cleanup end_rebuild = [this] {
    {
      std::lock_guard<std::mutex> lock(mu_);
      rebuilding_ = false;
    }
    cv_.notify_all();
  };
  snap->block_bytes = block_bytes_;
  Xxh3Stream digest;
  BlockHasher blocks(block_bytes_);
  auto record = [&](uint64_t, uint64_t sum) { snap->block_checksums.push_back(sum); };
  char* dst = static_cast<char*>(snap->payload.data_ptr());
  for (const model::TensorSpec& spec : snap->manifest.tensors) {
    // A no-op for a contiguous host tensor; a device one comes to the host first.
    const at::Tensor host = tensors.at(spec.name).detach().to(torch::kCPU).contiguous();
    const char* src = static_cast<const char*>(host.data_ptr());
    for (uint64_t at = 0; at < spec.num_bytes; at += kPieceBytes) {
      const uint64_t n = std::min(kPieceBytes, spec.num_bytes - at);
      std::memcpy(dst + at, src + at, n);
      digest.update(dst + at, n);
      blocks.update(dst + at, n, record);
    }
    dst += spec.num_bytes;
  }
  blocks.finish(record);
  snap->manifest.digest = digest.digest();
  snap->tensors = payload_tensors(snap->manifest, snap->payload);
  {
    std::lock_guard<std::mutex> lock(mu_);
    snapshots_.push_back(std::move(snap));
    while (static_cast<int>(snapshots_.size()) > keep_) snapshots_.pop_front();
    rebuilding_ = false;
  }
  return OkStatus();  // end_rebuild wakes the waiters
}

at::Tensor WeightPublisher::payload_for(uint64_t total_bytes) {
  std::shared_ptr<WeightSnapshot> oldest;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Evicted now rather than after the new version is in: readers still
    // find the keep - 1 newest meanwhile, and the peak stays at keep copies.
    if (static_cast<int>(snapshots_.size()) >= keep_ && snapshots_.front().use_count() == 1) {
      oldest = std::move(snapshots_.front());
      snapshots_.pop_front();
      if (snapshots_.empty()) {
        rebuilding_ = true;
        replaced_version_ = oldest->manifest.version;
      }
    }
  }
  at::Tensor payload;
  if (oldest) {
    payload = std::move(oldest->payload);
    oldest.reset();  // its tensors are views of the payload
  }
  return payload_buffer(std::move(payload), total_bytes);
}

at::Tensor payload_buffer(at::Tensor reuse, uint64_t bytes, bool* reused) {
  const bool ok = reuse.defined() && reuse.scalar_type() == at::kByte && reuse.dim() == 1 &&
                  reuse.is_cpu() && static_cast<uint64_t>(reuse.numel()) == bytes &&
                  reuse.use_count() == 1 && reuse.storage().use_count() == 1;
  if (reused != nullptr) *reused = ok;
  return ok ? std::move(reuse) : torch::empty({static_cast<int64_t>(bytes)}, torch::kUInt8);
}

int64_t WeightPublisher::latest_locked() const {
  if (snapshots_.empty()) return rebuilding_ ? replaced_version_ : -1;
  return snapshots_.back()->manifest.version;
}

int64_t WeightPublisher::latest_version() const {
  std::lock_guard<std::mutex> lock(mu_);
  return latest_locked();
}

StatusOr<std::shared_ptr<const WeightSnapshot>> WeightPublisher::snapshot(int64_t version) const {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !rebuilding_; });
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

std::vector<at::Tensor> payload_tensors(const model::WeightManifest& manifest,
                                        const at::Tensor& payload) {
  std::vector<at::Tensor> out;
  out.reserve(manifest.tensors.size());
  int64_t offset = 0;
  for (const model::TensorSpec& spec : manifest.tensors) {
    const c10::ScalarType type = model::to_scalar_type(model::parse_dtype(spec.dtype).value());
    const int64_t element = static_cast<int64_t>(c10::elementSize(type));
    const int64_t bytes = static_cast<int64_t>(spec.num_bytes);
    at::Tensor t;
    if (offset % element == 0 && bytes > 0) {
      t = payload.narrow(0, offset, bytes).view(type).view(spec.shape);
    } else {
      t = torch::empty(spec.shape, torch::TensorOptions().dtype(type));
      if (bytes > 0) {
        std::memcpy(t.data_ptr(), static_cast<const char*>(payload.data_ptr()) + offset, bytes);
      }
    }
    out.push_back(std::move(t));
    offset += bytes;
  }
  return out;
}

void for_each_chunk(const WeightSnapshot& snapshot, uint64_t chunk_bytes,
                    const std::function<bool(uint64_t, const char*, uint64_t)>& emit) {
  chunk_bytes = std::max<uint64_t>(1, chunk_bytes);
  const char* data = static_cast<const char*>(snapshot.payload.data_ptr());
  for (uint64_t offset = 0; offset < snapshot.total_bytes; offset += chunk_bytes) {
    if (!emit(offset, data + offset, std::min(chunk_bytes, snapshot.total_bytes - offset))) return;
  }
}

StatusOr<uint64_t> manifest_payload_bytes(const model::WeightManifest& manifest) {
  uint64_t total = 0;
  for (const model::TensorSpec& spec : manifest.tensors) {
    const std::string what = absl::StrCat("weights version ", manifest.version, ": ", spec.name);
    StatusOr<model::DType> dtype = model::parse_dtype(spec.dtype);
    if (!dtype.ok()) {
      return InvalidArgumentError(absl::StrCat(what, ": ", dtype.status().message()));
    }
    uint64_t numel = 1;
    for (int64_t d : spec.shape) {
      if (d < 0) return DataLossError(what + ": negative dimension");
      numel *= static_cast<uint64_t>(d);
    }
    if (numel * model::dtype_size(*dtype) != spec.num_bytes) {
      return DataLossError(
          absl::StrCat(what, ": ", spec.num_bytes, " bytes do not fit its shape and dtype"));
    }
    total += spec.num_bytes;
  }
  return total;
}

StatusOr<WeightAssembler> WeightAssembler::create(model::WeightManifest manifest,
                                                  at::Tensor reuse) {
  WeightAssembler a;
  RELAY_ASSIGN_OR_RETURN(a.total_, manifest_payload_bytes(manifest));
  a.manifest_ = std::move(manifest);
  a.payload_ = payload_buffer(std::move(reuse), a.total_);
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
  char* dst = static_cast<char*>(payload_.data_ptr()) + received_;
  for (uint64_t at = 0; at < size; at += kPieceBytes) {
    const uint64_t n = std::min(kPieceBytes, size - at);
    std::memcpy(dst + at, data + at, n);
    digest_->update(dst + at, n);  // while the piece is in cache
  }
  received_ += size;
  return OkStatus();
}

StatusOr<std::unordered_map<std::string, at::Tensor>> WeightAssembler::finish() {
  if (received_ != total_) {
    return DataLossError(absl::StrCat("weights version ", manifest_.version, ": received ",
                                      received_, " bytes, the manifest says ", total_));
  }
  const uint64_t digest = digest_->digest();
  if (digest != manifest_.digest) {
    return DataLossError(absl::StrCat("weights version ", manifest_.version, ": digest ", digest,
                                      " of the received bytes is not the published ",
                                      manifest_.digest));
  }
  std::vector<at::Tensor> tensors = payload_tensors(manifest_, payload_);
  std::unordered_map<std::string, at::Tensor> out;
  for (size_t i = 0; i < tensors.size(); ++i) {
    out.emplace(manifest_.tensors[i].name, std::move(tensors[i]));
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
