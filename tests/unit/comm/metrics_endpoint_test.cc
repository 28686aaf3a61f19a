#include "relay/comm/metrics_endpoint.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <cmath>

namespace relay::comm {
namespace {

TEST(MetricsEndpointTest, PrometheusTextNamesAndValues) {
  EXPECT_EQ(prometheus_text({{"reward/mean", 0.5}, {"mismatch/k3", NAN}, {"lr", INFINITY}}),
            "# TYPE relay_lr gauge\n"
            "relay_lr +Inf\n"
            "# TYPE relay_mismatch_k3 gauge\n"
            "relay_mismatch_k3 NaN\n"
            "# TYPE relay_reward_mean gauge\n"
            "relay_reward_mean 0.5\n");
  // Two keys that sanitize to one name give one series, not an invalid scrape.
  EXPECT_EQ(prometheus_text({{"a/b", 1}, {"a_b", 2}}), "# TYPE relay_a_b gauge\nrelay_a_b 1\n");
}

TEST(MetricsEndpointTest, ServesTheLatestValues) {
  auto endpoint = MetricsEndpoint::start("127.0.0.1", 0);
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  ASSERT_GT((*endpoint)->port(), 0);
  (*endpoint)->update({{"reward/mean", 0.25}, {"version", 3}});
  (*endpoint)->update({{"reward/mean", 0.75}});
  httplib::Client client("127.0.0.1", (*endpoint)->port());
  auto res = client.Get("/metrics");
  ASSERT_TRUE(res) << "no response";
  EXPECT_EQ(res->status, 200);
  EXPECT_NE(res->body.find("relay_reward_mean 0.75\n"), std::string::npos) << res->body;
  EXPECT_NE(res->body.find("relay_version 3\n"), std::string::npos) << res->body;
  auto health = client.Get("/healthz");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->body, "ok\n");
  EXPECT_EQ(client.Get("/nothing")->status, 404);
}

TEST(MetricsEndpointTest, ATakenPortIsAnErrorNamingTheAddress) {
  auto first = MetricsEndpoint::start("127.0.0.1", 0);
  ASSERT_TRUE(first.ok());
  auto second = MetricsEndpoint::start("127.0.0.1", (*first)->port());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(std::string(second.status().message()).find("127.0.0.1:"), std::string::npos);
}

}  // namespace
}  // namespace relay::comm
