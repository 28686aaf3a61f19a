#pragma once

// The trainer's HTTP endpoint (services.http_listen, loopback by default):
//   GET /metrics  every metric's latest value in Prometheus' text format, as
//                 gauges named relay_<metric> ("reward/mean" ->
//                 relay_reward_mean), for a Prometheus server to scrape;
//   GET /healthz  "ok";
// and, when given a run's files, the live dashboard (common/dashboard.h):
//   GET /         the dashboard page, which polls
//   GET /api/run  the run's metrics, latest samples and config as JSON, read
//                 from the files on each request (?metrics_from=N: only the
//                 records after the first N).
// The trainer loop calls update() after each step; requests are served on
// the endpoint's own threads.

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "relay/common/dashboard.h"
#include "relay/common/status.h"

namespace httplib {
class Server;
}

namespace relay::comm {

// Prometheus text exposition of `metrics`: one "# TYPE <name> gauge" and one
// "<name> <value>" line per metric, names sanitized to [a-zA-Z0-9_] and
// prefixed relay_; NaN and infinities as Prometheus spells them.
std::string prometheus_text(const std::map<std::string, double>& metrics);

class MetricsEndpoint {
 public:
  // Listens on host:port (port 0 = any free port); Unavailable naming the
  // address when it cannot. With `dashboard`, also serves / and /api/run
  // from those files.
  static StatusOr<std::unique_ptr<MetricsEndpoint>> start(
      const std::string& host, int port, std::optional<RunFiles> dashboard = std::nullopt);
  ~MetricsEndpoint();

  int port() const { return port_; }
  // Merges `metrics` into what /metrics reports (latest value per name).
  void update(const std::map<std::string, double>& metrics);

 private:
  MetricsEndpoint(std::unique_ptr<httplib::Server> server, int port,
                  std::optional<RunFiles> dashboard);
  std::unique_ptr<httplib::Server> server_;
  int port_ = 0;
  std::mutex mu_;
  std::map<std::string, double> latest_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace relay::comm
