#include "relay/common/dashboard.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "relay/common/file_io.h"

namespace relay {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// A run directory of its own per test (ctest runs tests in parallel).
class DashboardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/dashboard_" + std::to_string(::getpid()) + "_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  void write(const std::string& name, const std::string& text) {
    ASSERT_TRUE(write_file_atomic(dir_ + "/" + name, text).ok());
  }
  json data(const RunDataOptions& options = {}) {
    StatusOr<std::string> text = run_data_json(run_files(dir_), options);
    EXPECT_TRUE(text.ok()) << text.status();
    return text.ok() ? json::parse(*text) : json();
  }
  std::string error(const RunDataOptions& options = {}) {
    StatusOr<std::string> text = run_data_json(run_files(dir_), options);
    EXPECT_FALSE(text.ok());
    return std::string(text.status().message());
  }
  std::string dir_;
};

const char kThreeSteps[] =
    "{\"phase\":\"sft\",\"step\":1,\"sft_loss\":2.5}\n"
    "{\"phase\":\"rl\",\"step\":1,\"reward/mean\":0.25,\"mismatch/k3\":null}\n"
    "\n"
    "{\"phase\":\"eval\",\"step\":1,\"accuracy\":0.5}\n";

TEST_F(DashboardTest, ReadsRecordsConfigAndNamesTheRun) {
  write("metrics.jsonl", kThreeSteps);
  write("config.yaml", "run:\n  seed: 3\n");
  json j = data();
  EXPECT_EQ(j["run"], fs::path(dir_).filename().string());
  ASSERT_EQ(j["metrics"].size(), 3u);  // the blank line is not a record
  EXPECT_EQ(j["metrics"][1]["reward/mean"], 0.25);
  EXPECT_TRUE(j["metrics"][1]["mismatch/k3"].is_null());  // NaN as the trainer writes it
  EXPECT_EQ(j["metrics"][2]["phase"], "eval");
  EXPECT_EQ(j["metrics_from"], 0);
  EXPECT_EQ(j["metrics_next"], 3);
  EXPECT_EQ(j["config"], "run:\n  seed: 3\n");
  EXPECT_TRUE(j["samples"].is_null());  // no samples.jsonl is not the same as none yet
  EXPECT_EQ(j["files"]["metrics"], dir_ + "/metrics.jsonl");
}

TEST_F(DashboardTest, APartiallyWrittenLastLineIsLeftOut) {
  write("metrics.jsonl", std::string(kThreeSteps) + "{\"phase\":\"rl\",\"step\":2,\"rew");
  json j = data();
  EXPECT_EQ(j["metrics"].size(), 3u);
  EXPECT_EQ(j["metrics_next"], 3);
  // A complete last line that only lacks its newline is a record.
  write("metrics.jsonl", std::string(kThreeSteps) + "{\"phase\":\"rl\",\"step\":2}");
  EXPECT_EQ(data()["metrics"].size(), 4u);
}

TEST_F(DashboardTest, ABadLineIsAnErrorNamingFileAndLine) {
  const std::string path = dir_ + "/metrics.jsonl";
  // Line 2 is broken but not the last line: that is damage, not a write in progress.
  write("metrics.jsonl",
        "{\"phase\":\"rl\",\"step\":1}\n{\"phase\":\"rl\",\"st\n{\"phase\":\"rl\"}\n");
  std::string e = error();
  EXPECT_EQ(e.rfind(path + ":2: not JSON: parse error", 0), 0u) << e;

  const struct {
    std::string line;
    std::string message;
  } cases[] = {
      {"[1, 2]", ":1: not a JSON object"},
      {"{\"phase\":\"rl\"}", ":1: \"step\": missing or not an integer"},
      {"{\"phase\":\"rl\",\"step\":1.5}", ":1: \"step\": missing or not an integer"},
      {"{\"step\":1}", ":1: \"phase\": missing or not a string"},
      {"{\"phase\":\"rl\",\"step\":1,\"reward/mean\":\"high\"}",
       ":1: \"reward/mean\": not a number or null"},
  };
  for (const auto& c : cases) {
    write("metrics.jsonl", c.line + "\n");
    EXPECT_EQ(error(), path + c.message) << c.line;
  }
}

