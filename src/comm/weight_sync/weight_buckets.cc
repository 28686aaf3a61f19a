#include "relay/comm/weight_sync/weight_buckets.h"

#include <torch/types.h>
#include <torch/utils.h>
#include <xxhash.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "relay/comm/rpc/manifest_proto.h"
#include "relay/model/safetensors.h"
#include "relay/v1/weights.pb.h"

namespace relay::comm {
namespace {

constexpr int64_t kMagic = 0x434e595357594c52;  // "RLYWSYNC" little-endian
constexpr int64_t kFormat = 1;
// Copy and hash in pieces that stay in L2, so each byte is read from memory once.
constexpr uint64_t kPieceBytes = uint64_t{256} << 10;

int64_t as_word(uint64_t v) {
  int64_t w;
  std::memcpy(&w, &v, sizeof w);
  return w;
}
uint64_t as_u64(int64_t w) {
  uint64_t v;
  std::memcpy(&v, &w, sizeof v);
  return v;
}

// Calls fn(tensor index, offset in tensor, offset in [begin, end), n) for each
// run of bytes of [begin, end) of the payload that lies in one tensor.
// `starts` holds each tensor's offset in the payload plus the total at the end.
template <typename Fn>
void for_each_run(const std::vector<uint64_t>& starts, uint64_t begin, uint64_t end, Fn&& fn) {
  // The last tensor starting at or before `begin` (empty tensors are skipped).
  size_t i = std::upper_bound(starts.begin(), starts.end() - 1, begin) - starts.begin();
  i = i == 0 ? 0 : i - 1;
  uint64_t at = begin;
  while (at < end && i + 1 < starts.size()) {
    const uint64_t stop = std::min(end, starts[i + 1]);
    if (stop > at) fn(i, at - starts[i], at - begin, stop - at);
    at = std::max(at, stop);
    ++i;
  }
}

std::vector<uint64_t> tensor_starts(const model::WeightManifest& manifest) {
  std::vector<uint64_t> starts{0};
  for (const model::TensorSpec& spec : manifest.tensors) {
    starts.push_back(starts.back() + spec.num_bytes);
  }
  return starts;
}

}  // namespace

SyncHeader make_header(const model::WeightManifest& manifest, const std::string& manifest_bytes,
                       uint64_t bucket_bytes, int64_t generation, int64_t seq) {
  SyncHeader h;
  h.generation = generation;
  h.seq = seq;
  h.version = manifest.version;
  h.digest = manifest.digest;
  for (const model::TensorSpec& spec : manifest.tensors) h.total_bytes += spec.num_bytes;
  h.bucket_bytes = bucket_bytes;
  h.bucket_count = bucket_count(h.total_bytes, bucket_bytes);
  h.manifest_bytes = manifest_bytes.size();
  h.manifest_checksum = XXH3_64bits(manifest_bytes.data(), manifest_bytes.size());
  return h;
}

void encode_header(const SyncHeader& h, int64_t* words) {
  words[0] = kMagic;
  words[1] = kFormat;
  words[2] = h.generation;
  words[3] = h.seq;
  words[4] = h.version;
  words[5] = as_word(h.digest);
  words[6] = as_word(h.total_bytes);
  words[7] = as_word(h.bucket_bytes);
  words[8] = as_word(h.bucket_count);
  words[9] = as_word(h.manifest_bytes);
  words[10] = as_word(h.manifest_checksum);
  words[11] = as_word(XXH3_64bits(words, 11 * sizeof(int64_t)));
}

StatusOr<SyncHeader> decode_header(const int64_t* words) {
  if (words[0] != kMagic || words[1] != kFormat) {
    return DataLossError(absl::StrCat("weight sync header: magic/format ", words[0], "/", words[1],
                                      " is not relay's (format ", kFormat, ")"));
  }
  if (as_u64(words[11]) != XXH3_64bits(words, 11 * sizeof(int64_t))) {
    return DataLossError("weight sync header: checksum mismatch");
  }
  SyncHeader h;
  h.generation = words[2];
  h.seq = words[3];
  h.version = words[4];
  h.digest = as_u64(words[5]);
  h.total_bytes = as_u64(words[6]);
  h.bucket_bytes = as_u64(words[7]);
  h.bucket_count = as_u64(words[8]);
  h.manifest_bytes = as_u64(words[9]);
  h.manifest_checksum = as_u64(words[10]);
  if (h.bucket_bytes == 0 || h.bucket_count != bucket_count(h.total_bytes, h.bucket_bytes)) {
    return DataLossError(absl::StrCat("weight sync header of version ", h.version, ": ",
                                      h.bucket_count, " buckets of ", h.bucket_bytes,
                                      " bytes cannot carry ", h.total_bytes, " bytes"));
  }
  return h;
}

std::string encode_manifest(const model::WeightManifest& manifest) {
  v1::WeightManifest proto;
  to_proto(manifest, &proto);
  return proto.SerializeAsString();
}

StatusOr<model::WeightManifest> decode_manifest(const std::string& bytes, const SyncHeader& h) {
  const std::string what = absl::StrCat("weight sync manifest of version ", h.version, ": ");
  if (bytes.size() != h.manifest_bytes ||
      XXH3_64bits(bytes.data(), bytes.size()) != h.manifest_checksum) {
    return DataLossError(what + "checksum mismatch");
  }
  v1::WeightManifest proto;
  if (!proto.ParseFromString(bytes)) return DataLossError(what + "does not parse");
  model::WeightManifest m = from_proto(proto);
  uint64_t total = 0;
  for (const model::TensorSpec& spec : m.tensors) total += spec.num_bytes;
  if (m.version != h.version || m.digest != h.digest || total != h.total_bytes) {
    return DataLossError(absl::StrCat(what, "version ", m.version, ", digest ", m.digest, ", ",
                                      total, " bytes disagree with the header (", h.version, ", ",
                                      h.digest, ", ", h.total_bytes, ")"));
  }
  return m;
}

uint64_t bucket_count(uint64_t total_bytes, uint64_t bucket_bytes) {
  return bucket_bytes == 0 ? 0 : (total_bytes + bucket_bytes - 1) / bucket_bytes;
}

BucketReader::BucketReader(const WeightSnapshot& snapshot, uint64_t bucket_bytes)
    : snapshot_(snapshot), bucket_bytes_(bucket_bytes), starts_(tensor_starts(snapshot.manifest)) {
  RELAY_CHECK(bucket_bytes > 0, "BucketReader: bucket_bytes must be > 0");
  RELAY_CHECK(snapshot.tensors.size() == snapshot.manifest.tensors.size(),
              "BucketReader: one tensor per manifest entry");
  count_ = comm::bucket_count(starts_.back(), bucket_bytes);
}

uint64_t BucketReader::bucket_size(uint64_t index) const {
  const uint64_t begin = index * bucket_bytes_;
  return std::min(bucket_bytes_, starts_.back() - begin);
}

uint64_t BucketReader::read(uint64_t index, char* dst) const {
  const uint64_t begin = index * bucket_bytes_;
  const uint64_t size = bucket_size(index);
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state(XXH3_createState(),
                                                                 &XXH3_freeState);
  XXH3_64bits_reset(state.get());
  for (uint64_t piece = 0; piece < size; piece += kPieceBytes) {
    const uint64_t n = std::min(kPieceBytes, size - piece);
    for_each_run(starts_, begin + piece, begin + piece + n,
                 [&](size_t t, uint64_t in_tensor, uint64_t in_run, uint64_t len) {
                   const char* src = static_cast<const char*>(snapshot_.tensors[t].data_ptr());
                   std::memcpy(dst + piece + in_run, src + in_tensor, len);
                 });
    XXH3_64bits_update(state.get(), dst + piece, n);
  }
  return XXH3_64bits_digest(state.get());
}

at::Tensor BucketReader::view(uint64_t index, uint64_t* checksum) const {
  const uint64_t begin = index * bucket_bytes_;
  const uint64_t size = bucket_size(index);
  int found = 0;
  size_t tensor = 0;
  uint64_t offset = 0;
  for_each_run(starts_, begin, begin + size, [&](size_t t, uint64_t in_tensor, uint64_t, uint64_t) {
    ++found;
    tensor = t;
    offset = in_tensor;
  });
  if (found != 1) return at::Tensor();
  at::Tensor bytes = snapshot_.tensors[tensor].reshape({-1}).view(at::kByte);
  at::Tensor v = bytes.narrow(0, static_cast<int64_t>(offset), static_cast<int64_t>(size));
  *checksum = XXH3_64bits(v.data_ptr(), size);
  return v;
}

struct VersionAssembler::DigestState {
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> digest{XXH3_createState(),
                                                                  &XXH3_freeState};
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> bucket{XXH3_createState(),
                                                                  &XXH3_freeState};
};

VersionAssembler::VersionAssembler(model::WeightManifest manifest, uint64_t bucket_bytes)
    : manifest_(std::move(manifest)),
      bucket_bytes_(bucket_bytes),
      starts_(tensor_starts(manifest_)),
      digest_(std::make_unique<DigestState>()) {
  total_bytes_ = starts_.back();
  count_ = comm::bucket_count(total_bytes_, bucket_bytes_);
  XXH3_64bits_reset(digest_->digest.get());
}

VersionAssembler::~VersionAssembler() = default;

StatusOr<std::unique_ptr<VersionAssembler>> VersionAssembler::create(model::WeightManifest manifest,
                                                                     uint64_t bucket_bytes,
                                                                     at::Tensor reuse) {
  if (bucket_bytes == 0) return InvalidArgumentError("VersionAssembler: bucket_bytes must be > 0");
  std::unique_ptr<VersionAssembler> a(new VersionAssembler(std::move(manifest), bucket_bytes));
  for (const model::TensorSpec& spec : a->manifest_.tensors) {
    const std::string what =
        absl::StrCat("weights version ", a->manifest_.version, ": ", spec.name, ": ");
    StatusOr<model::DType> dtype = model::parse_dtype(spec.dtype);
    if (!dtype.ok()) return InvalidArgumentError(what + std::string(dtype.status().message()));
    uint64_t numel = 1;
    for (int64_t d : spec.shape) {
      if (d < 0) return InvalidArgumentError(what + "negative dimension");
      numel *= static_cast<uint64_t>(d);
    }
    if (numel * model::dtype_size(*dtype) != spec.num_bytes) {
      return InvalidArgumentError(
          absl::StrCat(what, spec.num_bytes, " bytes do not fit its shape and dtype"));
    }
  }
  // Only when nobody else can see it: no other Tensor and no view.
  a->reused_ = reuse.defined() && reuse.scalar_type() == at::kByte && reuse.dim() == 1 &&
               reuse.is_cpu() && static_cast<uint64_t>(reuse.numel()) == a->total_bytes_ &&
               reuse.use_count() == 1 && reuse.storage().use_count() == 1;
  a->payload_ = a->reused_ ? std::move(reuse)
                           : torch::empty({static_cast<int64_t>(a->total_bytes_)}, torch::kUInt8);
  return a;
}

at::Tensor VersionAssembler::bucket(uint64_t index) const {
  const uint64_t begin = std::min(index * bucket_bytes_, total_bytes_);
  const uint64_t size = std::min(bucket_bytes_, total_bytes_ - begin);
  return payload_.narrow(0, static_cast<int64_t>(begin), static_cast<int64_t>(size));
}

Status VersionAssembler::add_bucket(uint64_t index) {
  if (index != next_ || index >= count_) {
    return DataLossError(absl::StrCat("weights version ", manifest_.version, ": got bucket ", index,
                                      ", expected bucket ", next_, " of ", count_));
  }
  const at::Tensor b = bucket(index);
  const char* data = static_cast<const char*>(b.data_ptr());
  const uint64_t size = static_cast<uint64_t>(b.numel());
  XXH3_state_t* sum = digest_->bucket.get();
  XXH3_64bits_reset(sum);
  // Both hashes per piece: the second reads it from cache.
  for (uint64_t piece = 0; piece < size; piece += kPieceBytes) {
    const uint64_t n = std::min(kPieceBytes, size - piece);
    XXH3_64bits_update(sum, data + piece, n);
    XXH3_64bits_update(digest_->digest.get(), data + piece, n);
  }
  checksums_.push_back(XXH3_64bits_digest(sum));
  ++next_;
  return OkStatus();
}

StatusOr<std::unordered_map<std::string, at::Tensor>> VersionAssembler::finish(
    const std::vector<uint64_t>& checksums) {
  if (next_ != count_ || checksums.size() != count_) {
    return DataLossError(absl::StrCat("weights version ", manifest_.version, ": ", next_, " of ",
                                      count_, " buckets received, ", checksums.size(),
                                      " checksums"));
  }
  for (uint64_t i = 0; i < count_; ++i) {
    if (checksums_[i] != checksums[i]) {
      const uint64_t begin = i * bucket_bytes_;
      return DataLossError(absl::StrCat(
          "weights version ", manifest_.version, ": bucket ", i, " of ", count_, " (bytes [", begin,
          ", ", std::min(total_bytes_, begin + bucket_bytes_), ")): checksum ", checksums_[i],
          " of the received bytes is not the sent ", checksums[i]));
    }
  }
  const uint64_t digest = XXH3_64bits_digest(digest_->digest.get());
  if (digest != manifest_.digest) {
    return DataLossError(absl::StrCat("weights version ", manifest_.version, ": digest ", digest,
                                      " of the received bytes is not the published ",
                                      manifest_.digest));
  }
  std::unordered_map<std::string, at::Tensor> out;
  for (size_t i = 0; i < manifest_.tensors.size(); ++i) {
    const model::TensorSpec& spec = manifest_.tensors[i];
    const c10::ScalarType type = model::to_scalar_type(model::parse_dtype(spec.dtype).value());
    const int64_t element = static_cast<int64_t>(c10::elementSize(type));
    const int64_t offset = static_cast<int64_t>(starts_[i]);
    const int64_t bytes = static_cast<int64_t>(spec.num_bytes);
    at::Tensor t;
    if (offset % element == 0 && bytes > 0) {
      t = payload_.narrow(0, offset, bytes).view(type).view(spec.shape);
    } else {
      t = torch::empty(spec.shape, torch::TensorOptions().dtype(type));
      if (bytes > 0) {
        std::memcpy(t.data_ptr(), static_cast<const char*>(payload_.data_ptr()) + offset, bytes);
      }
    }
    out.emplace(spec.name, std::move(t));
  }
  return out;
}

}  // namespace relay::comm
