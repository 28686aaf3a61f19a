#include "relay/comm/weight_sync/weight_buckets.h"

#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "relay/comm/rpc/manifest_proto.h"
#include "relay/common/xxh3.h"
#include "relay/model/safetensors.h"
#include "relay/v1/weights.pb.h"

namespace relay::comm {
namespace {

constexpr int64_t kMagic = 0x434e595357594c52;  // "RLYWSYNC" little-endian
constexpr int64_t kFormat = 2;                  // 2: block checksums before the buckets

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

}  // namespace

SyncHeader make_header(const WeightSnapshot& snapshot, const std::string& manifest_bytes,
                       uint64_t bucket_bytes, int64_t generation, int64_t seq) {
  const model::WeightManifest& manifest = snapshot.manifest;
  SyncHeader h;
  h.generation = generation;
  h.seq = seq;
  h.version = manifest.version;
  h.digest = manifest.digest;
  for (const model::TensorSpec& spec : manifest.tensors) h.total_bytes += spec.num_bytes;
  h.bucket_bytes = bucket_bytes;
  h.bucket_count = bucket_count(h.total_bytes, bucket_bytes);
  h.manifest_bytes = manifest_bytes.size();
  h.manifest_checksum = xxh3_64(manifest_bytes.data(), manifest_bytes.size());
  h.block_bytes = snapshot.block_bytes;
  h.checksums_checksum =
      xxh3_64(snapshot.block_checksums.data(), snapshot.block_checksums.size() * sizeof(uint64_t));
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
  words[11] = as_word(h.block_bytes);
  words[12] = as_word(h.checksums_checksum);
  words[13] = as_word(xxh3_64(words, 13 * sizeof(int64_t)));
}

StatusOr<SyncHeader> decode_header(const int64_t* words) {
  if (words[0] != kMagic || words[1] != kFormat) {
    return DataLossError(absl::StrCat("weight sync header: magic/format ", words[0], "/", words[1],
                                      " is not relay's (format ", kFormat, ")"));
  }
  if (as_u64(words[13]) != xxh3_64(words, 13 * sizeof(int64_t))) {
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
  h.block_bytes = as_u64(words[11]);
  h.checksums_checksum = as_u64(words[12]);
  if (h.bucket_bytes == 0 || h.bucket_count != bucket_count(h.total_bytes, h.bucket_bytes)) {
    return DataLossError(absl::StrCat("weight sync header of version ", h.version, ": ",
                                      h.bucket_count, " buckets of ", h.bucket_bytes,
                                      " bytes cannot carry ", h.total_bytes, " bytes"));
  }
  if (h.block_bytes == 0) {
    return DataLossError(
        absl::StrCat("weight sync header of version ", h.version, ": no checksum block size"));
  }
  return h;
}

Status check_block_checksums(const SyncHeader& h, const std::vector<uint64_t>& checksums) {
  if (checksums.size() != h.block_count() ||
      xxh3_64(checksums.data(), checksums.size() * sizeof(uint64_t)) != h.checksums_checksum) {
    return DataLossError(absl::StrCat("weight sync of version ", h.version, ": the ",
                                      checksums.size(), " block checksums (", h.block_count(),
                                      " expected) fail their checksum"));
  }
  return OkStatus();
}

std::string encode_manifest(const model::WeightManifest& manifest) {
  v1::WeightManifest proto;
  to_proto(manifest, &proto);
  return proto.SerializeAsString();
}

StatusOr<model::WeightManifest> decode_manifest(const std::string& bytes, const SyncHeader& h) {
  const std::string what = absl::StrCat("weight sync manifest of version ", h.version, ": ");
  if (bytes.size() != h.manifest_bytes ||
      xxh3_64(bytes.data(), bytes.size()) != h.manifest_checksum) {
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

BucketReader::BucketReader(const WeightSnapshot& snapshot, uint64_t bucket_bytes)
    : snapshot_(snapshot), bucket_bytes_(bucket_bytes) {
  RELAY_CHECK(bucket_bytes > 0, "BucketReader: bucket_bytes must be > 0");
  RELAY_CHECK(snapshot.total_bytes == 0 ||
                  static_cast<uint64_t>(snapshot.payload.numel()) == snapshot.total_bytes,
              "BucketReader: the snapshot's payload holds its bytes");
  count_ = comm::bucket_count(snapshot.total_bytes, bucket_bytes);
}

uint64_t BucketReader::bucket_size(uint64_t index) const {
  const uint64_t begin = index * bucket_bytes_;
  return std::min(bucket_bytes_, snapshot_.total_bytes - begin);
}

void BucketReader::read(uint64_t index, char* dst) const {
  std::memcpy(dst, static_cast<const char*>(snapshot_.payload.data_ptr()) + index * bucket_bytes_,
              bucket_size(index));
}

at::Tensor BucketReader::view(uint64_t index) const {
  return snapshot_.payload.narrow(0, static_cast<int64_t>(index * bucket_bytes_),
                                  static_cast<int64_t>(bucket_size(index)));
}

VersionAssembler::VersionAssembler(model::WeightManifest manifest, uint64_t bucket_bytes,
                                   uint64_t total_bytes, uint64_t block_bytes,
                                   std::vector<uint64_t> block_checksums)
    : manifest_(std::move(manifest)),
      bucket_bytes_(bucket_bytes),
      total_bytes_(total_bytes),
      count_(comm::bucket_count(total_bytes, bucket_bytes)),
      block_bytes_(block_bytes),
      block_checksums_(std::move(block_checksums)),
      blocks_(block_bytes) {}

StatusOr<std::unique_ptr<VersionAssembler>> VersionAssembler::create(
    model::WeightManifest manifest, uint64_t bucket_bytes, uint64_t block_bytes,
    std::vector<uint64_t> block_checksums, at::Tensor reuse) {
  if (bucket_bytes == 0 || block_bytes == 0) {
    return InvalidArgumentError("VersionAssembler: bucket_bytes and block_bytes must be > 0");
  }
  StatusOr<uint64_t> total = manifest_payload_bytes(manifest);
  if (!total.ok()) return InvalidArgumentError(total.status().message());
  if (block_checksums.size() != block_count(*total, block_bytes)) {
    return InvalidArgumentError(absl::StrCat(
        "weights version ", manifest.version, ": ", block_checksums.size(), " block checksums for ",
        block_count(*total, block_bytes), " blocks of ", block_bytes, " bytes"));
  }
  std::unique_ptr<VersionAssembler> a(new VersionAssembler(
      std::move(manifest), bucket_bytes, *total, block_bytes, std::move(block_checksums)));
  a->payload_ = payload_buffer(std::move(reuse), a->total_bytes_, &a->reused_);
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
  auto check = [&](uint64_t block, uint64_t sum) {
    if (!bad_.ok() || sum == block_checksums_[block]) return;
    const uint64_t begin = block * block_bytes_;
    bad_ = DataLossError(absl::StrCat(
        "weights version ", manifest_.version, ": block ", block, " of ", block_checksums_.size(),
        " (bytes [", begin, ", ", std::min(total_bytes_, begin + block_bytes_), "), in bucket ",
        index, " of ", count_, "): checksum ", sum, " of the received bytes is not the published ",
        block_checksums_[block]));
  };
  blocks_.update(data, size, check);
  if (++next_ == count_) blocks_.finish(check);
  return bad_;
}

StatusOr<std::unordered_map<std::string, at::Tensor>> VersionAssembler::finish() {
  if (next_ != count_) {
    return DataLossError(absl::StrCat("weights version ", manifest_.version, ": ", next_, " of ",
                                      count_, " buckets received"));
  }
  RELAY_RETURN_IF_ERROR(bad_);
  std::vector<at::Tensor> tensors = payload_tensors(manifest_, payload_);
  std::unordered_map<std::string, at::Tensor> out;
  for (size_t i = 0; i < tensors.size(); ++i) {
    out.emplace(manifest_.tensors[i].name, std::move(tensors[i]));
  }
  return out;
}

}  // namespace relay::comm
