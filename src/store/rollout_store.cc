// RolloutStore (relay/store/rollout_store.h): opening the store, appending
// groups, taking and quarantining them, and reading them back. Expiry,
// compaction and rewind are in rollout_store_maintenance.cc; the key and
// record format in store_format.cc.

#include "relay/store/rollout_store.h"

#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <rocksdb/write_batch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "relay/v1/store.pb.h"
#include "store/store_format.h"

namespace relay::store {
namespace {

// The READY index counted by oldest token version (ReadyCounts::reset).
StatusOr<std::map<int64_t, int64_t>> count_ready_index(rocksdb::DB& db) {
  std::map<int64_t, int64_t> by_version;
  std::unique_ptr<rocksdb::Iterator> it(db.NewIterator(rocksdb::ReadOptions()));
  for (it->Seek("r/"); it->Valid() && it->key().starts_with("r/"); it->Next()) {
    RELAY_ASSIGN_OR_RETURN(int64_t v, ready_min_version(it->value(), get_u64(it->key(), 2)));
    ++by_version[v];
  }
  if (!it->status().ok()) return rocks_error("scan ready groups", it->status());
  return by_version;
}

}  // namespace

const char* group_state_name(GroupState state) {
  switch (state) {
    case GroupState::kReady:
      return "ready";
    case GroupState::kConsumed:
      return "consumed";
    case GroupState::kExpired:
      return "expired";
    case GroupState::kRejected:
      return "rejected";
  }
  return "?";
}

RolloutStore::RolloutStore(StoreOptions options, std::unique_ptr<rocksdb::DB> db, uint64_t next_seq,
                           uint64_t expired_total, uint64_t rejected_total)
    : options_(std::move(options)),
      db_(std::move(db)),
      next_seq_(next_seq),
      expired_total_(expired_total),
      rejected_total_(rejected_total) {}

RolloutStore::~RolloutStore() = default;

StatusOr<std::unique_ptr<RolloutStore>> RolloutStore::open(const StoreOptions& options) {
  if (options.path.empty()) return InvalidArgumentError("rollout store: path is empty");
  rocksdb::Options o;
  o.create_if_missing = true;
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s;
  if (options.read_only) {
    if (!std::filesystem::is_directory(options.path)) {
      return NotFoundError(absl::StrCat("rollout store: no store at ", options.path));
    }
    s = rocksdb::DB::OpenForReadOnly(o, options.path, &raw);
  } else {
    s = rocksdb::DB::Open(o, options.path, &raw);
  }
  if (!s.ok()) return rocks_error(absl::StrCat("open ", options.path), s);
  std::unique_ptr<rocksdb::DB> db(raw);
  std::string value;
  uint64_t next_seq = 1;
  s = db->Get(rocksdb::ReadOptions(), kNextSeqKey, &value);
  if (s.ok()) {
    if (value.size() != 8) {
      return DataLossError(absl::StrCat("rollout store ", options.path, ": ", kNextSeqKey, " has ",
                                        value.size(), " bytes, expected 8"));
    }
    next_seq = get_u64(value, 0);
  } else if (!s.IsNotFound()) {
    return rocks_error(absl::StrCat("read ", kNextSeqKey), s);
  }
  uint64_t totals[2] = {0, 0};
  const char* total_keys[2] = {kExpiredKey, kRejectedKey};
  for (int i = 0; i < 2; ++i) {
    s = db->Get(rocksdb::ReadOptions(), total_keys[i], &value);
    if (s.ok() && value.size() == 8) {
      totals[i] = get_u64(value, 0);
    } else if (!s.ok() && !s.IsNotFound()) {
      return rocks_error(absl::StrCat("read ", total_keys[i]), s);
    }
  }
  using ByVersion = std::map<int64_t, int64_t>;  // one template argument for the macro
  RELAY_ASSIGN_OR_RETURN(ByVersion ready, count_ready_index(*db));
  auto store = std::unique_ptr<RolloutStore>(
      new RolloutStore(options, std::move(db), next_seq, totals[0], totals[1]));
  store->ready_.reset(std::move(ready));
  return store;
}

Status RolloutStore::check_writable() const {
  if (!options_.read_only) return OkStatus();
  return FailedPreconditionError(
      absl::StrCat("rollout store ", options_.path, " is open read-only"));
}

Status RolloutStore::check_group(const rollout::TrajectoryGroup& group) {
  if (group.trajectories.empty()) {
    return InvalidArgumentError(
        absl::StrCat("rollout store: group '", group.group_id, "' has no trajectories"));
  }
  for (size_t i = 0; i < group.trajectories.size(); ++i) {
    if (Status st = rollout::check_trajectory(group.trajectories[i]); !st.ok()) {
      return InvalidArgumentError(absl::StrCat("rollout store: group '", group.group_id,
                                               "' trajectory ", i, ": ",
                                               std::string(st.message())));
    }
  }
  return OkStatus();
}

StatusOr<uint64_t> RolloutStore::append(const rollout::TrajectoryGroup& group,
                                        int64_t trainer_version, const std::string* side_record) {
  RELAY_RETURN_IF_ERROR(check_writable());
  RELAY_ASSIGN_OR_RETURN(PreparedGroup p, prepare(group, trainer_version));
  RELAY_ASSIGN_OR_RETURN(std::vector<uint64_t> seqs, append_prepared({&p}, side_record));
  return seqs.front();
}

StatusOr<RolloutStore::PreparedGroup> RolloutStore::prepare(const rollout::TrajectoryGroup& group,
                                                            int64_t trainer_version) {
  RELAY_RETURN_IF_ERROR(check_group(group));
  StoredGroup g;  // its fields; the group itself is encoded from `group`
  g.min_version = INT64_MAX;
  g.max_version = INT64_MIN;
  for (const rollout::Trajectory& t : group.trajectories) {
    for (int64_t v : t.token_versions) {
      g.min_version = std::min(g.min_version, v);
      g.max_version = std::max(g.max_version, v);
    }
  }
  if (g.min_version > g.max_version) g.min_version = g.max_version = trainer_version;
  g.arrival_version = trainer_version;
  g.arrival_unix_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  PreparedGroup p;
  p.group_id = group.group_id;
  p.min_version = g.min_version;
  p.unnumbered = encode(g, group);
  return p;
}

StatusOr<std::vector<uint64_t>> RolloutStore::append_prepared(
    const std::vector<const PreparedGroup*>& groups, const std::string* side_record) {
  RELAY_RETURN_IF_ERROR(check_writable());
  std::lock_guard<std::mutex> lock(mu_);
  rocksdb::WriteBatch batch;
  std::vector<uint64_t> seqs;
  for (const PreparedGroup* g : groups) {
    const uint64_t seq = next_seq_ + seqs.size();
    // The record in two parts, so it is copied once (into the batch).
    const std::string key = group_key(seq), number = seq_field(seq);
    const rocksdb::Slice key_part(key), value_parts[2] = {number, g->unnumbered};
    batch.Put(rocksdb::SliceParts(&key_part, 1), rocksdb::SliceParts(value_parts, 2));
    batch.Put(ready_key(seq), ready_value(g->min_version));
    batch.Put(version_key(g->min_version, seq), "");
    seqs.push_back(seq);
  }
  if (!groups.empty()) {
    std::string next;
    put_u64(&next, next_seq_ + seqs.size());
    batch.Put(kNextSeqKey, next);
  }
  if (side_record != nullptr) batch.Put(kSideRecordKey, *side_record);
  rocksdb::Status s = db_->Write(write_options(options_), &batch);
  if (!s.ok()) {
    return rocks_error(groups.size() == 1 ? absl::StrCat("append group '", groups[0]->group_id, "'")
                                          : absl::StrCat("append ", groups.size(), " groups"),
                       s);
  }
  next_seq_ += seqs.size();
  if (!groups.empty()) ++append_writes_;
  std::map<int64_t, int64_t> added;
  for (const PreparedGroup* g : groups) ++added[g->min_version];
  if (!added.empty()) ready_.change(added);
  return seqs;
}

StatusOr<std::vector<StoredGroup>> RolloutStore::take_ready(int64_t max_groups, int64_t min_version,
                                                            int64_t trainer_version,
                                                            int64_t* expired) {
  RELAY_RETURN_IF_ERROR(check_writable());
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<StoredGroup> out;
  int64_t n_expired = 0, n_rejected = 0;
  std::map<int64_t, int64_t> unready;  // by oldest version, for ready_
  rocksdb::WriteBatch batch;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  for (it->Seek("r/"); it->Valid() && it->key().starts_with("r/"); it->Next()) {
    if (static_cast<int64_t>(out.size()) >= max_groups) break;
    const uint64_t seq = get_u64(it->key(), 2);
    // Every READY key this loop reaches leaves the index below.
    RELAY_ASSIGN_OR_RETURN(int64_t oldest, ready_min_version(it->value(), seq));
    --unready[oldest];
    std::string bytes;
    rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), group_key(seq), &bytes);
    if (!s.ok()) return rocks_error(absl::StrCat("read group ", seq), s);
    StatusOr<StoredGroup> decoded = decode(seq, bytes);
    if (!decoded.ok()) {
      // A record that parses but fails the trajectory checks (written by a
      // build with looser ones) is quarantined, not handed out and not
      // allowed to stop every future take. One that does not parse is
      // corruption: an error.
      v1::StoredGroup rec;
      if (!rec.ParseFromString(bytes)) return decoded.status();
      rec.set_state(v1::GROUP_STATE_REJECTED);
      rec.set_consumed_version(trainer_version);
      rec.set_reject_reason(std::string(decoded.status().message()));
      batch.Put(group_key(seq), rec.SerializeAsString());
      batch.Delete(ready_key(seq));
      ++n_rejected;
      continue;
    }
    StoredGroup g = *std::move(decoded);
    const bool stale = min_version >= 0 && g.min_version < min_version;
    g.state = stale ? GroupState::kExpired : GroupState::kConsumed;
    g.consumed_version = trainer_version;
    batch.Put(group_key(seq), encode(g));
    batch.Delete(ready_key(seq));
    if (stale) {
      ++n_expired;
    } else {
      out.push_back(std::move(g));
    }
  }
  if (!it->status().ok()) return rocks_error("scan ready groups", it->status());
  if (n_expired > 0) {
    std::string total;
    put_u64(&total, expired_total_ + static_cast<uint64_t>(n_expired));
    batch.Put(kExpiredKey, total);
  }
  if (n_rejected > 0) {
    std::string total;
    put_u64(&total, rejected_total_ + static_cast<uint64_t>(n_rejected));
    batch.Put(kRejectedKey, total);
  }
  if (batch.Count() > 0) {
    rocksdb::Status s = db_->Write(write_options(options_), &batch);
    if (!s.ok()) return rocks_error("mark groups consumed", s);
  }
  expired_total_ += static_cast<uint64_t>(n_expired);
  rejected_total_ += static_cast<uint64_t>(n_rejected);
  ready_.change(unready);
  if (expired != nullptr) *expired = n_expired;
  return out;
}
uint64_t RolloutStore::expired_total() const {
  std::lock_guard<std::mutex> lock(mu_);
  return expired_total_;
}

