#include "relay/comm/host/metrics_endpoint.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "relay/common/file_io.h"

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

TEST(MetricsEndpointTest, ServesTheDashboardOfARunDirectory) {
  const std::string dir = ::testing::TempDir() + "/endpoint_run_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  ASSERT_TRUE(write_file_atomic(dir + "/metrics.jsonl",
                                "{\"phase\":\"rl\",\"step\":1,\"reward/mean\":0.5}\n"
                                "{\"phase\":\"rl\",\"step\":2,\"reward/mean\":0.75}\n")
                  .ok());
  auto endpoint = MetricsEndpoint::start("127.0.0.1", 0, run_files(dir));
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  httplib::Client client("127.0.0.1", (*endpoint)->port());

  auto page = client.Get("/");
  ASSERT_TRUE(page);
  EXPECT_EQ(page->status, 200);
  EXPECT_EQ(page->get_header_value("Content-Type"), "text/html; charset=utf-8");
  EXPECT_NE(page->body.find("data-mode=\"live\""), std::string::npos);

  auto api = client.Get("/api/run?metrics_from=1");
  ASSERT_TRUE(api);
  EXPECT_EQ(api->status, 200);
  EXPECT_EQ(api->get_header_value("Content-Type"), "application/json");
  nlohmann::json j = nlohmann::json::parse(api->body);
  ASSERT_EQ(j["metrics"].size(), 1u);
  EXPECT_EQ(j["metrics"][0]["reward/mean"], 0.75);
  EXPECT_EQ(j["metrics_next"], 2);

  EXPECT_EQ(client.Get("/api/run?metrics_from=x")->status, 400);
  // Files are read on every request: a damaged line shows up as an error
  // naming it.
  ASSERT_TRUE(write_file_atomic(dir + "/metrics.jsonl", "{\"phase\":\"rl\"}\n").ok());
  api = client.Get("/api/run");
  ASSERT_TRUE(api);
  EXPECT_EQ(api->status, 500);
  EXPECT_EQ(api->body, dir + "/metrics.jsonl:1: \"step\": missing or not an integer\n");
  std::filesystem::remove_all(dir);
}

TEST(MetricsEndpointTest, NoDashboardUnlessAsked) {
  auto endpoint = MetricsEndpoint::start("127.0.0.1", 0);
  ASSERT_TRUE(endpoint.ok());
  httplib::Client client("127.0.0.1", (*endpoint)->port());
  EXPECT_EQ(client.Get("/")->status, 404);
  EXPECT_EQ(client.Get("/api/run")->status, 404);
}

}  // namespace
}  // namespace relay::comm
