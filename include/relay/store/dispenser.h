#pragma once

// The prompt dispenser: hands task prompts to rollout workers as leases and
// accepts their trajectory groups, keeping the staleness bound (DESIGN.md
// invariant 6) and losing nothing (invariant 7).
//
// Staleness capacity (as AReaL's staleness manager): with B groups per
// optimizer step and trainer version v, at most (max_staleness + v + 1) x B
// groups may have been accepted (less those that expired or were
// quarantined in the store untrained) or be in flight; a worker asking for more gets fewer (or
// none: it waits for the next version). With max_staleness 0 this is synchronous RL: a step's
// groups are all leased under its version.
//
// Leases are durable (in the rollout store's RocksDB): a prompt leased to a
// worker that dies is leased again after the deadline, first in line; a late
// submission for an expired lease is refused, not counted twice. Accepting a
// group and retiring its lease is one write. A dispenser reopened on the same
// store resumes the cursor, the live leases, the retry queue and the count of
// accepted groups, so the bound holds across a trainer restart.
//
// Group commit. Every change (a lease, a release, an expiry, a submitted
// group) takes the dispenser's lock only to check and apply it in memory and
// queue its durable write: the group's record, if any, encoded beforehand
// on the caller's thread (RolloutStore::prepare). The first caller to find
// no write in progress takes everything queued by then and, under the lock,
// the state after those changes, and writes them in one RocksDB batch
// (every group and that state, one WAL fsync:
// RolloutStore::append_prepared) while the others wait for it; each returns
// once its own change is durable (invariant 7). Changes are made and queued
// under the lock, so the state the writer reads covers exactly the changes
// it took. When a write fails, that call and every change queued after it
// fail, and the in-memory state is read back from the store, so it is again
// exactly what is durable.
//
// Thread-safe.

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "relay/common/status.h"
#include "relay/rollout/trajectory.h"
#include "relay/store/rollout_store.h"

namespace relay::store {

struct DispenserOptions {
  int64_t groups_per_step = 1;  // B, >= 1
  int64_t max_staleness = 0;    // >= 0
  // The version RL started from (after a warm start, which publishes
  // versions without consuming groups): the bound counts steps, v - base.
  int64_t base_version = 0;
  int k = 1;  // samples per prompt; a submitted group must have exactly k
  int64_t lease_timeout_ms = 600000;
  // Prompt indices run 0, 1, 2, ...; a finite task wraps at num_prompts
  // (< 0 = unbounded stream).
  int64_t num_prompts = -1;
};
Status validate(const DispenserOptions& options);

struct Lease {
  uint64_t id = 0;
  int64_t prompt_index = 0;  // the task's prompt: occurrence modulo a finite task's size
  // The position in the prompt stream this lease serves: 0, 1, 2, ... over
  // every epoch of a finite task, so that no two occurrences of one prompt
  // share a group id or a seed (both derive from it). A re-lease keeps it.
  int64_t occurrence = 0;
  std::string worker_id;
  int k = 1;
  int64_t leased_version = 0;  // trainer version when leased
  int64_t deadline_unix_ms = 0;
  int attempt = 0;  // 0 = first lease of this prompt occurrence, then +1 per re-lease
};

struct DispenserStats {
  int64_t accepted = 0;  // groups accepted since the store was created
  int64_t in_flight = 0;
  int64_t retry_queue = 0;
  int64_t expired_leases = 0;  // since this dispenser opened
  int64_t rejected_late = 0;   // submissions for unknown or expired leases
  int64_t released = 0;        // leases retired because their group was refused
  int64_t next_prompt = 0;     // cursor
};

class PromptDispenser {
 public:
  using NowMs = std::function<int64_t()>;  // wall clock; injectable for tests

  // Restores the state persisted in `store` (which must outlive this).
  static StatusOr<std::unique_ptr<PromptDispenser>> open(RolloutStore* store,
                                                         DispenserOptions options,
                                                         NowMs now_ms = nullptr);

  // How many more groups may be leased at trainer version `version`.
  int64_t capacity(int64_t version) const;

  // Up to `n` leases for `worker_id`, fewer when the capacity says wait (an
  // empty list is not an error). Expired leases are re-queued first.
  StatusOr<std::vector<Lease>> lease(const std::string& worker_id, int64_t n, int64_t version);

