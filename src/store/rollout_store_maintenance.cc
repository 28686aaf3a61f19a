// RolloutStore's maintenance (relay/store/rollout_store.h): expiring READY
// groups that fell out of the staleness bound, compacting old records, and
// the position / rewind pair a checkpoint records and a resume replays.
// Appending, taking and reading groups are in rollout_store.cc.

#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <rocksdb/write_batch.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "relay/store/rollout_store.h"
#include "relay/v1/store.pb.h"
#include "store/store_format.h"

namespace relay::store {

StatusOr<int64_t> RolloutStore::expire_stale(int64_t min_version, int64_t trainer_version) {
  return expire_where(
      [min_version](int64_t oldest, const v1::StoredGroup*) { return oldest < min_version; },
      trainer_version);
}

StatusOr<int64_t> RolloutStore::expire_where(
    const std::function<bool(int64_t, const v1::StoredGroup*)>& expire, int64_t trainer_version,
    bool needs_record) {
  RELAY_RETURN_IF_ERROR(check_writable());
  std::lock_guard<std::mutex> lock(mu_);
  rocksdb::WriteBatch batch;
  int64_t n = 0;
  std::map<int64_t, int64_t> unready;  // by oldest version, for ready_
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  for (it->Seek("r/"); it->Valid() && it->key().starts_with("r/"); it->Next()) {
    const uint64_t seq = get_u64(it->key(), 2);
    RELAY_ASSIGN_OR_RETURN(int64_t v, ready_min_version(it->value(), seq));
    if (!needs_record && !expire(v, nullptr)) continue;
    std::string bytes;
    rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), group_key(seq), &bytes);
    if (!s.ok()) return rocks_error(absl::StrCat("read group ", seq), s);
    v1::StoredGroup rec;
    if (!rec.ParseFromString(bytes)) {
      return DataLossError(absl::StrCat("rollout store: group ", seq, ": record does not parse"));
    }
    if (needs_record && !expire(v, &rec)) continue;
    rec.set_state(v1::GROUP_STATE_EXPIRED);
    rec.set_consumed_version(trainer_version);
    batch.Put(group_key(seq), rec.SerializeAsString());
    batch.Delete(ready_key(seq));
    --unready[v];
    ++n;
  }
  if (!it->status().ok()) return rocks_error("scan ready groups", it->status());
  if (n == 0) return n;
  std::string total;
  put_u64(&total, expired_total_ + static_cast<uint64_t>(n));
  batch.Put(kExpiredKey, total);
  rocksdb::Status s = db_->Write(write_options(options_), &batch);
  if (!s.ok()) return rocks_error("expire groups", s);
  expired_total_ += static_cast<uint64_t>(n);
  ready_.change(unready);
  return n;
}

StatusOr<int64_t> RolloutStore::compact(int64_t current_version, int64_t floor) {
  RELAY_RETURN_IF_ERROR(check_writable());
  if (options_.retention_versions < 0) return int64_t{0};
  const int64_t cutoff = std::min(current_version, floor) - options_.retention_versions;
  std::lock_guard<std::mutex> lock(mu_);
  rocksdb::WriteBatch batch;
  int64_t n = 0;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  for (it->Seek("g/"); it->Valid() && it->key().starts_with("g/"); it->Next()) {
    RELAY_ASSIGN_OR_RETURN(v1::StoredGroup rec, parse_record(it->key(), it->value()));
    // REJECTED groups stay for inspection: they are rare and the evidence.
    if (rec.state() == v1::GROUP_STATE_READY || rec.state() == v1::GROUP_STATE_REJECTED ||
        rec.consumed_version() >= cutoff) {
      continue;
    }
    batch.Delete(group_key(rec.seq()));
    batch.Delete(version_key(rec.min_version(), rec.seq()));
    ++n;
  }
  if (!it->status().ok()) return rocks_error("scan groups", it->status());
  if (n > 0) {
    rocksdb::Status s = db_->Write(write_options(options_), &batch);
    if (!s.ok()) return rocks_error("compact", s);
    // Reclaim the space of the deleted range now rather than at the next
    // background compaction.
    rocksdb::Slice begin("g/"), end("h/");
    db_->CompactRange(rocksdb::CompactRangeOptions(), &begin, &end);
  }
  return n;
}

