// The rollout store's on-disk format: keys, index values and records
// (store_format.h).

#include "store/store_format.h"

#include "absl/strings/str_cat.h"
#include "relay/store/convert.h"
#include "relay/v1/store.pb.h"

namespace relay::store {
namespace {

// Versions are offset by 2^63 so that -1 sorts before 0.
uint64_t ordered(int64_t v) { return static_cast<uint64_t>(v) ^ (uint64_t{1} << 63); }

v1::GroupState state_to_proto(GroupState s) {
  switch (s) {
    case GroupState::kReady:
      return v1::GROUP_STATE_READY;
    case GroupState::kConsumed:
      return v1::GROUP_STATE_CONSUMED;
    case GroupState::kExpired:
      return v1::GROUP_STATE_EXPIRED;
    case GroupState::kRejected:
      return v1::GROUP_STATE_REJECTED;
  }
  return v1::GROUP_STATE_UNSPECIFIED;
}

}  // namespace

void put_u64(std::string* out, uint64_t v) {
  for (int i = 7; i >= 0; --i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint64_t get_u64(const rocksdb::Slice& s, size_t at) {
  uint64_t v = 0;
  for (size_t i = 0; i < 8; ++i) v = (v << 8) | static_cast<unsigned char>(s.data()[at + i]);
  return v;
}

std::string group_key(uint64_t seq) {
  std::string k = "g/";
  put_u64(&k, seq);
  return k;
}
std::string ready_key(uint64_t seq) {
  std::string k = "r/";
  put_u64(&k, seq);
  return k;
}
std::string version_key(int64_t min_version, uint64_t seq) {
  std::string k = "v/";
  put_u64(&k, ordered(min_version));
  put_u64(&k, seq);
  return k;
}

std::string ready_value(int64_t min_version) {
  std::string v;
  put_u64(&v, ordered(min_version));
  return v;
}
StatusOr<int64_t> ready_min_version(const rocksdb::Slice& value, uint64_t seq) {
  if (value.size() != 8) {
    return DataLossError(absl::StrCat("rollout store: ready index of group ", seq, " has ",
                                      value.size(), " bytes, expected 8"));
  }
  return static_cast<int64_t>(get_u64(value, 0) ^ (uint64_t{1} << 63));
}

Status rocks_error(const std::string& what, const rocksdb::Status& s) {
  return InternalError(absl::StrCat("rollout store: ", what, ": ", s.ToString()));
}

StatusOr<StoredGroup> decode(uint64_t seq, const std::string& bytes) {
  v1::StoredGroup rec;
  if (!rec.ParseFromString(bytes)) {
    return DataLossError(absl::StrCat("rollout store: group ", seq, ": record does not parse"));
  }
  StoredGroup g;
  g.seq = rec.seq();
  switch (rec.state()) {
    case v1::GROUP_STATE_READY:
      g.state = GroupState::kReady;
      break;
    case v1::GROUP_STATE_CONSUMED:
      g.state = GroupState::kConsumed;
      break;
    case v1::GROUP_STATE_EXPIRED:
      g.state = GroupState::kExpired;
      break;
    case v1::GROUP_STATE_REJECTED:
      g.state = GroupState::kRejected;
      break;
    default:
      return DataLossError(
          absl::StrCat("rollout store: group ", seq, ": unknown state ", rec.state()));
  }
  g.min_version = rec.min_version();
  g.max_version = rec.max_version();
  g.arrival_version = rec.arrival_version();
  g.arrival_unix_ms = rec.arrival_unix_ms();
  g.consumed_version = rec.consumed_version();
  g.reject_reason = rec.reject_reason();
  // A quarantined group may be exactly what fails the checks: read it back
  // as stored, so that inspection can show it.
  StatusOr<rollout::TrajectoryGroup> group =
      from_proto(rec.group(), /*check=*/g.state != GroupState::kRejected);
  if (!group.ok()) {
    return DataLossError(
        absl::StrCat("rollout store: group ", seq, ": ", std::string(group.status().message())));
  }
  g.group = *std::move(group);
  return g;
}

StatusOr<v1::StoredGroup> parse_record(const rocksdb::Slice& key, const rocksdb::Slice& value) {
  v1::StoredGroup rec;
  if (!rec.ParseFromArray(value.data(), static_cast<int>(value.size()))) {
    return DataLossError(
        absl::StrCat("rollout store: group ", get_u64(key, 2), ": record does not parse"));
  }
  return rec;
}

std::string encode(const StoredGroup& g) { return encode(g, g.group); }

std::string encode(const StoredGroup& g, const rollout::TrajectoryGroup& group) {
  v1::StoredGroup rec;
  rec.set_seq(g.seq);
  rec.set_state(state_to_proto(g.state));
  rec.set_min_version(g.min_version);
  rec.set_max_version(g.max_version);
  rec.set_arrival_version(g.arrival_version);
  rec.set_arrival_unix_ms(g.arrival_unix_ms);
  rec.set_consumed_version(g.consumed_version);
  rec.set_reject_reason(g.reject_reason);
  to_proto(group, rec.mutable_group());
  return rec.SerializeAsString();
}

std::string seq_field(uint64_t seq) {
  std::string out(1, static_cast<char>(v1::StoredGroup::kSeqFieldNumber << 3));  // a varint
  for (; seq >= 0x80; seq >>= 7) out.push_back(static_cast<char>((seq & 0x7f) | 0x80));
  out.push_back(static_cast<char>(seq));
  return out;
}

rocksdb::WriteOptions write_options(const StoreOptions& o) {
  rocksdb::WriteOptions w;
  w.sync = o.sync_writes;
  return w;
}

}  // namespace relay::store
