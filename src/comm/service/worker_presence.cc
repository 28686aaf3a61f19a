#include "relay/comm/service/worker_presence.h"

#include "absl/strings/str_format.h"
#include "relay/common/number_format.h"

namespace relay::comm {

Status check_worker_presence(const WorkerPresence& presence, int64_t now_unix_ms,
                             int64_t worker_timeout_ms) {
  if (presence.registrations == 0 || worker_timeout_ms <= 0) return OkStatus();
  const int64_t silent_ms = now_unix_ms - presence.last_heard_unix_ms;
  if (silent_ms <= 2 * worker_timeout_ms) return OkStatus();
  return UnavailableError(absl::StrFormat(
      "every rollout worker is gone (last seen %s s ago): none of the workers that registered "
      "(%d registration%s) has called for over twice services.worker_timeout_s (%g s); look at "
      "why they died (a worker busy longer than that timeout in one engine step also counts as "
      "dead: raise services.worker_timeout_s then)",
      format_significant(silent_ms / 1000.0), presence.registrations,
      presence.registrations == 1 ? "" : "s", worker_timeout_ms / 1000.0));
}

}  // namespace relay::comm