uint64_t RolloutStore::rejected_total() const {
  std::lock_guard<std::mutex> lock(mu_);
  return rejected_total_;
}

Status RolloutStore::reject(uint64_t seq, const std::string& reason, int64_t trainer_version) {
  RELAY_RETURN_IF_ERROR(check_writable());
  std::lock_guard<std::mutex> lock(mu_);
  std::string bytes;
  rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), group_key(seq), &bytes);
  if (s.IsNotFound()) return NotFoundError(absl::StrCat("rollout store: no group ", seq));
  if (!s.ok()) return rocks_error(absl::StrCat("read group ", seq), s);
  v1::StoredGroup rec;
  if (!rec.ParseFromString(bytes)) {
    return DataLossError(absl::StrCat("rollout store: group ", seq, ": record does not parse"));
  }
  if (rec.state() != v1::GROUP_STATE_READY && rec.state() != v1::GROUP_STATE_CONSUMED) {
    return FailedPreconditionError(
        absl::StrCat("rollout store: group ", seq, " is ",
                     rec.state() == v1::GROUP_STATE_EXPIRED ? "expired" : "already rejected",
                     "; only a ready or taken group is quarantined"));
  }
  rocksdb::WriteBatch batch;
  const bool was_ready = rec.state() == v1::GROUP_STATE_READY;
  if (was_ready) batch.Delete(ready_key(seq));
  rec.set_state(v1::GROUP_STATE_REJECTED);
  rec.set_consumed_version(trainer_version);
  rec.set_reject_reason(reason);
  batch.Put(group_key(seq), rec.SerializeAsString());
  std::string total;
  put_u64(&total, rejected_total_ + 1);
  batch.Put(kRejectedKey, total);
  s = db_->Write(write_options(options_), &batch);
  if (!s.ok()) return rocks_error(absl::StrCat("reject group ", seq), s);
  ++rejected_total_;
  if (was_ready) ready_.change({{rec.min_version(), -1}});
  return OkStatus();
}