  // Accepts the group for lease `lease_id` into the store (READY) and
  // retires the lease in one durable write; returns the group's arrival
  // number. FailedPrecondition for an unknown, retired or expired lease;
  // InvalidArgument when the group does not have the lease's k trajectories
  // or fails the store's checks. Nothing changes on error.
  StatusOr<uint64_t> submit(uint64_t lease_id, const rollout::TrajectoryGroup& group,
                            int64_t trainer_version);

  // submit() in two halves, for a caller with several groups in flight (a
  // SubmitGroups stream): begin_submit checks and applies the change in
  // memory and queues its durable write, returning at once; the
  // Submission's wait() returns once the write is durable (the group's
  // arrival number) or failed. Groups begun before any wait() go to the
  // store together: one write, one WAL fsync. begin_submit encodes the
  // group's record itself (RolloutStore::prepare, on the caller's thread and
  // before it takes the dispenser's lock), so the Submission does not refer
  // to `group`; its destructor waits when wait() was not called (a queued
  // write is never abandoned). The errors are submit()'s: begin_submit's
  // when nothing changed, wait()'s when the write failed.
  class Submission;
  StatusOr<std::unique_ptr<Submission>> begin_submit(uint64_t lease_id,
                                                     const rollout::TrajectoryGroup& group,
                                                     int64_t trainer_version);

  // Retires lease `lease_id` without a group (its group was refused) and
  // queues its prompt to be leased again (attempt + 1), so a refused group
  // neither holds capacity until the deadline nor loses its prompt.
  // NotFound for an unknown lease.
  Status release(uint64_t lease_id);

  // Re-queues the prompts of leases past their deadline; how many.
  StatusOr<int64_t> expire_leases();

  std::vector<Lease> leases() const;
  // The live lease `id`, or NotFound.
  StatusOr<Lease> find_lease(uint64_t id) const;
  DispenserStats stats() const;
  const DispenserOptions& options() const { return options_; }

 private:
  PromptDispenser(RolloutStore* store, DispenserOptions options, NowMs now_ms);
  // Moves leases past their deadline to the retry queue; how many.
  int64_t expire_locked(int64_t now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Groups the staleness bound still allows at `version`.
  int64_t room_locked(int64_t version) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One durable change waiting for its write (see "Group commit" above).
  // It carries no copy of the dispenser's state: the write encodes the
  // state once for all the changes it takes, not once per change (the
  // state holds every live lease).
  struct Commit {
    std::optional<RolloutStore::PreparedGroup> group;  // a submission's, else none
    Status status;
    uint64_t seq = 0;  // the group's arrival number, once written
    bool done = false;
  };
  // Queues `c`, a change just made under mu_.
  void enqueue_locked(Commit* c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Returns once `c` is durable (or failed), writing it and whatever else is
  // queued when no write is in progress. Called without mu_.
  Status commit(Commit* c);
  // The persisted form of the state as it is now.
  std::string encode_state_locked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After a failed write: fails every queued change and reloads the state
  // from the store.
  void recover(const Status& why);
  // Reads the persisted state (open, and after a failed write).
  Status load_locked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  RolloutStore* store_;
  DispenserOptions options_;
  NowMs now_ms_;
  // Lock order: mu_, then commit_mu_.
  mutable std::mutex mu_;
  std::mutex commit_mu_;
  std::condition_variable commit_cv_;
  std::deque<Commit*> queued_ ABSL_GUARDED_BY(commit_mu_);
  bool writing_ ABSL_GUARDED_BY(commit_mu_) = false;
  std::map<uint64_t, Lease> leases_ ABSL_GUARDED_BY(mu_);
  // Expired leases' prompts (attempt already incremented).
  std::deque<Lease> retry_ ABSL_GUARDED_BY(mu_);
  DispenserStats stats_ ABSL_GUARDED_BY(mu_);
  uint64_t next_lease_id_ ABSL_GUARDED_BY(mu_) = 1;
};

class PromptDispenser::Submission {
 public:
  ~Submission();
  Submission(const Submission&) = delete;
  Submission& operator=(const Submission&) = delete;
  // Once durable: the group's arrival number. Called at most once.
  StatusOr<uint64_t> wait();

 private:
  friend class PromptDispenser;
  explicit Submission(PromptDispenser* dispenser) : dispenser_(dispenser) {}
  PromptDispenser* dispenser_;
  Commit commit_;
  bool waited_ = false;
};

}  // namespace relay::store
