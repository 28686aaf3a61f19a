#include "relay/common/metrics.h"

#include <spdlog/spdlog.h>

#include <nlohmann/json.hpp>
#include <utility>

#include "absl/strings/str_cat.h"
#include "relay/common/tensorboard.h"

namespace relay {

std::string metrics_jsonl_line(const std::string& phase, int64_t step, const MetricValues& values) {
  nlohmann::json j = {{"phase", phase}, {"step", step}};
  for (const auto& [k, v] : values) j[k] = v;
  return j.dump();
}

MetricValues scalar_names(const std::string& phase, const MetricValues& values) {
  if (phase == "rl") return values;
  MetricValues named;
  for (const auto& [k, v] : values) named[absl::StrCat(phase, "/", k)] = v;
  return named;
}

StatusOr<std::unique_ptr<JsonlMetricsSink>> JsonlMetricsSink::open(const std::string& path,
                                                                   Mode mode) {
  std::ofstream out(path, mode == Mode::kAppend ? std::ios::app : std::ios::trunc);
  if (!out) return InternalError(absl::StrCat("cannot open ", path, " for writing"));
  return std::unique_ptr<JsonlMetricsSink>(new JsonlMetricsSink(path, std::move(out)));
}

JsonlMetricsSink::JsonlMetricsSink(std::string path, std::ofstream out)
    : path_(std::move(path)), out_(std::move(out)) {}

void JsonlMetricsSink::record(const std::string& phase, int64_t step, const MetricValues& values) {
  out_ << metrics_jsonl_line(phase, step, values) << "\n";
  out_.flush();
  if (!out_) spdlog::warn("cannot append to {}", path_);
}

StatusOr<std::unique_ptr<TensorBoardMetricsSink>> TensorBoardMetricsSink::open(
    const std::string& dir) {
  RELAY_ASSIGN_OR_RETURN(std::unique_ptr<TensorBoardWriter> writer, TensorBoardWriter::open(dir));
  return std::unique_ptr<TensorBoardMetricsSink>(new TensorBoardMetricsSink(std::move(writer)));
}

TensorBoardMetricsSink::TensorBoardMetricsSink(std::unique_ptr<TensorBoardWriter> writer)
    : writer_(std::move(writer)) {}

TensorBoardMetricsSink::~TensorBoardMetricsSink() = default;

void TensorBoardMetricsSink::record(const std::string& phase, int64_t step,
                                    const MetricValues& values) {
  if (Status s = writer_->add_scalars(step, scalar_names(phase, values)); !s.ok()) {
    spdlog::warn("tensorboard: {}", std::string(s.message()));
  }
}

void FanOutMetricsSink::record(const std::string& phase, int64_t step, const MetricValues& values) {
  for (const std::unique_ptr<MetricsSink>& sink : sinks_) sink->record(phase, step, values);
}

}  // namespace relay
