// WeightChunk on the wire without copying its data (weight_chunk_wire.h).

#include "comm/rpc/weight_chunk_wire.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace relay::comm {
namespace {

// Protobuf's wire types (the low three bits of a field's tag).
enum WireType : uint32_t {
  kVarint = 0,
  kFixed64 = 1,
  kLengthDelimited = 2,
  kStartGroup = 3,
  kEndGroup = 4,
  kFixed32 = 5,
};

void append_varint(uint64_t v, std::string* out) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

void release_owner(void* owner) { delete static_cast<std::shared_ptr<const void>*>(owner); }

// Reads bytes in order across a message's slices.
class SliceCursor {
 public:
  explicit SliceCursor(const std::vector<grpc::Slice>& slices) : slices_(slices) { settle(); }

  bool done() const { return index_ == slices_.size(); }
  uint64_t position() const { return consumed_; }

  bool byte(uint8_t* b) {
    if (done()) return false;
    *b = slices_[index_].begin()[offset_];
    advance(1);
    return true;
  }

  // A base-128 varint of at most ten bytes.
  bool varint(uint64_t* v) {
    *v = 0;
    for (int shift = 0; shift < 70; shift += 7) {
      uint8_t b = 0;
      if (!byte(&b)) return false;
      if (shift == 63 && b > 1) return false;  // more than 64 bits
      *v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) return true;
    }
    return false;
  }

  // The next n bytes as the spans they lie in; false (and nothing
  // consumed past the end) when fewer than n remain.
  bool take(uint64_t n, std::vector<std::pair<const char*, uint64_t>>* spans) {
    if (n > remaining()) return false;
    while (n > 0) {
      const grpc::Slice& s = slices_[index_];
      const uint64_t here = std::min<uint64_t>(n, s.size() - offset_);
      if (spans != nullptr) {
        spans->emplace_back(reinterpret_cast<const char*>(s.begin()) + offset_, here);
      }
      advance(here);
      n -= here;
    }
    return true;
  }

 private:
  uint64_t remaining() const {
    uint64_t r = 0;
    for (size_t i = index_; i < slices_.size(); ++i) r += slices_[i].size();
    return r - offset_;
  }
  void advance(uint64_t n) {
    offset_ += n;
    consumed_ += n;
    settle();
  }
  // Past the end of the current slice (and any empty ones) to the next byte.
  void settle() {
    while (index_ < slices_.size() && offset_ == slices_[index_].size()) {
      ++index_;
      offset_ = 0;
    }
  }

  const std::vector<grpc::Slice>& slices_;
  size_t index_ = 0;
  uint64_t offset_ = 0;  // into slices_[index_]
  uint64_t consumed_ = 0;
};

}  // namespace

grpc::ByteBuffer weight_chunk_message(const v1::WeightManifest* manifest, uint64_t offset,
                                      uint64_t chunk_digest, const char* data, uint64_t size,
                                      std::shared_ptr<const void> owner) {
  v1::WeightChunk fields;
  if (manifest != nullptr) *fields.mutable_manifest() = *manifest;
  fields.set_offset(offset);
  fields.set_chunk_digest(chunk_digest);
  std::string head = fields.SerializeAsString();
  if (size == 0) {  // proto3 leaves empty bytes out
    grpc::Slice only(head);
    return grpc::ByteBuffer(&only, 1);
  }
  append_varint((static_cast<uint64_t>(v1::WeightChunk::kDataFieldNumber) << 3) | kLengthDelimited,
                &head);
  append_varint(size, &head);
  grpc::Slice slices[2] = {
      grpc::Slice(head),
      grpc::Slice(const_cast<char*>(data), size, &release_owner,
                  new std::shared_ptr<const void>(std::move(owner))),
  };
  return grpc::ByteBuffer(slices, 2);
}

StatusOr<WeightChunkView> read_weight_chunk(const std::vector<grpc::Slice>& slices) {
  WeightChunkView view;
  SliceCursor in(slices);
  auto malformed = [&](uint64_t at, const std::string& what) {
    return DataLossError(absl::StrCat("WeightChunk: ", what, " at byte ", at));
  };
  while (!in.done()) {
    const uint64_t at = in.position();
    uint64_t tag = 0;
    if (!in.varint(&tag)) return malformed(at, "truncated field tag");
    const uint64_t field = tag >> 3;
    const uint32_t wire = static_cast<uint32_t>(tag & 7);
    if (field == 0) return malformed(at, "field number 0");
    auto expect = [&](uint32_t want) -> Status {
      if (wire == want) return OkStatus();
      return malformed(at, absl::StrCat("field ", field, " has wire type ", wire, ", not ", want));
    };
    switch (wire) {
      case kVarint: {
        uint64_t v = 0;
        if (!in.varint(&v))
          return malformed(at, absl::StrCat("truncated or overlong varint of field ", field));
        if (field == v1::WeightChunk::kOffsetFieldNumber) view.offset = v;
        if (field == v1::WeightChunk::kChunkDigestFieldNumber) view.chunk_digest = v;
        break;
      }
      case kLengthDelimited: {
        uint64_t n = 0;
        if (!in.varint(&n)) return malformed(at, absl::StrCat("truncated length of field ", field));
        std::vector<std::pair<const char*, uint64_t>> spans;
        if (!in.take(n, &spans)) {
          return malformed(at, absl::StrCat("field ", field, "'s ", n,
                                            " bytes run past the end of the message"));
        }
        if (field == v1::WeightChunk::kDataFieldNumber) {
          view.data = std::move(spans);
        } else if (field == v1::WeightChunk::kManifestFieldNumber) {
          std::string bytes;
          bytes.reserve(n);
          for (const auto& [p, len] : spans) bytes.append(p, len);
          if (!view.manifest) view.manifest.emplace();
          if (!view.manifest->MergeFromString(bytes)) {
            return malformed(at, "a manifest that does not parse as relay.v1.WeightManifest");
          }
        }
        break;
      }
      case kFixed64:
      case kFixed32: {
        // No field of WeightChunk has these types: another schema's field.
        const uint64_t n = wire == kFixed64 ? 8 : 4;
        if (!in.take(n, nullptr)) return malformed(at, absl::StrCat("truncated field ", field));
        break;
      }
      default:
        return malformed(at, absl::StrCat("field ", field, " has wire type ", wire,
                                          " (groups are not used by relay.v1)"));
    }
    // A known field with the wrong wire type is malformed, not unknown.
    if (field == v1::WeightChunk::kOffsetFieldNumber ||
        field == v1::WeightChunk::kChunkDigestFieldNumber) {
      RELAY_RETURN_IF_ERROR(expect(kVarint));
    } else if (field == v1::WeightChunk::kDataFieldNumber ||
               field == v1::WeightChunk::kManifestFieldNumber) {
      RELAY_RETURN_IF_ERROR(expect(kLengthDelimited));
    }
  }
  return view;
}

}  // namespace relay::comm
