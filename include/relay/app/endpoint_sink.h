#pragma once

// The trainer's /metrics endpoint as a MetricsSink: each record's values,
// named as TensorBoard names them (common/metrics.h scalar_names), become
// the endpoint's latest gauges.

#include "relay/comm/host/metrics_endpoint.h"
#include "relay/common/metrics.h"

namespace relay::app {

class EndpointMetricsSink : public MetricsSink {
 public:
  // `endpoint` must outlive the sink.
  explicit EndpointMetricsSink(comm::MetricsEndpoint* endpoint) : endpoint_(endpoint) {}
  void record(const std::string& phase, int64_t step, const MetricValues& values) override {
    (void)step;  // a gauge has no step: the latest value stands
    endpoint_->update(scalar_names(phase, values));
  }

 private:
  comm::MetricsEndpoint* endpoint_;
};

}  // namespace relay::app
