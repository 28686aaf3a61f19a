// WeightChunk messages without copying their data (src/comm/rpc/
// weight_chunk_wire.h): what the sender builds is a WeightChunk the
// generated code parses, what the reader reads is what the generated code
// would, however the bytes were split into slices, and malformed bytes are
// named.

#include "comm/rpc/weight_chunk_wire.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

namespace relay::comm {
namespace {

v1::WeightManifest a_manifest() {
  v1::WeightManifest m;
  m.set_version(7);
  m.set_digest(0x1234567890abcdefULL);
  v1::TensorSpec* t = m.add_tensors();
  t->set_name("model.embed_tokens.weight");
  t->set_dtype("F32");
  t->set_num_bytes(4096);
  t->add_shape(32);
  t->add_shape(32);
  return m;
}

std::vector<grpc::Slice> slices_of(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  return slices;
}

std::string bytes_of(const std::vector<grpc::Slice>& slices) {
  std::string out;
  for (const grpc::Slice& s : slices)
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

std::string data_of(const WeightChunkView& view) {
  std::string out;
  for (const auto& [p, n] : view.data) out.append(p, n);
  return out;
}

// `bytes` cut at each of `cuts` (ascending offsets) into slices (copies).
std::vector<grpc::Slice> cut(const std::string& bytes, const std::vector<size_t>& cuts) {
  std::vector<grpc::Slice> slices;
  size_t from = 0;
  for (size_t at : cuts) {
    slices.emplace_back(bytes.data() + from, at - from);
    from = at;
  }
  slices.emplace_back(bytes.data() + from, bytes.size() - from);
  return slices;
}

TEST(WeightChunkWireTest, TheSentDataIsTheSnapshotsBytesAndTheMessageParsesAsAWeightChunk) {
  auto owner = std::make_shared<std::string>(100000, 'x');
  for (size_t i = 0; i < owner->size(); ++i) (*owner)[i] = static_cast<char>(i * 31 + 7);
  const std::weak_ptr<std::string> watch = owner;
  const v1::WeightManifest manifest = a_manifest();
  const char* data = owner->data() + 1000;
  {
    const grpc::ByteBuffer message =
        weight_chunk_message(&manifest, 1000, 0xfeedULL, data, 50000, owner);
    owner.reset();
    EXPECT_FALSE(watch.expired()) << "the message must keep the bytes it points to alive";

    const std::vector<grpc::Slice> slices = slices_of(message);
    ASSERT_EQ(slices.size(), 2u);
    // The data slice is the snapshot's memory itself, not a copy.
    EXPECT_EQ(reinterpret_cast<const char*>(slices[1].begin()), data);
    EXPECT_EQ(slices[1].size(), 50000u);

    // What the generated code makes of it.
    v1::WeightChunk parsed;
    ASSERT_TRUE(parsed.ParseFromString(bytes_of(slices)));
    EXPECT_EQ(parsed.manifest().SerializeAsString(), manifest.SerializeAsString());
    EXPECT_EQ(parsed.offset(), 1000u);
    EXPECT_EQ(parsed.chunk_digest(), 0xfeedULL);
    EXPECT_EQ(parsed.data(), std::string(data, 50000));

    // What the reader makes of it: the same, data as spans of the slices.
    StatusOr<WeightChunkView> view = read_weight_chunk(slices);
    ASSERT_TRUE(view.ok()) << view.status();
    ASSERT_TRUE(view->manifest.has_value());
    EXPECT_EQ(view->manifest->SerializeAsString(), manifest.SerializeAsString());
    EXPECT_EQ(view->offset, 1000u);
    EXPECT_EQ(view->chunk_digest, 0xfeedULL);
    ASSERT_EQ(view->data.size(), 1u);
    EXPECT_EQ(view->data[0].first, data);
    EXPECT_EQ(view->data[0].second, 50000u);
  }
  EXPECT_TRUE(watch.expired()) << "the bytes' owner is released with the message";

  // Later chunks carry no manifest; an empty one carries no data either.
  const grpc::ByteBuffer later = weight_chunk_message(nullptr, 5, 6, "abc", 3, nullptr);
  const std::vector<grpc::Slice> later_slices = slices_of(later);
  StatusOr<WeightChunkView> view = read_weight_chunk(later_slices);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_FALSE(view->manifest.has_value());
  EXPECT_EQ(data_of(*view), "abc");
  const grpc::ByteBuffer empty = weight_chunk_message(&manifest, 0, 9, nullptr, 0, nullptr);
  const std::vector<grpc::Slice> empty_slices = slices_of(empty);
  view = read_weight_chunk(empty_slices);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_TRUE(view->manifest.has_value());
  EXPECT_TRUE(view->data.empty());
}

// The generated code's bytes (fields in number order: the digest after the
// data), split into slices at every byte: every field read whole, the data
// in the spans it arrived in.
TEST(WeightChunkWireTest, ReadsWhatTheGeneratedCodeWritesHoweverItIsSplit) {
  v1::WeightChunk chunk;
  *chunk.mutable_manifest() = a_manifest();
  chunk.set_offset(300);  // a two-byte varint
  chunk.set_data(std::string("weights!", 8));
  chunk.set_chunk_digest(~0ULL);  // a ten-byte varint
  const std::string bytes = chunk.SerializeAsString();
  for (size_t a = 0; a <= bytes.size(); ++a) {
    for (size_t b = a; b <= bytes.size(); b += 3) {
      SCOPED_TRACE("cut at " + std::to_string(a) + " and " + std::to_string(b));
      const std::vector<grpc::Slice> slices = cut(bytes, {a, b});
      StatusOr<WeightChunkView> view = read_weight_chunk(slices);
      ASSERT_TRUE(view.ok()) << view.status();
      ASSERT_TRUE(view->manifest.has_value());
      EXPECT_EQ(view->manifest->SerializeAsString(), chunk.manifest().SerializeAsString());
      EXPECT_EQ(view->offset, 300u);
      EXPECT_EQ(view->chunk_digest, ~0ULL);
      EXPECT_EQ(data_of(*view), "weights!");
    }
  }
  // One slice per byte.
  std::vector<size_t> every;
  for (size_t i = 1; i < bytes.size(); ++i) every.push_back(i);
  const std::vector<grpc::Slice> slices = cut(bytes, every);
  StatusOr<WeightChunkView> view = read_weight_chunk(slices);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->data.size(), 8u);
  EXPECT_EQ(data_of(*view), "weights!");
}

// Protobuf's rules: unknown fields of every wire type are skipped, a scalar
// or bytes field given twice keeps the last value, a message field merges.
TEST(WeightChunkWireTest, FollowsProtobufsRulesForUnknownAndRepeatedFields) {
  v1::WeightChunk first;
  first.set_offset(1);
  first.set_data("old");
  first.mutable_manifest()->set_version(3);
  v1::WeightChunk second;
  second.set_offset(2);
  second.set_data("new");
  second.mutable_manifest()->set_digest(99);
  std::string bytes = first.SerializeAsString();
  bytes += std::string("\xa8\x06\x05", 3);                       // field 101, varint 5
  bytes += std::string("\xb1\x06", 2) + std::string(8, '\x01');  // field 102, fixed64
  bytes += std::string("\xbd\x06", 2) + std::string(4, '\x02');  // field 103, fixed32
  bytes += std::string("\xc2\x06\x03", 3) + "abc";               // field 104, 3 bytes
  bytes += second.SerializeAsString();

  v1::WeightChunk generated;
  ASSERT_TRUE(generated.ParseFromString(bytes));
  const std::vector<grpc::Slice> slices = cut(bytes, {});
  StatusOr<WeightChunkView> view = read_weight_chunk(slices);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->offset, generated.offset());
  EXPECT_EQ(data_of(*view), generated.data());
  EXPECT_EQ(data_of(*view), "new");
  ASSERT_TRUE(view->manifest.has_value());
  EXPECT_EQ(view->manifest->version(), 3);
  EXPECT_EQ(view->manifest->digest(), 99u);
  EXPECT_EQ(view->manifest->SerializeAsString(), generated.manifest().SerializeAsString());
}

TEST(WeightChunkWireTest, MalformedBytesAreDataLossNamingTheFieldAndByte) {
  v1::WeightChunk chunk;
  chunk.set_offset(300);
  chunk.set_data("0123456789");
  const std::string bytes = chunk.SerializeAsString();  // 10 ac 02 1a 0a ...
  // Every cut inside a field fails; cuts between fields are shorter messages.
  for (size_t n = 1; n < bytes.size(); ++n) {
    const std::vector<grpc::Slice> slices = cut(bytes.substr(0, n), {});
    StatusOr<WeightChunkView> view = read_weight_chunk(slices);
    if (n == 3) {
      EXPECT_TRUE(view.ok()) << view.status();  // the offset alone
      continue;
    }
    ASSERT_FALSE(view.ok()) << n << " bytes";
    EXPECT_EQ(view.status().code(), absl::StatusCode::kDataLoss);
  }
  auto error = [](const std::string& b) {
    const std::vector<grpc::Slice> slices = cut(b, {});
    return std::string(read_weight_chunk(slices).status().message());
  };
  EXPECT_EQ(error(bytes.substr(0, 2)),
            "WeightChunk: truncated or overlong varint of field 2 at byte 0");
  EXPECT_EQ(error(bytes.substr(0, 8)),
            "WeightChunk: field 3's 10 bytes run past the end of the message at byte 3");
  EXPECT_EQ(error(std::string("\x0b", 1)),
            "WeightChunk: field 1 has wire type 3 (groups are not used by relay.v1) at byte 0");
  EXPECT_EQ(error(std::string("\x12\x01x", 3)),
            "WeightChunk: field 2 has wire type 2, not 0 at byte 0");
  EXPECT_EQ(error(std::string("\x00\x01", 2)), "WeightChunk: field number 0 at byte 0");
  EXPECT_EQ(error(std::string("\x0a\x02\xff\xff", 4)),
            "WeightChunk: a manifest that does not parse as relay.v1.WeightManifest at byte 0");
  EXPECT_EQ(error(std::string("\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\x7f", 11)),
            "WeightChunk: truncated or overlong varint of field 1 at byte 0");
}

}  // namespace
}  // namespace relay::comm
