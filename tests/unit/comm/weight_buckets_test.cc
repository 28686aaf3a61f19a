#include "relay/comm/weight_sync/weight_buckets.h"

#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <array>
#include <cstring>

#include "relay/common/xxh3.h"
#include "relay/model/weight_manifest.h"

namespace relay::comm {
namespace {

// Four dtypes, tensor sizes that no bucket size below divides, and an empty
// tensor in the middle; checksum blocks of 512 bytes, which no bucket size
// below lines up with either.
constexpr uint64_t kBlock = 512;

WeightSnapshot mixed_snapshot(int64_t version) {
  torch::manual_seed(7);
  std::unordered_map<std::string, at::Tensor> w = {
      {"a.f32", torch::randn({37, 13})},                            // 1924 bytes
      {"b.bf16", torch::randn({501}).to(torch::kBFloat16)},         // 1002
      {"c.empty", torch::empty({0, 4})},                            // 0
      {"d.i64", torch::randint(-1000, 1000, {77}, torch::kInt64)},  // 616
      {"e.scalar", torch::full({}, 3.5f)},                          // 4
  };
  WeightPublisher p(1, kBlock);
  EXPECT_TRUE(p.publish(version, w).ok());
  return *p.snapshot(version).value();
}

StatusOr<std::unique_ptr<VersionAssembler>> assembler_for(const WeightSnapshot& snap,
                                                          uint64_t bucket_bytes,
                                                          at::Tensor reuse = {}) {
  return VersionAssembler::create(snap.manifest, bucket_bytes, snap.block_bytes,
                                  snap.block_checksums, std::move(reuse));
}

// Sends `snap` through a reader and an assembler, letting `tamper` change a
// bucket's bytes on the way.
StatusOr<std::unordered_map<std::string, at::Tensor>> round_trip(
    const WeightSnapshot& snap, uint64_t bucket_bytes,
    const std::function<void(uint64_t, std::string&)>& tamper = nullptr) {
  BucketReader reader(snap, bucket_bytes);
  RELAY_ASSIGN_OR_RETURN(auto assembler, assembler_for(snap, bucket_bytes));
  for (uint64_t k = 0; k < reader.bucket_count(); ++k) {
    std::string bucket(reader.bucket_size(k), '\0');
    reader.read(k, bucket.data());
    if (tamper) tamper(k, bucket);
    at::Tensor dst = assembler->bucket(k);  // where the transport writes it
    EXPECT_EQ(static_cast<size_t>(dst.numel()), bucket.size());
    std::memcpy(dst.data_ptr(), bucket.data(), bucket.size());
    RELAY_RETURN_IF_ERROR(assembler->add_bucket(k));
  }
  return assembler->finish();
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
  // Every bucket is a slice of the snapshot's one payload buffer, also one
  // that spans tensors (bucket 1: a.f32 and b.bf16); its tensors are views
  // of it where aligned ("d.i64" at offset 2926 is not: a copy).
  BucketReader reader(snap, 1000);
  for (uint64_t k = 0; k < reader.bucket_count(); ++k) {
    at::Tensor v = reader.view(k);
    std::string copy(reader.bucket_size(k), '\0');
    reader.read(k, copy.data());
    EXPECT_EQ(v.numel(), static_cast<int64_t>(copy.size()));
    EXPECT_EQ(std::memcmp(v.data_ptr(), copy.data(), copy.size()), 0);
    EXPECT_EQ(v.data_ptr(), static_cast<char*>(snap.payload.data_ptr()) + k * 1000);
  }
  EXPECT_EQ(snap.tensors[0].data_ptr(), snap.payload.data_ptr());
  EXPECT_EQ(snap.tensors[1].data_ptr(), static_cast<char*>(snap.payload.data_ptr()) + 1924);
  EXPECT_NE(snap.tensors[3].storage().data(), snap.payload.storage().data());
  EXPECT_EQ(bucket_count(0, 1000), 0u);
  EXPECT_EQ(bucket_count(1000, 1000), 1u);
  EXPECT_EQ(bucket_count(1001, 1000), 2u);
}

// The publisher's block checksums are XXH3-64 of each block of the payload,
// its digest the manifest's, and the snapshot owns its bytes.
TEST(WeightBucketsTest, PublishChecksumsEachBlockOfThePayload) {
  torch::manual_seed(3);
  at::Tensor caller = torch::randn({300, 7});
  std::unordered_map<std::string, at::Tensor> w = {
      {"a", caller}, {"b.strided", torch::randn({40, 9}).t()}, {"c", torch::randn({5})}};
  WeightPublisher p(1, kBlock);
  ASSERT_TRUE(p.publish(1, w).ok());
  const WeightSnapshot snap = *p.snapshot(1).value();
  std::string payload;
  for_each_chunk(snap, 4096, [&](uint64_t, const char* data, uint64_t n) {
    payload.append(data, n);
    return true;
  });
  ASSERT_EQ(payload.size(), (300 * 7 + 40 * 9 + 5) * 4u);
  ASSERT_EQ(snap.block_checksums.size(), block_count(payload.size(), kBlock));
  for (size_t b = 0; b < snap.block_checksums.size(); ++b) {
    const size_t n = std::min<size_t>(kBlock, payload.size() - b * kBlock);
    EXPECT_EQ(snap.block_checksums[b], xxh3_64(payload.data() + b * kBlock, n)) << "block " << b;
  }
  EXPECT_EQ(snap.manifest.digest, model::weight_manifest(w, 1).value().digest);
  EXPECT_EQ(snap.manifest.digest, xxh3_64(payload.data(), payload.size()));
  EXPECT_TRUE(torch::equal(snap.tensors[1], w.at("b.strided")));
  caller.fill_(0);  // the caller goes on training
  EXPECT_NE(snap.tensors[0].data_ptr(), caller.data_ptr());
  EXPECT_FALSE(torch::equal(snap.tensors[0], caller));
}

TEST(WeightBucketsTest, AFlippedByteIsDataLossNamingTheBlock) {
  const WeightSnapshot snap = mixed_snapshot(3);
  BucketReader reader(snap, 1000);
  auto a = assembler_for(snap, 1000).value();
  Status at_bucket_2;
  for (uint64_t k = 0; k < reader.bucket_count(); ++k) {
    reader.read(k, static_cast<char*>(a->bucket(k).data_ptr()));
    if (k == 2) static_cast<char*>(a->bucket(k).data_ptr())[17] ^= 0x10;  // payload byte 2017
    Status s = a->add_bucket(k);
    if (k < 2) {
      EXPECT_TRUE(s.ok()) << k << ": " << s;
    } else if (k == 2) {
      at_bucket_2 = s;
    }
  }
  // Block 3 = bytes [1536, 2048) ends inside bucket 2: refused there, at once.
  EXPECT_EQ(at_bucket_2.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(std::string(at_bucket_2.message())
                .find("block 3 of 7 (bytes [1536, 2048), in bucket 2 of 4)"),
            std::string::npos)
      << at_bucket_2;
  auto got = a->finish();
  EXPECT_EQ(got.status(), at_bucket_2);

  // A block that spans two buckets is checked by the one that completes it.
  auto later = round_trip(snap, 1000, [](uint64_t k, std::string& bytes) {
    if (k == 0) bytes[999] ^= 1;  // block 1 = bytes [512, 1024)
  });
  EXPECT_NE(std::string(later.status().message())
                .find("block 1 of 7 (bytes [512, 1024), in bucket 1 of 4)"),
            std::string::npos)
      << later.status();
}

TEST(WeightBucketsTest, ChecksumsThatAreNotThePayloadsAreDataLoss) {
  WeightSnapshot snap = mixed_snapshot(3);
  snap.block_checksums.back() ^= 1;  // the sender announced other bytes than it sends
  auto got = round_trip(snap, 1000);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(std::string(got.status().message())
                .find("block 6 of 7 (bytes [3072, 3546), in bucket 3 of 4)"),
            std::string::npos)
      << got.status();
}

TEST(WeightBucketsTest, BucketsOutOfOrderOrMissingAreRefused) {
  const WeightSnapshot snap = mixed_snapshot(3);
  auto a = assembler_for(snap, 1000).value();
  EXPECT_EQ(a->bucket_count(), 4u);
  EXPECT_EQ(a->bucket(3).numel(), 546);
  EXPECT_EQ(a->add_bucket(1).code(), absl::StatusCode::kDataLoss);
  BucketReader(snap, 1000).read(0, static_cast<char*>(a->bucket(0).data_ptr()));
  ASSERT_TRUE(a->add_bucket(0).ok());
  EXPECT_EQ(a->finish().status().code(), absl::StatusCode::kDataLoss) << "3 buckets missing";
  model::WeightManifest bad = snap.manifest;
  bad.tensors[0].num_bytes += 4;
  EXPECT_EQ(VersionAssembler::create(bad, 1000, kBlock, snap.block_checksums).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<uint64_t> short_list(snap.block_checksums.begin(), snap.block_checksums.end() - 1);
  EXPECT_EQ(VersionAssembler::create(snap.manifest, 1000, kBlock, short_list).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Tensors are views of the payload where their offset allows it; the payload
// is received into again only once nothing refers to it.
TEST(WeightBucketsTest, ThePayloadIsReusedOnlyWhenTheCallerDroppedItsTensors) {
  const WeightSnapshot snap = mixed_snapshot(3);
  auto first = assembler_for(snap, 1000).value();
  EXPECT_FALSE(first->reused());
  BucketReader reader(snap, 1000);
  for (uint64_t k = 0; k < reader.bucket_count(); ++k) {
    reader.read(k, static_cast<char*>(first->bucket(k).data_ptr()));
    ASSERT_TRUE(first->add_bucket(k).ok());
  }
  auto tensors = first->finish().value();
  expect_same(snap, tensors);
  at::Tensor payload = first->payload();
  first.reset();
  EXPECT_EQ(tensors.at("a.f32").data_ptr(), payload.data_ptr()) << "offset 0: a view";
  EXPECT_NE(tensors.at("d.i64").storage().data(), payload.storage().data())
      << "offset 2926 is not a multiple of 8: a copy";

  auto held = assembler_for(snap, 1000, payload).value();
  EXPECT_FALSE(held->reused()) << "the caller still holds the payload and its views";
  held.reset();
  tensors.clear();
  auto again = assembler_for(snap, 1000, std::move(payload)).value();
  EXPECT_TRUE(again->reused());
}

TEST(WeightBucketsTest, HeaderRoundTripsAndRefusesCorruption) {
  const WeightSnapshot snap = mixed_snapshot(9);
  const std::string manifest = encode_manifest(snap.manifest);
  const SyncHeader h = make_header(snap, manifest, 1000, /*generation=*/4, /*seq=*/2);
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
  EXPECT_EQ(back->block_bytes, kBlock);
  EXPECT_EQ(back->block_count(), 7u);
  EXPECT_TRUE(check_block_checksums(*back, snap.block_checksums).ok());
  std::vector<uint64_t> sums = snap.block_checksums;
  sums[4] ^= 1;
  EXPECT_EQ(check_block_checksums(*back, sums).code(), absl::StatusCode::kDataLoss);
  sums.pop_back();
  EXPECT_EQ(check_block_checksums(*back, sums).code(), absl::StatusCode::kDataLoss);

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
  const SyncHeader h = make_header(snap, bytes, 1000, 1, 0);
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
