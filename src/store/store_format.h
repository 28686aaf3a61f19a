#pragma once

// The rollout store's on-disk format (private to src/store): the key layout
// described in relay/store/rollout_store.h, the READY index's values and the
// StoredGroup record's encoding, plus the small RocksDB helpers every store
// operation shares. Kept apart from RolloutStore's operations so the format
// can be read (and changed) in one place.

#include <rocksdb/options.h>
#include <rocksdb/slice.h>
#include <rocksdb/status.h>

#include <cstdint>
#include <string>

#include "relay/common/status.h"
#include "relay/store/rollout_store.h"
#include "relay/v1/store.pb.h"

namespace relay::store {

// Big-endian, so that byte order is numeric order.
void put_u64(std::string* out, uint64_t v);
uint64_t get_u64(const rocksdb::Slice& s, size_t at);

// Keys of a group's record, its READY index entry and its version index entry.
std::string group_key(uint64_t seq);
std::string ready_key(uint64_t seq);
std::string version_key(int64_t min_version, uint64_t seq);

// The READY index carries each group's oldest token version, so that
// expire_stale() and counting the READY groups when the store opens read 8
// bytes per group instead of parsing its whole record.
std::string ready_value(int64_t min_version);
// DataLoss when the value is not 8 bytes.
StatusOr<int64_t> ready_min_version(const rocksdb::Slice& value, uint64_t seq);

inline constexpr char kNextSeqKey[] = "m/next_seq";
inline constexpr char kSideRecordKey[] = "m/dispenser";
inline constexpr char kExpiredKey[] = "m/expired_total";
inline constexpr char kRejectedKey[] = "m/rejected_total";

// Internal, with `what` and RocksDB's message.
Status rocks_error(const std::string& what, const rocksdb::Status& s);

// The record of group `seq` read back: DataLoss when it does not parse, has
// an unknown state, or (unless REJECTED) fails the trajectory checks.
StatusOr<StoredGroup> decode(uint64_t seq, const std::string& bytes);
std::string encode(const StoredGroup& g);
// encode(g) with `group` for g.group (which is not read), so that a group
// need not be copied into a StoredGroup to be encoded.
std::string encode(const StoredGroup& g, const rollout::TrajectoryGroup& group);
// A record encoded with seq 0 (which proto3 leaves out) is numbered
// afterwards by putting seq_field(s) in front of it: seq_field(s) +
// encode(g) is encode(g with seq s) byte for byte, for s >= 1, because seq
// is field 1 and fields serialize in number order.
std::string seq_field(uint64_t seq);
// The raw record under group key `key` (scans that need only its state and
// versions): DataLoss naming the group when it does not parse.
StatusOr<v1::StoredGroup> parse_record(const rocksdb::Slice& key, const rocksdb::Slice& value);

rocksdb::WriteOptions write_options(const StoreOptions& o);

}  // namespace relay::store
