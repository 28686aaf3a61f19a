#include "relay/store/inspect.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>

namespace relay::store {
namespace {

rollout::TrajectoryGroup make_group(const std::string& id, int64_t version, double reward) {
  rollout::TrajectoryGroup g;
  g.group_id = id;
  rollout::Trajectory t;
  t.prompt_tokens = {1, 2};
  t.response_tokens = {5, 6};
  t.behavior_logprobs = {-0.5f, std::numeric_limits<float>::quiet_NaN()};
  t.token_versions = {version, version};
  t.proximal_logprobs = {-0.75f, std::numeric_limits<float>::quiet_NaN()};
  t.proximal_versions = {version, -1};
  t.offpolicy_mask = {0, 1};
  t.finish_reason = rollout::FinishReason::kStop;
  t.version_digests = {{version, 7}};
  t.reward = reward;
  g.trajectories = {t};
  return g;
}

TEST(StoreInspectTest, ReportCountsStalenessAndShowsTheLatestGroup) {
  const std::string dir =
      ::testing::TempDir() + "/relay_store_inspect_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  StoreOptions o;
  o.path = dir;
  {
    auto store = RolloutStore::open(o).value();
    ASSERT_TRUE(store->append(make_group("a", 0, 1.0), 0).ok());
    ASSERT_TRUE(store->append(make_group("b", 1, 0.0), 1).ok());
    ASSERT_TRUE(store->append(make_group("c", 2, 1.0), 3).ok());
    // a and b trained at version 3: oldest tokens 3 and 2 versions old; they
    // waited 3 and 2 versions.
    ASSERT_EQ(store->take_ready(2, -1, 3).value().size(), 2u);
    ASSERT_TRUE(store->append(make_group("d", 4, 1.0), 5).ok());
  }
  // Read-only, as next to a running trainer.
  o.read_only = true;
  auto store = RolloutStore::open(o).value();
  EXPECT_EQ(store->append(make_group("x", 0, 0), 0).status().code(),
            absl::StatusCode::kFailedPrecondition);
  StoreReport r = build_report(*store).value();
  EXPECT_EQ(r.latest_version, 5);
  EXPECT_EQ(r.age_when_trained, (std::map<int64_t, int64_t>{{2, 1}, {3, 1}}));
  EXPECT_EQ(r.wait_in_store, (std::map<int64_t, int64_t>{{2, 1}, {3, 1}}));
  // Ready: c (min version 2) and d (4) are 3 and 1 behind version 5.
  EXPECT_EQ(r.ready_age, (std::map<int64_t, int64_t>{{1, 1}, {3, 1}}));
  ASSERT_TRUE(r.sample.has_value());
  EXPECT_EQ(r.sample->group.group_id, "d");

  nlohmann::json j = nlohmann::json::parse(report_json(r));
  EXPECT_EQ(j["ready"], 2);
  EXPECT_EQ(j["consumed"], 2);
  EXPECT_EQ(j["by_min_version"]["1"]["reward_mean"], 0.0);
  EXPECT_EQ(j["by_min_version"]["0"]["consumed"], 1);
  EXPECT_EQ(j["staleness"]["age_when_trained"]["3"], 1);
  EXPECT_EQ(j["sample"]["token_versions"], nlohmann::json({4, 4}));
  EXPECT_TRUE(j["sample"]["behavior_logprobs"][1].is_null()) << "NaN shows as null";

  const std::string text = report_text(r);
  EXPECT_NE(text.find("groups: 2 ready, 2 consumed, 0 expired, 0 rejected"), std::string::npos)
      << text;
  EXPECT_NE(text.find("latest group: seq 4 'd'"), std::string::npos) << text;
  EXPECT_NE(text.find("nan"), std::string::npos) << "a missing log-prob is printed as nan";
}

TEST(StoreInspectTest, ReportListsQuarantinedGroupsWithTheirReasons) {
  const std::string dir =
      ::testing::TempDir() + "/relay_store_inspect_rejected_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  StoreOptions o;
  o.path = dir;
  {
    auto store = RolloutStore::open(o).value();
    ASSERT_TRUE(store->append(make_group("arith/3#7@e2", 0, 1e30), 0).ok());
    ASSERT_TRUE(store->append(make_group("fine", 0, 1.0), 0).ok());
    ASSERT_EQ(store->take_ready(2, -1, 4).value().size(), 2u);
    ASSERT_TRUE(store->reject(1, "reward 1e+30: |reward| above 1e+06", 4).ok());
  }
  o.read_only = true;
  auto store = RolloutStore::open(o).value();
  StoreReport r = build_report(*store).value();
  ASSERT_EQ(r.rejected.size(), 1u);
  EXPECT_EQ(r.rejected[0].group_id, "arith/3#7@e2");
  const std::string text = report_text(r);
  EXPECT_NE(text.find("1 consumed, 0 expired, 1 rejected"), std::string::npos) << text;
  EXPECT_NE(text.find("seq 1 'arith/3#7@e2' at version 4: reward 1e+30: |reward| above 1e+06"),
            std::string::npos)
      << text;
  nlohmann::json j = nlohmann::json::parse(report_json(r));
  EXPECT_EQ(j["rejected"], 1);
  ASSERT_EQ(j["rejected_groups"].size(), 1u);
  EXPECT_EQ(j["rejected_groups"][0]["seq"], 1);
  EXPECT_EQ(j["rejected_groups"][0]["version"], 4);
}

}  // namespace
}  // namespace relay::store
