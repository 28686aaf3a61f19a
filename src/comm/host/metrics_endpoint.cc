#include "relay/comm/host/metrics_endpoint.h"

#include <httplib.h>
#include <sys/socket.h>

#include <chrono>
#include <cmath>
#include <cstdio>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace relay::comm {
namespace {

std::string metric_name(const std::string& key) {
  std::string out = "relay_";
  for (char c : key) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    out.push_back(ok ? c : '_');
  }
  return out;
}

std::string prometheus_value(double x) {
  if (std::isnan(x)) return "NaN";
  if (std::isinf(x)) return x > 0 ? "+Inf" : "-Inf";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.17g", x);
  return buf;
}

// The handlers only read the files named in `files`; they run on httplib's
// threads while the trainer appends to those files, which is why a partial
// last line is tolerated (run_data_json).
void serve_dashboard(httplib::Server& server, const RunFiles& files) {
  server.Get("/", [page = dashboard_live_html(files.name)](const httplib::Request&,
                                                           httplib::Response& res) {
    res.set_header("Cache-Control", "no-store");
    res.set_content(page, "text/html; charset=utf-8");
  });
  server.Get("/api/run", [files](const httplib::Request& req, httplib::Response& res) {
    res.set_header("Cache-Control", "no-store");
    RunDataOptions options;
    if (req.has_param("metrics_from")) {
      const std::string from = req.get_param_value("metrics_from");
      if (!absl::SimpleAtoi(from, &options.metrics_from) || options.metrics_from < 0) {
        res.status = 400;
        res.set_content(absl::StrCat("metrics_from: not a count: '", from, "'\n"), "text/plain");
        return;
      }
    }
    StatusOr<std::string> data = run_data_json(files, options);
    if (!data.ok()) {
      res.status = absl::IsNotFound(data.status()) ? 404 : 500;
      res.set_content(absl::StrCat(data.status().message(), "\n"), "text/plain");
      return;
    }
    res.set_content(*data, "application/json");
  });
}

}  // namespace

std::string prometheus_text(const std::map<std::string, double>& metrics) {
  // Two keys can sanitize to one name ("a/b" and "a_b"): the first wins, as
  // a duplicate series would make the whole scrape invalid.
  std::map<std::string, double> by_name;
  for (const auto& [k, v] : metrics) by_name.emplace(metric_name(k), v);
  std::string out;
  for (const auto& [name, v] : by_name) {
    absl::StrAppend(&out, "# TYPE ", name, " gauge\n", name, " ", prometheus_value(v), "\n");
  }
  return out;
}

StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::start(
    const std::string& host, int port, std::optional<RunFiles> dashboard) {
  auto server = std::make_unique<httplib::Server>();
  // httplib's default also sets SO_REUSEPORT, which lets a second process
  // listen on the same port and share the traffic; refuse that instead.
  server->set_socket_options([](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  const int bound = port == 0 ? server->bind_to_any_port(host.c_str())
                              : (server->bind_to_port(host.c_str(), port) ? port : -1);
  if (bound <= 0) {
    return UnavailableError(absl::StrCat("metrics endpoint: cannot listen on ", host, ":", port));
  }
  return std::unique_ptr<MetricsEndpoint>(
      new MetricsEndpoint(std::move(server), bound, std::move(dashboard)));
}

MetricsEndpoint::MetricsEndpoint(std::unique_ptr<httplib::Server> server, int port,
                                 std::optional<RunFiles> dashboard)
    : server_(std::move(server)), port_(port) {
  // Routes are registered before the server thread starts: httplib's
  // handler lists are not safe to change while it serves.
  if (dashboard) serve_dashboard(*server_, *dashboard);
  server_->Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    std::map<std::string, double> copy;
    {
      std::lock_guard<std::mutex> lock(mu_);
      copy = latest_;
    }
    res.set_content(prometheus_text(copy), "text/plain; version=0.0.4");
  });
  server_->Get("/healthz", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("ok\n", "text/plain");
  });
  thread_ = std::thread([this] { server_->listen_after_bind(); });
  // stop() before the loop has started is lost (httplib sets its running
  // flag when the loop starts), and the destructor would then wait forever.
  // httplib 0.11 signals nothing when it starts: poll its flag (a few ms at
  // most, once per endpoint).
  for (int i = 0; i < 5000 && !server_->is_running(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

MetricsEndpoint::~MetricsEndpoint() {
  server_->stop();
  if (thread_.joinable()) thread_.join();
}

void MetricsEndpoint::update(const std::map<std::string, double>& metrics) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [k, v] : metrics) latest_[k] = v;
}

}  // namespace relay::comm
