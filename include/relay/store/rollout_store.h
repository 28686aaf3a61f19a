#pragma once

// The durable rollout store (DESIGN.md invariant 7): every acknowledged
// trajectory group, with its per-token behavior log-probs, proximal log-probs,
// versions and masks, in RocksDB.
//
// Layout (one column family, prefixed keys, big-endian numbers so RocksDB's
// byte order is numeric order):
//   g/<seq>              StoredGroup record (proto/relay/v1/store.proto)
//   r/<seq>              index: groups READY for the trainer, FIFO by arrival; the
//                        value is the group's oldest token version
//   v/<min_version><seq> index: every group by its oldest token version
//   m/next_seq           the next arrival number
// Each change is one WriteBatch, so a record and its indexes never disagree,
// and append() returns only after the batch is durable (WAL fsync'd unless
// sync_writes is off, for tests and benchmarks of the non-durable path).
//
// Lifecycle: append -> READY; take_ready() hands the oldest READY groups
// within the staleness bound to the trainer and marks them CONSUMED at the
// trainer's version in the same batch; READY groups that fell out of the
// bound are marked EXPIRED; a taken group the trainer cannot train on is
// marked REJECTED by reject() (quarantine: kept with its reason, never
// compacted, never made READY again by a rewind); compact() deletes
// CONSUMED/EXPIRED groups whose consumed_version is older than the retention
// window. A store reopened after a crash holds every acknowledged group in
// the state it last had.
//
// The READY groups are also counted in memory (store/ready_counts.h), so
// that the trainer waits for them on a condition variable that appends
// signal, not by polling the index.
//
// Thread-safe: appends from many submitters and the trainer's reads may
// interleave; each public call is atomic.

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "relay/common/status.h"
#include "relay/rollout/trajectory.h"
#include "relay/store/ready_counts.h"

namespace rocksdb {
class DB;
}
namespace relay::v1 {
class StoredGroup;
}

namespace relay::store {

struct StoreOptions {
  std::string path;         // directory; created when missing
  bool sync_writes = true;  // fsync the WAL before append()/take_ready() return
  // Consumed or expired groups are kept for this many trainer versions after
  // they were consumed (for replay and `relay store inspect`), then compact()
  // deletes them. < 0 = keep forever.
  int64_t retention_versions = 8;
  // Open without taking RocksDB's lock, for inspection next to a running
  // trainer; every write then fails with FailedPrecondition.
  bool read_only = false;
};

enum class GroupState { kReady, kConsumed, kExpired, kRejected };
// "ready" | "consumed" | "expired" | "rejected"
const char* group_state_name(GroupState state);

struct StoredGroup {
  uint64_t seq = 0;  // arrival order, from 1
  GroupState state = GroupState::kReady;
  int64_t min_version = 0;  // oldest token version of any trajectory
  int64_t max_version = 0;
  int64_t arrival_version = 0;  // trainer version when appended
  int64_t arrival_unix_ms = 0;
  int64_t consumed_version = -1;  // version that consumed, expired or rejected it; -1 while ready
  std::string reject_reason;      // kRejected: why the trainer could not train on it
  rollout::TrajectoryGroup group;
};

struct VersionCounts {
  int64_t ready = 0, consumed = 0, expired = 0, rejected = 0;
  double reward_sum = 0;  // over the samples (not baselines) of these groups
  int64_t trajectories = 0;
};

// Where the store stood at one moment: what a checkpoint records so that a
// resumed run sees the store as it was then (RolloutStore::rewind).
struct StorePosition {
  uint64_t next_seq = 1;    // groups with seq >= this arrived after that moment
  std::string side_record;  // the prompt dispenser's state then (may be empty)
};

struct RewindStats {
  int64_t restored = 0;  // consumed or expired after the position, READY again
  int64_t dropped = 0;   // arrived after the position, marked EXPIRED
};

struct StoreStats {
  int64_t ready = 0, consumed = 0, expired = 0, rejected = 0;
  uint64_t next_seq = 1;
  std::map<int64_t, VersionCounts> by_min_version;
};

class RolloutStore {
 public:
  // Opens (or creates) the store at options.path. InvalidArgument for an
  // empty path; Internal with RocksDB's message (and the path) otherwise.
  static StatusOr<std::unique_ptr<RolloutStore>> open(const StoreOptions& options);
  ~RolloutStore();

  // Stores the group as READY and returns its arrival number once it is
  // durable. InvalidArgument (naming the trajectory) for a group without
  // trajectories or one that fails rollout::check_trajectory().
  // With `side_record` (the prompt dispenser's state), that record is
  // written in the same batch, so a group and its lease's retirement are one
  // durable change.
  StatusOr<uint64_t> append(const rollout::TrajectoryGroup& group, int64_t trainer_version,
                            const std::string* side_record = nullptr);
  // What append() refuses a group for, checked without writing.
  static Status check_group(const rollout::TrajectoryGroup& group);
  // A group checked and encoded for appending: all of its record but the
  // arrival number, which only the write knows. Group commit writes many
  // callers' groups on one thread; each caller prepares its own first, on
  // its own thread and outside every lock, so that the write only numbers
  // the records and stores them.
  struct PreparedGroup {
    std::string group_id;  // for errors
    int64_t min_version = 0;
    std::string unnumbered;  // the StoredGroup record without its seq
  };
  // check_group's errors; the group is READY, arrived at `trainer_version`
  // now.
  static StatusOr<PreparedGroup> prepare(const rollout::TrajectoryGroup& group,
                                         int64_t trainer_version);
  // Several prepared groups (not null) and optionally the side record in one
  // durable write, all or nothing: their arrival numbers in order. This is
  // group commit (PromptDispenser): one WAL fsync for every submission that
  // arrived meanwhile.
  StatusOr<std::vector<uint64_t>> append_prepared(const std::vector<const PreparedGroup*>& groups,
                                                  const std::string* side_record);

