#include "relay/comm/weight_sync/weight_buckets.h"

#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <array>
#include <cstring>

namespace relay::comm {
namespace {

// Four dtypes, tensor sizes that no bucket size below divides, and an empty
// tensor in the middle.
WeightSnapshot mixed_snapshot(int64_t version) {
  torch::manual_seed(7);
  std::unordered_map<std::string, at::Tensor> w = {
      {"a.f32", torch::randn({37, 13})},                            // 1924 bytes
      {"b.bf16", torch::randn({501}).to(torch::kBFloat16)},         // 1002
      {"c.empty", torch::empty({0, 4})},                            // 0
      {"d.i64", torch::randint(-1000, 1000, {77}, torch::kInt64)},  // 616
      {"e.scalar", torch::full({}, 3.5f)},                          // 4
  };
  WeightPublisher p;
  EXPECT_TRUE(p.publish(version, w).ok());
  return *p.snapshot(version).value();
}

// Sends `snap` through a reader and an assembler, letting `tamper` change a
// bucket's bytes on the way.
StatusOr<std::unordered_map<std::string, at::Tensor>> round_trip(
    const WeightSnapshot& snap, uint64_t bucket_bytes,
    const std::function<void(uint64_t, std::string&)>& tamper = nullptr) {
  BucketReader reader(snap, bucket_bytes);
  RELAY_ASSIGN_OR_RETURN(auto assembler, VersionAssembler::create(snap.manifest, bucket_bytes));
  std::vector<uint64_t> checksums;
  for (uint64_t k = 0; k < reader.bucket_count(); ++k) {
    std::string bucket(reader.bucket_size(k), '\0');
    checksums.push_back(reader.read(k, bucket.data()));
    if (tamper) tamper(k, bucket);
    at::Tensor dst = assembler->bucket(k);  // where the transport writes it
    EXPECT_EQ(static_cast<size_t>(dst.numel()), bucket.size());
    std::memcpy(dst.data_ptr(), bucket.data(), bucket.size());
    RELAY_RETURN_IF_ERROR(assembler->add_bucket(k));
  }
  return assembler->finish(checksums);
}

void expect_same(const WeightSnapshot& snap,
                 const std::unordered_map<std::string, at::Tensor>& got) {
  ASSERT_EQ(got.size(), snap.tensors.size());
  for (size_t i = 0; i < snap.tensors.size(); ++i) {
    const at::Tensor& t = got.at(snap.manifest.tensors[i].name);
    EXPECT_EQ(t.scalar_type(), snap.tensors[i].scalar_type()) << snap.manifest.tensors[i].name;
    EXPECT_TRUE(torch::equal(t, snap.tensors[i])) << snap.manifest.tensors[i].name;
  }
}

TEST(WeightBucketsTest, ReassemblesExactlyAtAnyBucketSize) {
  const WeightSnapshot snap = mixed_snapshot(3);
  ASSERT_EQ(snap.total_bytes, 3546u);
  for (uint64_t bucket :
       {uint64_t{1}, uint64_t{7}, uint64_t{1000}, uint64_t{3546}, uint64_t{1} << 20}) {
    BucketReader reader(snap, bucket);
    EXPECT_EQ(reader.bucket_count(), bucket_count(3546, bucket)) << bucket;
    EXPECT_EQ(reader.bucket_size(reader.bucket_count() - 1),
              3546 - (reader.bucket_count() - 1) * bucket);
    auto got = round_trip(snap, bucket);
    ASSERT_TRUE(got.ok()) << bucket << ": " << got.status();
    expect_same(snap, *got);
  }
  // Bucket 0 of 1000 bytes lies inside "a.f32" (1924 bytes): a view with the
  // same checksum; bucket 1 spans a.f32 and b.bf16: none.
  BucketReader reader(snap, 1000);
  uint64_t sum = 0;
  at::Tensor v = reader.view(0, &sum);
  ASSERT_TRUE(v.defined());
  std::string copy(1000, '\0');
  EXPECT_EQ(sum, reader.read(0, copy.data()));
  EXPECT_EQ(std::memcmp(v.data_ptr(), copy.data(), 1000), 0);
  EXPECT_EQ(v.data_ptr(), snap.tensors[0].data_ptr());
  EXPECT_FALSE(reader.view(1, &sum).defined());
  EXPECT_EQ(bucket_count(0, 1000), 0u);
  EXPECT_EQ(bucket_count(1000, 1000), 1u);
  EXPECT_EQ(bucket_count(1001, 1000), 2u);
}

TEST(WeightBucketsTest, AFlippedByteIsDataLossNamingTheBucket) {
  const WeightSnapshot snap = mixed_snapshot(3);
  auto got = round_trip(snap, 1000, [](uint64_t k, std::string& bytes) {
    if (k == 2) bytes[17] ^= 0x10;
  });
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(std::string(got.status().message()).find("bucket 2 of 4 (bytes [2000, 3000))"),
            std::string::npos)
      << got.status();
}

TEST(WeightBucketsTest, MatchingChecksumsButAWrongDigestIsDataLoss) {
  WeightSnapshot snap = mixed_snapshot(3);
  snap.manifest.digest ^= 1;  // the sender hashed other bytes than it announced
  auto got = round_trip(snap, 1000);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(std::string(got.status().message()).find("weights version 3: digest"),
            std::string::npos)
      << got.status();
}

TEST(WeightBucketsTest, BucketsOutOfOrderOrMissingAreRefused) {
  const WeightSnapshot snap = mixed_snapshot(3);
  auto a = VersionAssembler::create(snap.manifest, 1000).value();
  EXPECT_EQ(a->bucket_count(), 4u);
  EXPECT_EQ(a->bucket(3).numel(), 546);
  EXPECT_EQ(a->add_bucket(1).code(), absl::StatusCode::kDataLoss);
  ASSERT_TRUE(a->add_bucket(0).ok());
  EXPECT_EQ(a->finish({1}).status().code(), absl::StatusCode::kDataLoss) << "3 buckets missing";
  model::WeightManifest bad = snap.manifest;
  bad.tensors[0].num_bytes += 4;
  EXPECT_EQ(VersionAssembler::create(bad, 1000).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Tensors are views of the payload where their offset allows it; the payload
// is received into again only once nothing refers to it.
TEST(WeightBucketsTest, ThePayloadIsReusedOnlyWhenTheCallerDroppedItsTensors) {
  const WeightSnapshot snap = mixed_snapshot(3);
  auto first = VersionAssembler::create(snap.manifest, 1000).value();
  EXPECT_FALSE(first->reused());
  BucketReader reader(snap, 1000);
  std::vector<uint64_t> sums;
  for (uint64_t k = 0; k < reader.bucket_count(); ++k) {
    sums.push_back(reader.read(k, static_cast<char*>(first->bucket(k).data_ptr())));
    ASSERT_TRUE(first->add_bucket(k).ok());
  }
  auto tensors = first->finish(sums).value();
  expect_same(snap, tensors);
  at::Tensor payload = first->payload();
  first.reset();
  EXPECT_EQ(tensors.at("a.f32").data_ptr(), payload.data_ptr()) << "offset 0: a view";
  EXPECT_NE(tensors.at("d.i64").storage().data(), payload.storage().data())
      << "offset 2926 is not a multiple of 8: a copy";

  auto held = VersionAssembler::create(snap.manifest, 1000, payload).value();
  EXPECT_FALSE(held->reused()) << "the caller still holds the payload and its views";
  held.reset();
  tensors.clear();
  auto again = VersionAssembler::create(snap.manifest, 1000, std::move(payload)).value();
  EXPECT_TRUE(again->reused());
}

TEST(WeightBucketsTest, HeaderRoundTripsAndRefusesCorruption) {
  const WeightSnapshot snap = mixed_snapshot(9);
  const std::string manifest = encode_manifest(snap.manifest);
  const SyncHeader h = make_header(snap.manifest, manifest, 1000, /*generation=*/4, /*seq=*/2);
  EXPECT_EQ(h.total_bytes, 3546u);
  EXPECT_EQ(h.bucket_count, 4u);
  std::array<int64_t, kSyncHeaderWords> words;
  encode_header(h, words.data());
  auto back = decode_header(words.data());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->generation, 4);
  EXPECT_EQ(back->seq, 2);
  EXPECT_EQ(back->version, 9);
  EXPECT_EQ(back->digest, snap.manifest.digest);
  EXPECT_EQ(back->manifest_bytes, manifest.size());

  for (int i = 0; i < kSyncHeaderWords; ++i) {
    auto bad = words;
    bad[i] ^= 4;
    EXPECT_EQ(decode_header(bad.data()).status().code(), absl::StatusCode::kDataLoss) << i;
  }
  SyncHeader inconsistent = h;
  inconsistent.bucket_count = 3;
  encode_header(inconsistent, words.data());
  EXPECT_EQ(decode_header(words.data()).status().code(), absl::StatusCode::kDataLoss);
}

TEST(WeightBucketsTest, ManifestRoundTripsAndMustAgreeWithTheHeader) {
  const WeightSnapshot snap = mixed_snapshot(9);
  const std::string bytes = encode_manifest(snap.manifest);
  const SyncHeader h = make_header(snap.manifest, bytes, 1000, 1, 0);
  auto m = decode_manifest(bytes, h);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->version, 9);
  EXPECT_EQ(m->digest, snap.manifest.digest);
  ASSERT_EQ(m->tensors.size(), 5u);
  EXPECT_EQ(m->tensors[1].dtype, "BF16");
  EXPECT_EQ(m->tensors[1].shape, std::vector<int64_t>{501});

  std::string flipped = bytes;
  flipped[3] ^= 1;
  EXPECT_EQ(decode_manifest(flipped, h).status().code(), absl::StatusCode::kDataLoss);
  SyncHeader other = h;
  other.version = 10;
  EXPECT_EQ(decode_manifest(bytes, other).status().code(), absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace relay::comm
