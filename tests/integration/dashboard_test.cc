// The dashboard as a browser sees it: `relay report`'s file and the live page
// of a MetricsEndpoint, each loaded in headless Chromium (Debian's chromium,
// installed by scripts/setup.sh; without it these tests fail). After the
// page's scripts ran, the test reads the DOM Chromium dumps and its console
// log: no console message and no error caught by the page, every chart drawn
// with points, every sampled token shown.

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_split.h"
#include "relay/comm/host/metrics_endpoint.h"
#include "relay/common/dashboard.h"
#include "relay/common/file_io.h"

namespace relay {
namespace {

namespace fs = std::filesystem;

struct Output {
  int exit_code = -1;
  std::string out, err;
};

Output run_shell(const std::string& command, const std::string& err_file) {
  Output r;
  FILE* pipe = popen((command + " 2>" + err_file).c_str(), "r");
  if (pipe == nullptr) return r;
  std::array<char, 1 << 14> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) r.out.append(buf.data(), n);
  const int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  StatusOr<std::string> err = read_file(err_file);
  if (err.ok()) r.err = *err;
  fs::remove(err_file);
  return r;
}

// $RELAY_CHROMIUM, else `chromium` on $PATH; empty when neither exists.
std::string chromium() {
  if (const char* env = std::getenv("RELAY_CHROMIUM"); env != nullptr && *env) return env;
  std::stringstream path(std::getenv("PATH") ? std::getenv("PATH") : "");
  for (std::string dir; std::getline(path, dir, ':');) {
    const fs::path candidate = fs::path(dir) / "chromium";
    if (::access(candidate.c_str(), X_OK) == 0) return candidate.string();
  }
  return "";
}

struct Page {
  std::string dom;                   // the document after its scripts ran
  std::vector<std::string> console;  // console messages (errors and uncaught exceptions among them)
  std::string log;                   // Chromium's whole stderr, for failure messages
};

// Loads `url` and lets the page run for `virtual_ms` of virtual time (timers
// fire without real waiting; fetches are waited for).
Page load(const std::string& url, int virtual_ms, const std::string& work_dir) {
  const std::string browser = chromium();
  EXPECT_FALSE(browser.empty()) << "chromium not found on PATH (scripts/setup.sh installs it; "
                                   "or set RELAY_CHROMIUM)";
  if (browser.empty()) return {};
  // A profile per launch: parallel tests must not share Chromium's lock.
  const std::string profile = work_dir + "/chromium-profile";
  const std::string command =
      "timeout 60 " + browser +
      " --headless --no-sandbox --disable-gpu --no-first-run --disable-extensions"
      " --user-data-dir=" +
      profile +
      " --enable-logging=stderr --v=0 --virtual-time-budget=" + std::to_string(virtual_ms) +
      " --dump-dom '" + url + "'";
  Output o = run_shell(command, work_dir + "/chromium.stderr");
  fs::remove_all(profile);
  EXPECT_EQ(o.exit_code, 0) << command << "\n" << o.err;
  Page p{o.out, {}, o.err};
  // "[pid:tid:time:INFO:CONSOLE:12] "message", source: URL (12)" (older
  // versions write CONSOLE(12)); the page itself logs nothing, so every such
  // line is a failure.
  std::stringstream lines(o.err);
  for (std::string line; std::getline(lines, line);) {
    if (line.find(":CONSOLE") != std::string::npos) p.console.push_back(line);
  }
  return p;
}

// The start tags in `dom` that contain `needle`.
std::vector<std::string> tags_with(const std::string& dom, const std::string& needle) {
  std::vector<std::string> out;
  for (size_t at = dom.find(needle); at != std::string::npos; at = dom.find(needle, at + 1)) {
    const size_t begin = dom.rfind('<', at);
    const size_t end = dom.find('>', at);
    out.push_back(dom.substr(begin, end - begin + 1));
  }
  return out;
}

std::optional<std::string> attr(const std::string& tag, const std::string& name) {
  std::smatch m;
  if (!std::regex_search(tag, m, std::regex(" " + name + "=\"([^\"]*)\""))) return std::nullopt;
  return m[1].str();
}

int64_t int_attr(const std::string& dom, const std::string& needle, const std::string& name) {
  std::vector<std::string> tags = tags_with(dom, needle);
  if (tags.size() != 1) {
    ADD_FAILURE() << tags.size() << " elements with " << needle;
    return -1;
  }
  std::optional<std::string> v = attr(tags[0], name);
  if (!v) {
    ADD_FAILURE() << "no " << name << " in " << tags[0];
    return -1;
  }
  return std::stoll(*v);
}

// chart id -> data-points of every chart the page drew.
std::map<std::string, int64_t> charts(const std::string& dom) {
  std::map<std::string, int64_t> out;
  for (const std::string& tag : tags_with(dom, "data-chart=\"")) {
    std::optional<std::string> id = attr(tag, "data-chart");
    std::optional<std::string> points = attr(tag, "data-points");
    if (!id || !points) {
      ADD_FAILURE() << "chart without id or data-points: " << tag;
      continue;
    }
    out[*id] = std::stoll(*points);
  }
  return out;
}

// What every loaded dashboard must satisfy.
void expect_clean(const Page& p) {
  EXPECT_TRUE(p.console.empty()) << "console messages:\n"
                                 << [&] {
                                      std::string s;
                                      for (const std::string& l : p.console) s += l + "\n";
                                      return s;
                                    }();
  EXPECT_EQ(int_attr(p.dom, "id=\"page-errors\"", "data-count"), 0)
      << tags_with(p.dom, "<li>").size() << " errors caught by the page:\n"
      << p.dom.substr(0, 2000);
}

// The charts of a run that records every metric they draw, with RL steps
// 1..kSteps and evaluations at 0 and kSteps.
constexpr int kSteps = 6;
const std::map<std::string, int64_t> kCharts = {{"reward", kSteps + 2},
                                                {"kl", 4 * kSteps},
                                                {"clip", 4 * kSteps},
                                                {"ratio", 8 * kSteps},
                                                {"valid", 2 * kSteps},
                                                {"staleness", 3 * kSteps},
                                                {"throughput", kSteps},
                                                {"time", 4 * kSteps},
                                                {"loss", 2 * kSteps},
                                                {"entropy", 2 * kSteps},
                                                {"sft", 3}};

const char kEvil[] =
    "</script><script>document.title='pwned'</script><img src=x "
    "onerror=\"document.title='pwned'\">";

// A run directory like relay-trainer's: metric names as the trainer writes
// them (NaN as null), samples.jsonl from samples_jsonl_line, one sampled
// token that tries to inject markup.
class DashboardBrowserTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/dashboard_it_" + std::to_string(::getpid()) + "_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    run_ = dir_ + "/run7";
    fs::remove_all(dir_);
    fs::create_directories(run_);
    std::string metrics;
    for (int k = 1; k <= 3; ++k) {
      metrics += "{\"phase\":\"sft\",\"step\":" + std::to_string(k) +
                 ",\"sft_loss\":" + std::to_string(3.0 / k) + "}\n";
    }
    metrics += "{\"phase\":\"eval\",\"step\":0,\"accuracy\":0.5}\n";
    // Every metric a chart draws, as relay-trainer names them.
    const std::vector<std::string> rl_keys = absl::StrSplit(
        "kl_ref ppo_kl reward_kl/kl mismatch/k3 clip_fraction clip_fraction/low "
        "clip_fraction/high clip_fraction/dual mean_importance_ratio is_ratio/mean is_ratio/min "
        "is_ratio/max is_weight/mean is_weight/min is_weight/max proximal/behav_imp_weight "
        "frac_old_logprobs_valid proximal/recorded_fraction staleness/mean staleness/max "
        "store/wait_versions_mean throughput/samples_per_s time/step_s store/wait_s "
        "weight_sync/broadcast_s time/elapsed_s time/train_s loss pg_loss entropy "
        "response_length/mean version",
        ' ');
    for (int step = 1; step <= kSteps; ++step) {
      std::string line = "{\"phase\":\"rl\",\"step\":" + std::to_string(step) +
                         ",\"reward/mean\":" + std::to_string(0.1 * step) +
                         ",\"batch/trajectories\":null";  // NaN: drawn nowhere, breaks nothing
      int i = 0;
      for (const std::string& key : rl_keys) {
        line += ",\"" + key + "\":" + std::to_string(0.01 * (step + ++i));
      }
      metrics += line + "}\n";
    }
    metrics += "{\"phase\":\"eval\",\"step\":" + std::to_string(kSteps) + ",\"accuracy\":0.875}\n";
    records_ = 3 + 1 + kSteps + 1;
    ASSERT_TRUE(write_file_atomic(run_ + "/metrics.jsonl", metrics).ok());