uint64_t RolloutStore::appended() const {
  std::lock_guard<std::mutex> lock(mu_);
  return next_seq_ - 1;
}

uint64_t RolloutStore::append_writes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return append_writes_;
}
Status RolloutStore::put_side_record(const std::string& record) {
  RELAY_RETURN_IF_ERROR(check_writable());
  // Under mu_ so that position() never pairs a side record with an
  // arrival number it was not written with.
  std::lock_guard<std::mutex> lock(mu_);
  rocksdb::Status s = db_->Put(write_options(options_), kSideRecordKey, record);
  if (!s.ok()) return rocks_error("write dispenser state", s);
  return OkStatus();
}

StatusOr<std::string> RolloutStore::side_record() const {
  std::string value;
  rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), kSideRecordKey, &value);
  if (s.IsNotFound()) return std::string();
  if (!s.ok()) return rocks_error("read dispenser state", s);
  return value;
}

StatusOr<StoredGroup> RolloutStore::get(uint64_t seq) const {
  std::string bytes;
  rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), group_key(seq), &bytes);
  if (s.IsNotFound()) return NotFoundError(absl::StrCat("rollout store: no group ", seq));
  if (!s.ok()) return rocks_error(absl::StrCat("read group ", seq), s);
  return decode(seq, bytes);
}