TEST_F(DashboardTest, AMissingMetricsFileIsNotFoundNamingIt) {
  StatusOr<std::string> text = run_data_json(run_files(dir_));
  EXPECT_EQ(text.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(text.status().message().find(dir_ + "/metrics.jsonl"), std::string::npos);
}

TEST_F(DashboardTest, MetricsFromSkipsRecordsThePageHas) {
  write("metrics.jsonl", kThreeSteps);
  RunDataOptions o;
  o.metrics_from = 2;
  json j = data(o);
  ASSERT_EQ(j["metrics"].size(), 1u);
  EXPECT_EQ(j["metrics"][0]["phase"], "eval");
  EXPECT_EQ(j["metrics_from"], 2);
  EXPECT_EQ(j["metrics_next"], 3);
  o.metrics_from = 3;
  EXPECT_EQ(data(o)["metrics"].size(), 0u);
  // More than the file holds: it was replaced, so everything comes again.
  o.metrics_from = 7;
  j = data(o);
  EXPECT_EQ(j["metrics_from"], 0);
  EXPECT_EQ(j["metrics"].size(), 3u);
}

TEST_F(DashboardTest, SamplesAreTheLastStepsAndChecked) {
  write("metrics.jsonl", kThreeSteps);
  std::string samples;
  for (int step = 1; step <= 6; ++step) {
    SampleRecord r;
    r.prompt = "<1+2>";
    r.pieces = {"3", "#"};
    r.logprobs = {-0.5f, -0.01f};
    r.token_ids = {6, 14};
    r.versions = {step, step};
    r.reward = 1.0;
    samples += samples_jsonl_line(step, step + 1, {r}) + "\n";
  }
  write("samples.jsonl", samples + "{\"step\":7,\"sam");  // step 7 is being written
  RunDataOptions o;
  o.sample_steps = 2;
  json j = data(o);
  ASSERT_EQ(j["samples"].size(), 2u);
  EXPECT_EQ(j["samples"][0]["step"], 5);
  EXPECT_EQ(j["samples"][1]["step"], 6);
  EXPECT_EQ(j["samples"][1]["samples"][0]["pieces"], json({"3", "#"}));

  write("samples.jsonl",
        samples + "{\"step\":7,\"samples\":[{\"pieces\":[\"a\",\"b\"],\"logprobs\":[-1]}]}\n");
  EXPECT_EQ(error(o), dir_ + "/samples.jsonl:7: samples[0].logprobs: size 1 != pieces size 2");
  write("samples.jsonl", "{\"step\":1}\n");
  EXPECT_EQ(error(o), dir_ + "/samples.jsonl:1: \"samples\": missing or not an array");
  write("samples.jsonl", "");
  EXPECT_EQ(data(o)["samples"], json::array());  // the file, but no RL step yet
}

TEST(SamplesJsonlLineTest, NanIsNullAndBrokenUtf8IsReplaced) {
  SampleRecord r;
  r.group_id = "g#3";
  r.prompt = "<2*3>";
  // "\xE2\x82" is the first two bytes of a three-byte character: one BPE
  // token can hold part of a character.
  r.pieces = {"6", "\xE2\x82"};
  r.token_ids = {9, 300};
  r.logprobs = {-0.25f, NAN};
  r.versions = {4, 5};
  r.finish_reason = "stop";
  const std::string line = samples_jsonl_line(12, 6, {r});
  EXPECT_EQ(line.find('\n'), std::string::npos);
  json j = json::parse(line);
  EXPECT_EQ(j["step"], 12);
  EXPECT_EQ(j["version"], 6);
  const json& s = j["samples"][0];
  EXPECT_EQ(s["group_id"], "g#3");
  EXPECT_EQ(s["prompt"], "<2*3>");
  EXPECT_EQ(s["pieces"][0], "6");
  EXPECT_EQ(s["pieces"][1], "\xEF\xBF\xBD");  // U+FFFD
  EXPECT_EQ(s["token_ids"], json({9, 300}));
  EXPECT_EQ(s["logprobs"][0], -0.25);
  EXPECT_TRUE(s["logprobs"][1].is_null());
  EXPECT_TRUE(s["reward"].is_null());  // unscored
  EXPECT_EQ(s["versions"], json({4, 5}));
  EXPECT_EQ(s["finish_reason"], "stop");
  EXPECT_FALSE(s.contains("env_mask"));  // single turn: no mask written
  r.env_mask = {0, 1};
  EXPECT_EQ(json::parse(samples_jsonl_line(12, 6, {r}))["samples"][0]["env_mask"], json({0, 1}));
}

int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// The text between the report's data element's tags.
std::string embedded(const std::string& page) {
  const std::string open = "<script type=\"application/json\" id=\"run-data\">";
  const size_t begin = page.find(open);
  if (begin == std::string::npos) return "";
  const size_t end = page.find("</script>", begin);
  return page.substr(begin + open.size(), end - begin - open.size());
}

TEST(DashboardHtmlTest, AResponseCannotCloseTheScriptElement) {
  const std::string evil = "</script><script>alert(1)</script><!--";
  SampleRecord r;
  r.pieces = {evil, "@MODE@"};
  r.logprobs = {-1, -2};
  const std::string data = absl::StrCat("{\"samples\":[", samples_jsonl_line(1, 1, {r}), "]}");
  const std::string page = dashboard_report_html("run<1>", data);
  const std::string live = dashboard_live_html("run<1>");
  // The report holds exactly the live page's </script> tags plus its data
  // element's own: none came from the response.
  EXPECT_EQ(count(page, "</script>"), count(live, "</script>") + 1);
  EXPECT_EQ(count(page, "<!--"), 0);
  const std::string inside = embedded(page);
  EXPECT_EQ(inside.find('<'), std::string::npos);
  // What the page's JSON.parse reads back is the response, byte for byte,
  // and a placeholder inside it was not filled in.
  json j = json::parse(inside);
  EXPECT_EQ(j["samples"][0]["samples"][0]["pieces"][0], evil);
  EXPECT_EQ(j["samples"][0]["samples"][0]["pieces"][1], "@MODE@");
  EXPECT_NE(page.find("<title>relay: run&lt;1&gt;</title>"), std::string::npos);
  EXPECT_NE(page.find("data-mode=\"report\""), std::string::npos);
  EXPECT_EQ(page.find("@TITLE@"), std::string::npos);
  EXPECT_EQ(page.find("@RUN_DATA@"), std::string::npos);
}

TEST(DashboardHtmlTest, TheLivePageEmbedsNothingAndFetchesOnlyItsOwnApi) {
  const std::string page = dashboard_live_html("arith");
  EXPECT_NE(page.find("data-mode=\"live\""), std::string::npos);
  EXPECT_EQ(embedded(page), "");
  EXPECT_EQ(count(page, "fetch("), 1);
  EXPECT_NE(page.find("fetch('api/run"), std::string::npos);
  // Self-contained: no resource from anywhere else. The one URL is SVG's
  // namespace name, which is never fetched.
  std::string rest = page;
  rest.erase(rest.find("http://www.w3.org/2000/svg"), 26);
  for (const char* external : {"http", "src=", "url(", "@import", "<link rel=\"stylesheet\""}) {
    EXPECT_EQ(rest.find(external), std::string::npos) << external;
  }
}

TEST(DashboardHtmlTest, EscapesText) {
  EXPECT_EQ(html_escape("a<b & \"c\" 'd'>"), "a&lt;b &amp; &quot;c&quot; &#39;d&#39;&gt;");
  EXPECT_EQ(script_safe_json("{\"a\":\"</script>\"}"), "{\"a\":\"\\u003c/script>\"}");
}

TEST(RunFilesTest, NamesTheRunAfterItsDirectory) {
  EXPECT_EQ(run_files("runs/arith").name, "arith");
  EXPECT_EQ(run_files("runs/arith/").name, "arith");
  EXPECT_EQ(run_files("runs/arith/").metrics, "runs/arith/metrics.jsonl");
  EXPECT_EQ(run_files("runs/arith").samples, "runs/arith/samples.jsonl");
  EXPECT_EQ(run_files("runs/arith").config, "runs/arith/config.yaml");
}

}  // namespace
}  // namespace relay