    std::string samples;
    for (int step = 1; step <= kSteps; ++step) {
      std::vector<SampleRecord> records;
      for (int j = 0; j < 2; ++j) {
        SampleRecord r;
        r.group_id = "p" + std::to_string(step) + "#" + std::to_string(j);
        r.prompt = "<" + std::to_string(step) + "+" + std::to_string(j) + ">";
        r.pieces = {std::to_string(step + j), "#", j == 1 ? kEvil : "<eos>", ""};
        r.token_ids = {3 + step + j, 22, 2, 300};
        r.logprobs = {-0.01f * step, -2.5f, -7.0f, NAN};
        r.versions = {step, step, step + 1, step + 1};
        r.reward = j == 0 ? 1.0 : NAN;
        r.finish_reason = "stop";
        if (j == 1) r.env_mask = {0, 1, 1, 0};  // an episode: two environment tokens
        records.push_back(r);
      }
      samples += samples_jsonl_line(step, step + 1, records) + "\n";
    }
    ASSERT_TRUE(write_file_atomic(run_ + "/samples.jsonl", samples).ok());
    ASSERT_TRUE(write_file_atomic(run_ + "/config.yaml", "experiment:\n  name: run7\n").ok());
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Everything a dashboard of this run shows, in either mode.
  void expect_whole_run(const Page& p) {
    expect_clean(p);
    EXPECT_GE(int_attr(p.dom, "<body", "data-renders"), 1);
    EXPECT_EQ(int_attr(p.dom, "<body", "data-metrics"), records_);
    EXPECT_EQ(charts(p.dom), kCharts);
    // The last 4 steps, 2 samples of 4 tokens each.
    EXPECT_EQ(int_attr(p.dom, "id=\"samples\"", "data-tokens"), 4 * 2 * 4);
    EXPECT_EQ(tags_with(p.dom, "class=\"tok").size(), 4u * 2 * 4);
    // The environment's tokens are drawn apart, without a log-prob colour.
    EXPECT_EQ(tags_with(p.dom, "class=\"tok env").size(), 4u * 2);
    EXPECT_NE(p.dom.find("environment (not sampled; out of the loss)"), std::string::npos);
    // The injected markup is text on the page, and did nothing.
    EXPECT_NE(p.dom.find("&lt;/script&gt;&lt;script&gt;document.title='pwned'"), std::string::npos);
    EXPECT_EQ(p.dom.find("<img"), std::string::npos);
    EXPECT_NE(p.dom.find("<title>relay: run7</title>"), std::string::npos);
    EXPECT_NE(p.dom.find("name: run7"), std::string::npos) << "config.yaml is shown";
  }

