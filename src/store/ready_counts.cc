#include "relay/store/ready_counts.h"

namespace relay::store {

void ReadyCounts::reset(std::map<int64_t, int64_t> by_version) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    by_version_ = std::move(by_version);
  }
  cv_.notify_all();
}

void ReadyCounts::change(const std::map<int64_t, int64_t>& delta) {
  bool added = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [version, n] : delta) {
      if (n == 0) continue;
      added = added || n > 0;
      auto it = by_version_.emplace(version, 0).first;
      it->second += n;
      if (it->second == 0) by_version_.erase(it);
    }
  }
  if (added) cv_.notify_all();
}

int64_t ReadyCounts::count_locked(int64_t min_version) const {
  int64_t n = 0;
  for (auto it = min_version < 0 ? by_version_.begin() : by_version_.lower_bound(min_version);
       it != by_version_.end(); ++it) {
    n += it->second;
  }
  return n;
}

int64_t ReadyCounts::count(int64_t min_version) const {
  std::lock_guard<std::mutex> lock(mu_);
  return count_locked(min_version);
}

int64_t ReadyCounts::wait(int64_t want, int64_t min_version, Clock::time_point deadline,
                          const std::function<bool()>& stop) const {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_until(lock, deadline, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return count_locked(min_version) >= want || (stop && stop());
  });
  return count_locked(min_version);
}

void ReadyCounts::wake() const {
  // Taking the lock orders this after any waiter's look at `stop`: one that
  // looked before the flag was set is asleep by now and gets the notify.
  { std::lock_guard<std::mutex> lock(mu_); }
  cv_.notify_all();
}

}  // namespace relay::store
