#pragma once

// The READY groups of a RolloutStore, counted by oldest token version in
// memory next to RocksDB's READY index, and a wait for enough of them. The
// trainer waits here for a step's worth of groups: it neither scans the
// index nor takes the store's lock (which every append needs), and an append
// or a rewind that makes groups READY wakes it at once.
//
// Thread-safe. The store changes the counts while it holds its own lock,
// right after the write that made the change durable; waiters hold only this
// object's lock.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>

#include "absl/base/thread_annotations.h"

namespace relay::store {

class ReadyCounts {
 public:
  using Clock = std::chrono::steady_clock;

  // Replaces every count: `by_version` maps an oldest token version to the
  // READY groups that have it (what the store's index holds when it opens).
  void reset(std::map<int64_t, int64_t> by_version);
  // Adds delta[v] groups of oldest version v (negative: removes them). Wakes
  // the waiters when groups were added.
  void change(const std::map<int64_t, int64_t>& delta);
  void add(int64_t min_version) { change({{min_version, 1}}); }

  // READY groups whose oldest token version is at least `min_version`
  // (every one when min_version < 0).
  int64_t count(int64_t min_version) const;

  // Blocks until count(min_version) >= want, `deadline` passes, or `stop`
  // returns true; returns count(min_version) then. `stop` (may be null) is
  // asked on entry and on every wake-up, under this object's lock: it must be
  // quick and must not call the store. Whoever sets what it reads calls
  // wake() afterwards, so the wait sees it at once.
  int64_t wait(int64_t want, int64_t min_version, Clock::time_point deadline,
               const std::function<bool()>& stop = nullptr) const;
  // Makes every wait() in progress ask its `stop` again.
  void wake() const;

 private:
  int64_t count_locked(int64_t min_version) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  std::map<int64_t, int64_t> by_version_ ABSL_GUARDED_BY(mu_);  // no zero counts
};

}  // namespace relay::store