  std::string dir_, run_;
  int64_t records_ = 0;
};

TEST_F(DashboardBrowserTest, ReportFileDrawsEveryChartAndTheSamples) {
  const std::string out = dir_ + "/report.html";
  Output r = run_shell(std::string(RELAY_CLI_PATH) + " report " + run_ + " --out " + out,
                       dir_ + "/relay.stderr");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, out + "\n");
  Page p = load("file://" + out, 1000, dir_);
  expect_whole_run(p);
  EXPECT_NE(p.dom.find("data-mode=\"report\""), std::string::npos);
}

TEST_F(DashboardBrowserTest, LivePagePollsTheTrainerEndpoint) {
  // The trainer is writing its next line.
  std::string metrics = *read_file(run_ + "/metrics.jsonl");
  ASSERT_TRUE(
      write_file_atomic(run_ + "/metrics.jsonl", metrics + "{\"phase\":\"rl\",\"step\":7,\"rew")
          .ok());
  auto endpoint = comm::MetricsEndpoint::start("127.0.0.1", 0, run_files(run_));
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  // Polls at 0, 2 and 4 s of virtual time.
  Page p = load("http://127.0.0.1:" + std::to_string((*endpoint)->port()) + "/", 4500, dir_);
  expect_whole_run(p);
  EXPECT_NE(p.dom.find("data-mode=\"live\""), std::string::npos);
  EXPECT_GE(int_attr(p.dom, "<body", "data-renders"), 2) << "the page polls and redraws";
  EXPECT_NE(p.dom.find("data-last-poll=\"ok\""), std::string::npos);
}

