#pragma once

// relay.v1.WeightChunk (proto/relay/v1/worker.proto) put on and read off the
// wire without copying its `data` field. Private to src/comm.
//
// FetchWeights streams a weight version as WeightChunk messages. Through the
// generated protobuf code each chunk's bytes were copied three times besides
// the socket's own copies: into the message (set_data), into gRPC's send
// buffer (serialization) and out of the received buffer into a string
// (parsing): CPU time on top of the socket's own copies, on both ends. Here
// the sender's message is two slices: a small head
// (every other field, then data's tag and length) and the chunk's bytes
// themselves, a slice that references the weight snapshot instead of copying
// it. The receiver reads the fields straight out of the slices the message
// arrived in and hands `data` over as the spans it arrived in.
//
// The bytes are still a WeightChunk (protobuf fields may come in any order,
// and the reader follows protobuf's rules: unknown fields are skipped, a
// repeated scalar or bytes field keeps its last value, a repeated message
// field merges), so either end may as well be the generated code.

#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include "relay/common/status.h"
#include "relay/v1/worker.pb.h"

namespace relay::comm {

// One WeightChunk message whose data is `data[0, size)`, not copied: the
// message holds `owner` (whatever keeps `data` alive, e.g. the snapshot)
// until gRPC has sent it. `manifest` may be null (every chunk after the
// first); the chunk's digest is given, as the sender computed it.
grpc::ByteBuffer weight_chunk_message(const v1::WeightManifest* manifest, uint64_t offset,
                                      uint64_t chunk_digest, const char* data, uint64_t size,
                                      std::shared_ptr<const void> owner);

// A received WeightChunk: its scalar fields, its manifest when it has one,
// and its data as spans of the slices it arrived in (valid while those
// slices are).
struct WeightChunkView {
  std::optional<v1::WeightManifest> manifest;
  uint64_t offset = 0;
  uint64_t chunk_digest = 0;
  std::vector<std::pair<const char*, uint64_t>> data;
};

// Reads a message from its slices. DataLoss naming the field and byte where
// the message is malformed (a truncated varint or length, a length past the
// end, a group wire type, a manifest that does not parse).
StatusOr<WeightChunkView> read_weight_chunk(const std::vector<grpc::Slice>& slices);
// The spans would outlive temporary slices.
StatusOr<WeightChunkView> read_weight_chunk(std::vector<grpc::Slice>&& slices) = delete;

}  // namespace relay::comm
