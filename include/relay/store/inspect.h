#pragma once

// What `relay store inspect` shows: counts by state and by version, how old
// groups were when trained and how long they waited, reward means by
// version, the quarantined (rejected) groups with their reasons, and one
// trajectory with its tokens, log-probs and versions side by side. Built from a store opened
// read-only, so it works next to a trainer.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "relay/common/status.h"
#include "relay/store/rollout_store.h"

namespace relay::store {

struct StoreReport {
  std::string path;
  StoreStats stats;
  // Latest trainer version any record mentions (arrival or consumption).
  int64_t latest_version = -1;
  // Consumed groups: consumed_version - min_version (the oldest token's age
  // in versions when it was trained on), and consumed_version -
  // arrival_version (versions it waited in the store). Keys are versions.
  std::map<int64_t, int64_t> age_when_trained;
  std::map<int64_t, int64_t> wait_in_store;
  // Ready groups: latest_version - min_version.
  std::map<int64_t, int64_t> ready_age;
  // Quarantined groups (REJECTED), oldest first: what the trainer refused
  // to train on and why.
  struct Rejection {
    uint64_t seq = 0;
    std::string group_id;
    int64_t version = 0;  // trainer version that rejected it
    std::string reason;
  };
  std::vector<Rejection> rejected;
  // The most recent group, for the side-by-side listing.
  std::optional<StoredGroup> sample;
};

StatusOr<StoreReport> build_report(const RolloutStore& store);

// Plain text for a terminal, and JSON (`--json`) with the same content.
std::string report_text(const StoreReport& report);
std::string report_json(const StoreReport& report);

}  // namespace relay::store
