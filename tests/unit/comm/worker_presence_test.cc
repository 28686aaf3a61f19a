#include "relay/comm/service/worker_presence.h"

#include <gtest/gtest.h>

#include <string>

namespace relay::comm {
namespace {

TEST(WorkerPresenceTest, GoneOnlyAfterTwoTimeoutsOfSilenceOnceSomeoneRegistered) {
  constexpr int64_t kNow = 1'000'000;
  struct Case {
    int64_t registrations;
    int64_t last_heard_ms_ago;
    int64_t timeout_ms;
    bool gone;
  };
  const Case cases[] = {
      {0, kNow, 30000, false},  // nobody ever registered: group_wait_s decides
      {1, 0, 30000, false},
      {1, 30001, 30000, false},  // declared dead, but a restart may
                                 // register
      {1, 60000, 30000, false},
      {1, 60001, 30000, true},
      {3, 600000, 30000, true},
      {3, 600000, 0, false},  // worker_timeout_s 0: no liveness, lease deadlines only
      {1, 701, 350, true},
  };
  for (const Case& c : cases) {
    WorkerPresence p;
    p.registrations = c.registrations;
    p.last_heard_unix_ms = c.registrations > 0 ? kNow - c.last_heard_ms_ago : 0;
    const Status st = check_worker_presence(p, kNow, c.timeout_ms);
    EXPECT_EQ(!st.ok(), c.gone) << c.registrations << " registered, silent " << c.last_heard_ms_ago
                                << " ms, timeout " << c.timeout_ms;
  }
}

TEST(WorkerPresenceTest, TheErrorSaysEveryWorkerIsGoneAndWhen) {
  WorkerPresence p;
  p.registrations = 2;
  p.last_heard_unix_ms = 1000;
  const Status st = check_worker_presence(p, 1000 + 61234, 30000);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable);
  const std::string m(st.message());
  EXPECT_NE(m.find("every rollout worker is gone (last seen 61.2 s ago)"), std::string::npos) << m;
  EXPECT_NE(m.find("(2 registrations)"), std::string::npos) << m;
  EXPECT_NE(m.find("twice services.worker_timeout_s (30 s)"), std::string::npos) << m;
}

}  // namespace
}  // namespace relay::comm