StatusOr<StorePosition> RolloutStore::position() const {
  std::lock_guard<std::mutex> lock(mu_);
  StorePosition pos;
  pos.next_seq = next_seq_;
  std::string value;
  rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), kSideRecordKey, &value);
  if (!s.ok() && !s.IsNotFound()) return rocks_error("read dispenser state", s);
  if (s.ok()) pos.side_record = std::move(value);
  return pos;
}

StatusOr<RewindStats> RolloutStore::rewind(const StorePosition& pos, int64_t version) {
  RELAY_RETURN_IF_ERROR(check_writable());
  std::lock_guard<std::mutex> lock(mu_);
  if (pos.next_seq < 1 || pos.next_seq > next_seq_) {
    return FailedPreconditionError(
        absl::StrCat("rollout store ", options_.path, ": cannot rewind to arrival ", pos.next_seq,
                     ": the store has handed out only ", next_seq_ - 1,
                     " (is this the run directory the checkpoint came from?)"));
  }
  RewindStats stats;
  int64_t unexpired = 0;                    // EXPIRED after the position, READY again
  std::map<int64_t, int64_t> ready_change;  // by oldest version, for ready_
  rocksdb::WriteBatch batch;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  for (it->Seek("g/"); it->Valid() && it->key().starts_with("g/"); it->Next()) {
    RELAY_ASSIGN_OR_RETURN(v1::StoredGroup rec, parse_record(it->key(), it->value()));
    const bool ready = rec.state() == v1::GROUP_STATE_READY;
    // Quarantine is final: a resumed run would only reject the group again.
    if (rec.state() == v1::GROUP_STATE_REJECTED) continue;
    if (rec.seq() >= pos.next_seq) {
      // Not in the store at the checkpoint: the resumed run must not see it.
      if (rec.state() == v1::GROUP_STATE_EXPIRED) continue;
      rec.set_state(v1::GROUP_STATE_EXPIRED);
      rec.set_consumed_version(version);
      if (ready) {
        batch.Delete(ready_key(rec.seq()));
        --ready_change[rec.min_version()];
      }
      ++stats.dropped;
    } else if (!ready && rec.consumed_version() >= version) {
      // Taken (or expired) after the checkpoint: READY again, as it was then.
      if (rec.state() == v1::GROUP_STATE_EXPIRED) ++unexpired;
      rec.set_state(v1::GROUP_STATE_READY);
      rec.set_consumed_version(-1);
      batch.Put(ready_key(rec.seq()), ready_value(rec.min_version()));
      ++ready_change[rec.min_version()];
      ++stats.restored;
    } else {
      continue;
    }
    batch.Put(group_key(rec.seq()), rec.SerializeAsString());
  }
  if (!it->status().ok()) return rocks_error("scan groups", it->status());
  // The expired count follows the groups' states: the dispenser's staleness
  // room is (appended - expired), and dropped groups must give their place
  // back just as groups expired by the bound do.
  const uint64_t expired_after =
      expired_total_ + static_cast<uint64_t>(stats.dropped) - static_cast<uint64_t>(unexpired);
  std::string total;
  put_u64(&total, expired_after);
  batch.Put(kExpiredKey, total);
  if (pos.side_record.empty()) {
    batch.Delete(kSideRecordKey);
  } else {
    batch.Put(kSideRecordKey, pos.side_record);
  }
  rocksdb::Status s = db_->Write(write_options(options_), &batch);
  if (!s.ok()) return rocks_error("rewind", s);
  expired_total_ = expired_after;
  ready_.change(ready_change);
  return stats;
}

}  // namespace relay::store