  // Groups ever appended (arrival numbers handed out), compaction or not.
  uint64_t appended() const;
  // Writes that appended groups since this store opened: with group commit
  // (append_prepared), fewer than the groups.
  uint64_t append_writes() const;
  // Groups marked EXPIRED (never trained on), compaction or not; a rewind
  // adds the groups it drops and subtracts those it makes READY again.
  uint64_t expired_total() const;
  // Groups marked REJECTED (quarantined, never trained on).
  uint64_t rejected_total() const;

  // Quarantines group `seq`, taken by the trainer (CONSUMED) or READY: marks
  // it REJECTED at `trainer_version` with `reason`, in one durable write.
  // NotFound for an unknown seq; FailedPrecondition for an EXPIRED or
  // already REJECTED group.
  Status reject(uint64_t seq, const std::string& reason, int64_t trainer_version);
  // The prompt dispenser's persisted state (an opaque record); empty string
  // when none was written.
  Status put_side_record(const std::string& record);
  StatusOr<std::string> side_record() const;

  // Up to `max_groups` READY groups, oldest arrival first, whose oldest token
  // is at least `min_version`, marked CONSUMED at `trainer_version` in the
  // same write; READY groups older than min_version that the scan passes are
  // marked EXPIRED (counted in *expired). A READY record that parses but
  // fails rollout::check_trajectory is marked REJECTED with the reason, in
  // the same write (rejected_total() counts it). min_version < 0: no bound.
  StatusOr<std::vector<StoredGroup>> take_ready(int64_t max_groups, int64_t min_version,
                                                int64_t trainer_version,
                                                int64_t* expired = nullptr);

  // Marks every READY group whose oldest token is older than `min_version`
  // EXPIRED (consumed_version = trainer_version); how many. The trainer calls
  // it when its version moves, so stale groups give their place in the
  // staleness bound back at once instead of when a scan passes them.
  StatusOr<int64_t> expire_stale(int64_t min_version, int64_t trainer_version);

  // The current position: next arrival number and dispenser state, read
  // together (append writes both in one batch).
  StatusOr<StorePosition> position() const;

  // Puts the store back where it stood at `pos`, taken when the trainer was
  // at `version` (a checkpoint): groups that arrived later are marked
  // EXPIRED, groups consumed or expired at `version` or later are READY
  // again, and the dispenser state is pos.side_record. One durable write. A
  // trainer resumed from that checkpoint then trains on exactly the groups
  // an uninterrupted run would have, and the dispenser hands out the prompts
  // it would have. Needs compaction to have kept every group consumed at
  // `version` or later (compact's `floor`).
  StatusOr<RewindStats> rewind(const StorePosition& pos, int64_t version);

  // READY groups a trainer could take now (within min_version, < 0: every
  // one), without changing anything. Counted in memory: no scan, and not
  // under the lock that appends take.
  int64_t count_ready(int64_t min_version) const { return ready_.count(min_version); }
  // Blocks until count_ready(min_version) >= want, `deadline` passes, or
  // `stop` returns true (ReadyCounts::wait: it must be quick and must not
  // call the store); returns count_ready(min_version) then. Groups made
  // READY by append() or rewind() wake it at once.
  int64_t wait_for_ready(int64_t want, int64_t min_version,
                         std::chrono::steady_clock::time_point deadline,
                         const std::function<bool()>& stop = nullptr) const {
    return ready_.wait(want, min_version, deadline, stop);
  }
  // Makes every wait_for_ready() in progress ask its `stop` again: call it
  // after setting what `stop` reads (not from a signal handler).
  void wake_waiters() const { ready_.wake(); }

  // Deletes CONSUMED and EXPIRED groups with consumed_version <
  // min(current_version, floor) - retention_versions; returns how many. The
  // trainer passes its last checkpoint's version as `floor`, so every group
  // a rewind to that checkpoint needs is still there.
  StatusOr<int64_t> compact(int64_t current_version, int64_t floor = INT64_MAX);

  StatusOr<StoredGroup> get(uint64_t seq) const;
  // Every group in arrival order (inspection, replay).
  StatusOr<std::vector<StoredGroup>> scan(uint64_t from_seq = 1, int64_t limit = -1) const;
  StatusOr<StoreStats> stats() const;

  const std::string& path() const { return options_.path; }

 private:
  // The totals are expired_total() and rejected_total() as last written.
  RolloutStore(StoreOptions options, std::unique_ptr<rocksdb::DB> db, uint64_t next_seq,
               uint64_t expired_total, uint64_t rejected_total);
  Status check_writable() const;
  // Marks READY groups EXPIRED where expire(oldest version, record) holds;
  // the record is parsed (and passed) only when `needs_record`.
  StatusOr<int64_t> expire_where(const std::function<bool(int64_t, const v1::StoredGroup*)>& expire,
                                 int64_t trainer_version, bool needs_record = false);

  const StoreOptions options_;
  // RocksDB is thread-safe; mu_ makes each public call's read-modify-write
  // of the indexes and the counters below one atomic step.
  const std::unique_ptr<rocksdb::DB> db_;
  mutable std::mutex mu_;
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_);
  uint64_t append_writes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t expired_total_ ABSL_GUARDED_BY(mu_);
  uint64_t rejected_total_ ABSL_GUARDED_BY(mu_);
  // Changed under mu_ after each durable write that makes groups READY or
  // takes them away; read without it.
  ReadyCounts ready_;
};

}  // namespace relay::store
