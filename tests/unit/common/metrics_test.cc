#include "relay/common/metrics.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <tuple>
#include <vector>

#include "relay/common/file_io.h"
#include "relay/common/tensorboard.h"

namespace relay {
namespace {

std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "/relay_metrics_" + std::to_string(::getpid()) + "_" + name;
}

// Records what it was given, for the fan-out's order.
class RecordingSink : public MetricsSink {
 public:
  RecordingSink(std::vector<std::string>* log, std::string name) : log_(log), name_(name) {}
  void record(const std::string& phase, int64_t step, const MetricValues& values) override {
    log_->push_back(name_ + ":" + phase + ":" + std::to_string(step) + ":" +
                    std::to_string(values.size()));
  }

 private:
  std::vector<std::string>* log_;
  std::string name_;
};

TEST(MetricsTest, JsonlLineHasPhaseStepAndSortedValues) {
  EXPECT_EQ(metrics_jsonl_line("rl", 3, {{"reward/mean", 0.5}, {"loss", -1.0}}),
            R"({"loss":-1.0,"phase":"rl","reward/mean":0.5,"step":3})");
  EXPECT_EQ(metrics_jsonl_line("eval", 0, {}), R"({"phase":"eval","step":0})");
}

TEST(MetricsTest, ScalarNamesPrefixEveryPhaseButRl) {
  const MetricValues v = {{"accuracy", 0.25}};
  EXPECT_EQ(scalar_names("rl", v), v);
  EXPECT_EQ(scalar_names("eval", v), (MetricValues{{"eval/accuracy", 0.25}}));
  EXPECT_EQ(scalar_names("sft", {{"sft_loss", 2.0}}), (MetricValues{{"sft/sft_loss", 2.0}}));
}

TEST(MetricsTest, JsonlSinkAppendsOrReplacesAndFlushesEachLine) {
  const std::string path = temp_path("metrics.jsonl");
  ASSERT_TRUE(write_file_atomic(path, "{\"phase\":\"sft\",\"step\":1}\n").ok());
  {
    auto sink = JsonlMetricsSink::open(path, JsonlMetricsSink::Mode::kAppend);
    ASSERT_TRUE(sink.ok()) << sink.status();
    (*sink)->record("rl", 1, {{"reward/mean", 0.5}});
    // Flushed at once: a reader sees the line while the sink is open.
    StatusOr<std::string> text = read_file(path);
    ASSERT_TRUE(text.ok());
    EXPECT_EQ(*text,
              "{\"phase\":\"sft\",\"step\":1}\n"
              "{\"phase\":\"rl\",\"reward/mean\":0.5,\"step\":1}\n");
  }
  {
    auto sink = JsonlMetricsSink::open(path, JsonlMetricsSink::Mode::kReplace);
    ASSERT_TRUE(sink.ok()) << sink.status();
    (*sink)->record("eval", 2, {{"accuracy", 1.0}});
  }
  StatusOr<std::string> text = read_file(path);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, "{\"accuracy\":1.0,\"phase\":\"eval\",\"step\":2}\n");
  std::filesystem::remove(path);
}

TEST(MetricsTest, JsonlSinkOpenNamesAPathItCannotWrite) {
  auto sink =
      JsonlMetricsSink::open("/nonexistent-dir/metrics.jsonl", JsonlMetricsSink::Mode::kAppend);
  ASSERT_FALSE(sink.ok());
  EXPECT_NE(sink.status().message().find("/nonexistent-dir/metrics.jsonl"), std::string::npos);
}

TEST(MetricsTest, TensorBoardSinkTagsEvalAndSftByPhase) {
  const std::string dir = temp_path("tb");
  std::filesystem::remove_all(dir);
  auto sink = TensorBoardMetricsSink::open(dir);
  ASSERT_TRUE(sink.ok()) << sink.status();
  (*sink)->record("rl", 1, {{"reward/mean", 0.5}});
  (*sink)->record("eval", 1, {{"accuracy", 0.75}});
  (*sink)->record("sft", 2, {{"sft_loss", 1.5}});
  std::string file;
  for (const auto& e : std::filesystem::directory_iterator(dir)) file = e.path().string();
  auto records = read_tfrecords(file);
  ASSERT_TRUE(records.ok()) << records.status();
  ASSERT_EQ(records->size(), 4u);  // the file-version event, then one per record
  EXPECT_NE((*records)[1].find("reward/mean"), std::string::npos);
  EXPECT_NE((*records)[2].find("eval/accuracy"), std::string::npos);
  EXPECT_NE((*records)[3].find("sft/sft_loss"), std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST(MetricsTest, FanOutGivesEveryRecordToEachSinkInOrder) {
  std::vector<std::string> log;
  FanOutMetricsSink fan;
  fan.add(std::make_unique<RecordingSink>(&log, "a"));
  fan.add(std::make_unique<RecordingSink>(&log, "b"));
  fan.record("rl", 4, {{"x", 1}, {"y", 2}});
  fan.record("eval", 4, {{"accuracy", 1}});
  EXPECT_EQ(log, (std::vector<std::string>{"a:rl:4:2", "b:rl:4:2", "a:eval:4:1", "b:eval:4:1"}));
  FanOutMetricsSink empty;
  empty.record("rl", 1, {{"x", 1}});  // no sinks: nothing to do, no crash
}

}  // namespace
}  // namespace relay
