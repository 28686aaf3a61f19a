#pragma once

// Whether the trainer still has rollout workers. The trainer forgets a
// worker silent for services.worker_timeout_s (TrainerService); when every
// worker that registered has been silent that long and none has registered
// for another timeout, nobody is left to make the groups the trainer waits
// for, and waiting out services.group_wait_s (10 minutes) helps nobody.

#include <cstdint>

#include "relay/common/status.h"

namespace relay::comm {

// What the trainer's service has seen of its workers.
struct WorkerPresence {
  int64_t registrations = 0;  // RegisterWorker calls answered, ever
  // The latest call of any kind from a registered worker (registering
  // included), Unix ms; 0 = none.
  int64_t last_heard_unix_ms = 0;
};

// OK while a worker may still deliver. Unavailable, "every rollout worker is
// gone (last seen N s ago)...", once some worker registered and none has been
// heard from for 2 x worker_timeout_ms: the first timeout declares the last
// of them dead, the second leaves a restarted worker time to register again.
// Always OK before any worker registered (a trainer may start long before
// its workers; services.group_wait_s bounds that wait) and when
// worker_timeout_ms <= 0 (no liveness timeout configured).
Status check_worker_presence(const WorkerPresence& presence, int64_t now_unix_ms,
                             int64_t worker_timeout_ms);

}  // namespace relay::comm
