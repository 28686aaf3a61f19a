#pragma once

// Where a run's metrics go. Every record is (phase, step, values): phase
// "rl" for an RL step, "eval" for an evaluation, "sft" for a warm-start
// step. A sink writes records in one format; the training loop talks to one
// MetricsSink and does not know how many files or endpoints stand behind it.

#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "relay/common/status.h"

namespace relay {

using MetricValues = std::map<std::string, double>;

class MetricsSink {
 public:
  virtual ~MetricsSink() = default;
  // Not thread-safe: one loop records. A sink that fails to write warns and
  // goes on (metrics are not worth stopping a run for).
  virtual void record(const std::string& phase, int64_t step, const MetricValues& values) = 0;
};

// One metrics.jsonl line, without the newline: {"phase": P, "step": S,
// <name>: <value>...} with the keys sorted (dashboards and tests read it).
std::string metrics_jsonl_line(const std::string& phase, int64_t step, const MetricValues& values);

// The scalar names a record takes outside metrics.jsonl (TensorBoard tags,
// /metrics gauges): RL metrics under their own names, the others as
// <phase>/<name> (eval/accuracy, sft/sft_loss).
MetricValues scalar_names(const std::string& phase, const MetricValues& values);

// metrics.jsonl: one line per record, flushed, so the file is complete up
// to the last record if the process dies.
class JsonlMetricsSink : public MetricsSink {
 public:
  enum class Mode { kAppend, kReplace };
  // Errors name the path.
  static StatusOr<std::unique_ptr<JsonlMetricsSink>> open(const std::string& path, Mode mode);
  void record(const std::string& phase, int64_t step, const MetricValues& values) override;

 private:
  JsonlMetricsSink(std::string path, std::ofstream out);
  std::string path_;
  std::ofstream out_;
};

class TensorBoardWriter;

// TensorBoard event files under a directory, tags from scalar_names().
class TensorBoardMetricsSink : public MetricsSink {
 public:
  static StatusOr<std::unique_ptr<TensorBoardMetricsSink>> open(const std::string& dir);
  ~TensorBoardMetricsSink() override;
  void record(const std::string& phase, int64_t step, const MetricValues& values) override;

 private:
  explicit TensorBoardMetricsSink(std::unique_ptr<TensorBoardWriter> writer);
  std::unique_ptr<TensorBoardWriter> writer_;
};

// Every record to each of its sinks, in the order they were added.
class FanOutMetricsSink : public MetricsSink {
 public:
  void add(std::unique_ptr<MetricsSink> sink) { sinks_.push_back(std::move(sink)); }
  void record(const std::string& phase, int64_t step, const MetricValues& values) override;

 private:
  std::vector<std::unique_ptr<MetricsSink>> sinks_;
};

// Drops every record (a loop run without metrics).
class NullMetricsSink : public MetricsSink {
 public:
  void record(const std::string&, int64_t, const MetricValues&) override {}
};

}  // namespace relay