// The checks above can fail: a page whose script breaks is caught both on
// Chromium's console and by the page's own error list.
TEST_F(DashboardBrowserTest, ABrokenPageIsCaught) {
  const std::string out = dir_ + "/broken.html";
  ASSERT_TRUE(write_file_atomic(out, dashboard_report_html("broken", "{not json")).ok());
  Page p = load("file://" + out, 1000, dir_);
  ASSERT_FALSE(p.console.empty()) << p.log;
  EXPECT_NE(p.console[0].find("SyntaxError"), std::string::npos) << p.console[0];
  EXPECT_EQ(int_attr(p.dom, "id=\"page-errors\"", "data-count"), 1);
  EXPECT_NE(p.dom.find("SyntaxError"), std::string::npos);
  EXPECT_TRUE(charts(p.dom).empty());
}

TEST_F(DashboardBrowserTest, ReportErrorsNameTheFileAndLine) {
  const std::string relay = RELAY_CLI_PATH;
  Output r = run_shell(relay + " report " + dir_ + "/nothing", dir_ + "/e1");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, "relay report: " + dir_ + "/nothing: not a run directory (no such directory)\n");

  fs::create_directories(dir_ + "/empty");
  r = run_shell(relay + " report " + dir_ + "/empty", dir_ + "/e2");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find(dir_ + "/empty/metrics.jsonl: no such file"), std::string::npos) << r.err;

  std::string metrics = *read_file(run_ + "/metrics.jsonl");
  ASSERT_TRUE(
      write_file_atomic(run_ + "/metrics.jsonl", "{\"phase\":\"rl\",\"step\":1}\nnope\n" + metrics)
          .ok());
  r = run_shell(relay + " report " + run_, dir_ + "/e3");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("relay report: " + run_ + "/metrics.jsonl:2: not JSON"), std::string::npos)
      << r.err;
  EXPECT_FALSE(fs::exists(run_ + "/report.html"));
}

// What relay-trainer writes, end to end: a short real run, its report in the
// browser.
TEST(DashboardRealRunTest, ReportOfAShortRun) {
  const std::string dir = ::testing::TempDir() + "/dashboard_real_" + std::to_string(::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string relay = RELAY_CLI_PATH;
  constexpr int kRlSteps = 3;
  Output run = run_shell(relay + " run " + RELAY_SOURCE_DIR + "/configs/tiny.yaml --workers 1" +
                             " --steps " + std::to_string(kRlSteps) +
                             " --groups-per-step 2 --eval-prompts 4 experiment.output_dir=" + dir,
                         dir + "/run.stderr");
  ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
  EXPECT_TRUE(std::regex_search(run.out, std::regex("dashboard at http://127\\.0\\.0\\.1:[0-9]+/")))
      << run.out;

  // One samples line per RL step; the page shows every token of the last 4.
  const std::string run_dir = dir + "/tiny";
  StatusOr<std::string> samples = read_file(run_dir + "/samples.jsonl");
  ASSERT_TRUE(samples.ok()) << samples.status();
  std::stringstream lines(*samples);
  int steps = 0;
  int64_t tokens = 0;
  for (std::string line; std::getline(lines, line);) {
    nlohmann::json j = nlohmann::json::parse(line);
    EXPECT_EQ(j["step"], ++steps);
    ASSERT_FALSE(j["samples"].empty());
    EXPECT_LE(j["samples"].size(), 4u);
    for (const nlohmann::json& s : j["samples"]) {
      EXPECT_EQ(s["pieces"].size(), s["logprobs"].size());
      EXPECT_EQ(s["pieces"].size(), s["token_ids"].size());
      EXPECT_EQ(s["pieces"].size(), s["versions"].size());
      EXPECT_FALSE(s["prompt"].get<std::string>().empty());
      tokens += static_cast<int64_t>(s["pieces"].size());
    }
  }
  EXPECT_EQ(steps, kRlSteps);
  ASSERT_GT(tokens, 0);

  Output report = run_shell(relay + " report " + run_dir, dir + "/report.stderr");
  ASSERT_EQ(report.exit_code, 0) << report.err;
  Page p = load("file://" + run_dir + "/report.html", 1000, dir);
  expect_clean(p);
  const std::map<std::string, int64_t> drawn = charts(p.dom);
  for (const char* id :
       {"reward", "kl", "clip", "ratio", "valid", "staleness", "throughput", "time", "loss"}) {
    EXPECT_GT(drawn.count(id) ? drawn.at(id) : 0, 0) << id;
  }
  EXPECT_EQ(drawn.count("throughput") ? drawn.at("throughput") : 0, kRlSteps);
  EXPECT_EQ(int_attr(p.dom, "id=\"samples\"", "data-tokens"), tokens);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace relay