StatusOr<std::vector<StoredGroup>> RolloutStore::scan(uint64_t from_seq, int64_t limit) const {
  std::vector<StoredGroup> out;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  for (it->Seek(group_key(from_seq)); it->Valid() && it->key().starts_with("g/"); it->Next()) {
    if (limit >= 0 && static_cast<int64_t>(out.size()) >= limit) break;
    RELAY_ASSIGN_OR_RETURN(StoredGroup g, decode(get_u64(it->key(), 2), it->value().ToString()));
    out.push_back(std::move(g));
  }
  if (!it->status().ok()) return rocks_error("scan groups", it->status());
  return out;
}

StatusOr<StoreStats> RolloutStore::stats() const {
  StoreStats st;
  {
    std::lock_guard<std::mutex> lock(mu_);
    st.next_seq = next_seq_;
  }
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  for (it->Seek("g/"); it->Valid() && it->key().starts_with("g/"); it->Next()) {
    RELAY_ASSIGN_OR_RETURN(v1::StoredGroup rec, parse_record(it->key(), it->value()));
    VersionCounts& c = st.by_min_version[rec.min_version()];
    switch (rec.state()) {
      case v1::GROUP_STATE_READY:
        ++st.ready;
        ++c.ready;
        break;
      case v1::GROUP_STATE_CONSUMED:
        ++st.consumed;
        ++c.consumed;
        break;
      case v1::GROUP_STATE_REJECTED:
        ++st.rejected;
        ++c.rejected;
        break;
      default:
        ++st.expired;
        ++c.expired;
        break;
    }
    for (const v1::Trajectory& t : rec.group().trajectories()) {
      if (std::isfinite(t.reward())) {
        c.reward_sum += t.reward();
        ++c.trajectories;
      }
    }
  }
  if (!it->status().ok()) return rocks_error("scan groups", it->status());
  return st;
}

}  // namespace relay::store
