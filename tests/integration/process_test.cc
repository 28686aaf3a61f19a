// relay-trainer and relay-rollout as separate processes that get killed:
// a worker SIGKILLed mid-run, a trainer SIGKILLed and restarted on its run
// directory. What must hold (DESIGN.md invariants 6-7): training goes on, a
// dead worker's prompts are leased again, every acknowledged group is in the
// store exactly once, and a restarted trainer resumes from its checkpoint.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include <rocksdb/db.h>
#include <torch/types.h>
#include <torch/utils.h>

#include "relay/comm/rpc/grpc_trainer_client.h"
#include "relay/model/checkpoint.h"
#include "relay/store/rollout_store.h"
#include "relay/trainer/run_checkpoint.h"
#include "relay/v1/admin.pb.h"
#include "relay/v1/store.pb.h"
#include "testing/ports.h"

extern char** environ;

namespace relay {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using relay::testing::free_port;

const std::string kTinyConfig = std::string(RELAY_SOURCE_DIR) + "/configs/tiny.yaml";

// A child process with stdout and stderr in files.
struct Child {
  pid_t pid = -1;
  std::string out_file;

  std::string output() const {
    std::ifstream in(out_file);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  // Exit code, or 128 + signal; -1 when still running after `timeout`.
  int wait(std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      if (::waitpid(pid, &status, WNOHANG) == pid) {
        pid = -1;
        if (WIFEXITED(status)) return WEXITSTATUS(status);
        return 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(20ms);
    }
    return -1;
  }
  void kill(int sig) {
    if (pid > 0) ::kill(pid, sig);
  }
  ~Child() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }
};

std::unique_ptr<Child> start(const std::vector<std::string>& args, const std::string& out_file) {
  auto c = std::make_unique<Child>();
  c->out_file = out_file;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, out_file.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const int rc = ::posix_spawn(&c->pid, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  EXPECT_EQ(rc, 0) << "cannot start " << args[0];
  return c;
}

// A checkpoint's directory name: "step_000012".
std::string step_dir(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "step_%06lld", static_cast<long long>(step));
  return buf;
}

// RL steps recorded in a metrics file so far.
int rl_steps(const std::string& metrics) {
  std::ifstream in(metrics);
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    if (line.find("\"phase\":\"rl\"") != std::string::npos) ++n;
  }
  return n;
}

bool wait_for(const std::function<bool()>& cond, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (cond()) return true;
    std::this_thread::sleep_for(20ms);
  }
  return cond();
}

// "... 12 accepted ..." summed over the workers' final lines.
int64_t accepted_by(const std::string& worker_output) {
  static const std::regex re(R"((\d+) groups submitted, (\d+) accepted)");
  std::smatch m;
  int64_t last = -1;
  for (auto it = std::sregex_iterator(worker_output.begin(), worker_output.end(), re);
       it != std::sregex_iterator(); ++it) {
    last = std::stoll((*it)[2]);
  }
  return last;
}

struct StoreView {
  uint64_t appended = 0;
  std::map<std::string, int> group_ids;  // id -> how many stored groups carry it
  // The same, leaving out EXPIRED groups: a restarted trainer drops groups
  // that arrived after its checkpoint (EXPIRED), and their prompts are
  // leased and stored again.
  std::map<std::string, int> live_group_ids;
  std::set<uint64_t> seqs;
};

StoreView read_store(const std::string& path) {
  store::StoreOptions o;
  o.path = path;
  o.read_only = true;
  auto st = store::RolloutStore::open(o);
  EXPECT_TRUE(st.ok()) << st.status();
  StoreView v;
  if (!st.ok()) return v;
  v.appended = (*st)->appended();
  auto groups = (*st)->scan();
  EXPECT_TRUE(groups.ok()) << groups.status();
  if (!groups.ok()) return v;
  for (const store::StoredGroup& g : *groups) {
    ++v.group_ids[g.group.group_id];
    if (g.state != store::GroupState::kExpired) ++v.live_group_ids[g.group.group_id];
    v.seqs.insert(g.seq);
  }
  return v;
}

class ProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = ::testing::TempDir() + "/relay_proc_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name() + "_" +
            std::to_string(::getpid());
    fs::remove_all(base_);
    fs::create_directories(base_);
  }
  void TearDown() override { fs::remove_all(base_); }

  std::vector<std::string> trainer_args(int port, int steps) const {
    return {RELAY_TRAINER_PATH, kTinyConfig, "experiment.output_dir=" + base_,
            "experiment.steps=" + std::to_string(steps), "experiment.groups_per_step=4",
            "experiment.checkpoint_every=2", "rollout.n=4", "trainer.max_staleness=2",
            // A dead worker's leases come back after 1.5 s.
            "services.lease_timeout_s=1.5", "--listen", "127.0.0.1:" + std::to_string(port)};
  }
  std::vector<std::string> worker_args(int port, const std::string& name) const {
    return {RELAY_ROLLOUT_PATH, kTinyConfig,
            "rollout.n=4",      "rollout.groups_in_flight=4",
            "--trainer",        "127.0.0.1:" + std::to_string(port),
            "--name",           name};
  }
  std::string run_dir() const { return base_ + "/tiny"; }

  // `relay run config` with `common` then `extra` overrides, logged to
  // base_/log; expects it to finish with 0 within 240 s; its output.
  std::string relay_run(const std::string& config, const std::vector<std::string>& common,
                        const std::vector<std::string>& extra, const std::string& log) const {
    std::vector<std::string> args = {RELAY_CLI_PATH, "run", config};
    args.insert(args.end(), common.begin(), common.end());
    args.insert(args.end(), extra.begin(), extra.end());
    auto run = start(args, base_ + "/" + log);
    EXPECT_EQ(run->wait(240s), 0) << run->output();
    return run->output();
  }

  std::string base_;
};

// A worker killed with SIGKILL mid-run: the other worker carries training to
// the end, the dead worker's leases expire and their prompts are leased
// again, and no group is stored twice.
TEST_F(ProcessTest, TrainingSurvivesAWorkerKilledMidRun) {
  const int port = free_port();
  // max_staleness 0: the dead worker's leases hold the whole bound, so the
  // run cannot finish unless they expire and their prompts are re-leased.
  std::vector<std::string> targs = trainer_args(port, 24);
  targs.push_back("trainer.max_staleness=0");
  auto trainer = start(targs, base_ + "/trainer.log");
  auto a = start(worker_args(port, "a"), base_ + "/a.log");
  const std::string metrics = run_dir() + "/metrics.jsonl";
  ASSERT_TRUE(wait_for([&] { return rl_steps(metrics) >= 3; }, 120s)) << trainer->output();
  // Freeze `a` (the only worker) until the trainer's stats show it holding
  // leases, then kill it: its leases are certainly orphaned.
  comm::ClientOptions co;
  co.address = "127.0.0.1:" + std::to_string(port);
  auto client = comm::GrpcTrainerClient::connect(co);
  ASSERT_TRUE(client.ok()) << client.status();
  int64_t held = 0;
  for (int i = 0; i < 200 && held == 0; ++i) {
    a->kill(SIGSTOP);
    auto st = (*client)->stats();
    ASSERT_TRUE(st.ok()) << st.status();
    held = st->in_flight();
    if (held == 0) {
      a->kill(SIGCONT);
      std::this_thread::sleep_for(10ms);
    }
  }
  ASSERT_GT(held, 0);
  a->kill(SIGKILL);
  EXPECT_EQ(a->wait(10s), 128 + SIGKILL);
  const int steps_at_kill = rl_steps(metrics);
  auto b = start(worker_args(port, "b"), base_ + "/b.log");
  const int code = trainer->wait(180s);
  ASSERT_EQ(code, 0) << trainer->output();
  EXPECT_EQ(rl_steps(metrics), 24);
  EXPECT_LT(steps_at_kill, 24);
  const std::string out = trainer->output();
  static const std::regex re(R"((\d+) leases expired)");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, re)) << out;
  EXPECT_GT(std::stoll(m[1]), 0) << "the dead worker's leases expired and were re-queued\n" << out;
  ASSERT_EQ(b->wait(30s), 0) << b->output();

  StoreView v = read_store(run_dir() + "/store");
  for (const auto& [id, n] : v.group_ids) EXPECT_EQ(n, 1) << id << " stored twice";
  // Every group the surviving worker saw acknowledged is in the store (the
  // killed one never printed its count); compaction has not run (< 10 steps
  // per compaction window is not guaranteed, so compare arrival numbers).
  EXPECT_GE(static_cast<int64_t>(v.appended), accepted_by(b->output()));
}

// The trainer SIGKILLed and started again on the same run directory: it
// resumes from its newest checkpoint, every group acknowledged before the
// kill is still in the store, and the worker reconnects by itself and
// finishes the run with it.
TEST_F(ProcessTest, TrainerKilledAndRestartedResumesWithEveryAcknowledgedGroup) {
  const int port = free_port();
  auto trainer = start(trainer_args(port, 12), base_ + "/trainer1.log");
  auto worker = start(worker_args(port, "w"), base_ + "/w.log");
  const std::string metrics = run_dir() + "/metrics.jsonl";
  ASSERT_TRUE(wait_for([&] { return rl_steps(metrics) >= 5; }, 120s)) << trainer->output();
  trainer->kill(SIGKILL);
  EXPECT_EQ(trainer->wait(10s), 128 + SIGKILL);
  const StoreView before = read_store(run_dir() + "/store");
  EXPECT_GT(before.appended, 0u);

  auto again = start(trainer_args(port, 12), base_ + "/trainer2.log");
  const int code = again->wait(180s);
  const std::string out = again->output();
  ASSERT_EQ(code, 0) << out << worker->output();
  EXPECT_NE(out.find("resumed from"), std::string::npos) << out;
  EXPECT_EQ(out.find("eval before"), std::string::npos) << "no fresh start";
  const StoreView after = read_store(run_dir() + "/store");
  // Nothing acknowledged before the kill is gone (compaction runs every 10
  // steps of a process and keeps 8 versions, so none ran here).
  for (uint64_t seq : before.seqs) EXPECT_EQ(after.seqs.count(seq), 1u) << "group " << seq;
  for (const auto& [id, n] : after.live_group_ids) EXPECT_EQ(n, 1) << id << " stored twice";
  EXPECT_GE(after.appended, before.appended);
  // The run ends at step 12 in all: the restarted process did the rest.
  std::ifstream in(metrics);
  std::string line;
  std::set<int64_t> steps;
  while (std::getline(in, line)) {
    nlohmann::json j = nlohmann::json::parse(line);
    if (j["phase"] == "rl") steps.insert(j["step"].get<int64_t>());
  }
  EXPECT_EQ(*steps.rbegin(), 12);
  EXPECT_EQ(worker->wait(90s), 0) << worker->output();
  EXPECT_NE(worker->output().find("reconnected"), std::string::npos) << worker->output();
  // Every group the worker saw acknowledged (by either trainer) is stored.
  // The store may hold more: a group made durable just before the SIGKILL
  // whose ack never left the dead trainer.
  EXPECT_GE(static_cast<int64_t>(after.appended), accepted_by(worker->output()));
}

// SIGTERM is a drain, not a crash: the worker gives its leases back at once
// and the trainer writes a checkpoint of where it stopped.
TEST_F(ProcessTest, SigtermDrainsWorkerAndTrainer) {
  const int port = free_port();
  auto trainer = start(trainer_args(port, 1000), base_ + "/trainer.log");
  auto worker = start(worker_args(port, "w"), base_ + "/w.log");
  const std::string metrics = run_dir() + "/metrics.jsonl";
  ASSERT_TRUE(wait_for([&] { return rl_steps(metrics) >= 3; }, 120s)) << trainer->output();
  worker->kill(SIGTERM);
  ASSERT_EQ(worker->wait(30s), 0) << worker->output();
  EXPECT_NE(worker->output().find("gave back"), std::string::npos) << worker->output();
  trainer->kill(SIGTERM);
  ASSERT_EQ(trainer->wait(60s), 0) << trainer->output();
  const std::string out = trainer->output();
  EXPECT_NE(out.find("stopped: version"), std::string::npos) << out;
  static const std::regex re(R"(stopped: version \d+, step (\d+))");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, re));
  EXPECT_TRUE(fs::exists(run_dir() + "/checkpoints/" + step_dir(std::stoll(m[1].str())) +
                         "/checkpoint.json"))
      << "a checkpoint at the step it stopped at";
}

// relay serve uses the task only for its stop strings: a config whose task
// file is not on the serving machine serves (it used to stop at start-up,
// "task.path: ... no such file"), and SIGTERM ends it cleanly.
TEST_F(ProcessTest, ServeStartsWithoutTheTasksFile) {
  const std::string model = base_ + "/model";
  auto init = start({RELAY_CLI_PATH, "init", kTinyConfig, "--out", model}, base_ + "/init.log");
  ASSERT_EQ(init->wait(120s), 0) << init->output();
  const std::string port_file = base_ + "/port";
  const std::string absent = base_ + "/absent.jsonl";
  auto serve =
      start({RELAY_CLI_PATH, "serve", kTinyConfig, "--model", model, "--listen", "127.0.0.1:0",
             "--port-file", port_file, "task.name=jsonl", "task.path=" + absent},
            base_ + "/serve.log");
  int exited = -1;
  ASSERT_TRUE(wait_for(
      [&] {
        if (exited < 0) exited = serve->wait(20ms);
        return exited >= 0 || fs::exists(port_file);
      },
      120s))
      << serve->output();
  ASSERT_TRUE(fs::exists(port_file)) << "exit " << exited << ":\n" << serve->output();
  EXPECT_FALSE(fs::exists(absent));
  EXPECT_NE(serve->output().find("relay serve: model on http://127.0.0.1:"), std::string::npos)
      << serve->output();
  serve->kill(SIGTERM);
  EXPECT_EQ(serve->wait(60s), 0) << serve->output();
}

// What the store holds after an asynchronous run with two workers: in every
// trajectory, token versions never decrease and (for what was trained on) lie
// within the staleness bound of the version that consumed it; and behavior
// log-probs re-scored by the trainer's policy at the version that sampled
// them agree to 2e-5 (same weights, other batch shapes: float32 rounding
// only). Checkpoints at every version give the trainer's weights.
TEST_F(ProcessTest, StoredTrajectoriesHaveOrderedVersionsAndReproducibleLogprobs) {
  const int port = free_port();
  std::vector<std::string> targs = trainer_args(port, 8);
  for (const char* o : {"trainer.max_staleness=1", "experiment.checkpoint_every=1",
                        "experiment.keep_checkpoints=100", "trainer.lr=1e-3",
                        // A warm start gives rewards that differ, hence updates.
                        "experiment.warm_start.sft_steps=30", "experiment.warm_start.sft_lr=3e-3",
                        "task.arithmetic.max_operands=2"}) {
    targs.push_back(o);
  }
  auto trainer = start(targs, base_ + "/trainer.log");
  std::vector<std::string> wargs = worker_args(port, "a");
  wargs.push_back("task.arithmetic.max_operands=2");
  auto a = start(wargs, base_ + "/a.log");
  wargs = worker_args(port, "b");
  wargs.push_back("task.arithmetic.max_operands=2");
  auto b = start(wargs, base_ + "/b.log");
  ASSERT_EQ(trainer->wait(180s), 0) << trainer->output();
  // A worker that registered hears "finished" and exits. One that started so
  // slowly (a loaded CI machine) that the 8 steps were over before it
  // registered would go on trying to reach the trainer; SIGTERM ends it.
  for (Child* w : {a.get(), b.get()}) {
    int code = w->wait(15s);
    if (code < 0) {
      w->kill(SIGTERM);
      code = w->wait(30s);
    }
    ASSERT_EQ(code, 0) << w->output();
  }

  store::StoreOptions o;
  o.path = run_dir() + "/store";
  o.read_only = true;
  auto st = store::RolloutStore::open(o);
  ASSERT_TRUE(st.ok()) << st.status();
  const std::vector<store::StoredGroup> groups = (*st)->scan().value();
  ASSERT_GT(groups.size(), 0u);
  std::map<int64_t, model::Policy> policies;
  auto policy_at = [&](int64_t v) -> model::Policy {
    auto it = policies.find(v);
    if (it != policies.end()) return it->second;
    // Checkpoints are named by RL step; checkpoint.json says their version.
    static std::map<int64_t, std::string> dirs;
    if (dirs.empty()) {
      for (const auto& e : fs::directory_iterator(run_dir() + "/checkpoints")) {
        std::ifstream in(e.path() / "checkpoint.json");
        if (!in) continue;
        dirs[nlohmann::json::parse(in)["version"].get<int64_t>()] = e.path().string();
      }
    }
    if (dirs.count(v) == 0) return nullptr;
    const std::string dir = dirs[v];
    model::Policy p = model::load_policy(dir).value();
    p->eval();
    policies.emplace(v, p);
    return p;
  };
  int consumed = 0, rescored = 0;
  double worst = 0;
  std::set<int64_t> versions_seen;
  torch::NoGradGuard no_grad;
  for (const store::StoredGroup& g : groups) {
    if (g.state == store::GroupState::kConsumed) {
      ++consumed;
      EXPECT_LE(g.consumed_version - g.min_version, 1) << g.group.group_id << ": staleness bound";
    }
    for (const rollout::Trajectory& t : g.group.trajectories) {
      ASSERT_FALSE(t.token_versions.empty());
      for (size_t i = 1; i < t.token_versions.size(); ++i) {
        EXPECT_LE(t.token_versions[i - 1], t.token_versions[i]) << g.group.group_id;
      }
      const int64_t v = t.token_versions.front();
      if (v != t.token_versions.back()) continue;  // interrupted mid-response
      model::Policy p = policy_at(v);
      if (!p) continue;
      std::vector<int64_t> ids(t.prompt_tokens.begin(), t.prompt_tokens.end());
      ids.insert(ids.end(), t.response_tokens.begin(), t.response_tokens.end());
      at::Tensor lp = p->score(torch::tensor(ids, torch::kInt64).view({1, -1}));
      const int64_t first = static_cast<int64_t>(t.prompt_tokens.size()) - 1;
      for (size_t j = 0; j < t.response_tokens.size(); ++j) {
        const double diff = std::abs(lp[0][first + static_cast<int64_t>(j)].item<double>() -
                                     t.behavior_logprobs[j]);
        worst = std::max(worst, diff);
      }
      ++rescored;
      versions_seen.insert(v);
    }
  }
  EXPECT_EQ(consumed, 8 * 4) << "every step took groups_per_step groups";
  EXPECT_GT(rescored, 32);
  EXPECT_GE(versions_seen.size(), 4u) << "trajectories from several versions were checked";
  EXPECT_LT(worst, 2e-5) << "behavior log-probs vs the trainer's re-score at the same version";
}

// Child processes of `pid` whose command name is `comm`.
std::vector<pid_t> children(pid_t pid, const std::string& comm) {
  std::vector<pid_t> out;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(e.path() / "stat");
    std::string stat;
    std::getline(in, stat);
    // pid (comm) state ppid ...
    const size_t open = stat.find('('), close = stat.rfind(')');
    if (open == std::string::npos || close == std::string::npos) continue;
    if (stat.substr(open + 1, close - open - 1) != comm.substr(0, 15)) continue;
    std::istringstream rest(stat.substr(close + 2));
    std::string state;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (ppid == pid) out.push_back(std::stoi(name));
  }
  return out;
}

// Workers that registered so far ("worker <id>: running version N" lines).
int registrations(const std::string& output) {
  int n = 0;
  for (size_t at = output.find(": running version"); at != std::string::npos;
       at = output.find(": running version", at + 1)) {
    ++n;
  }
  return n;
}

// `relay run` supervises its workers: one SIGKILLed is started again (and
// registers anew), training goes on, and SIGTERM then drains the whole run
// with a checkpoint, exit code 0.
TEST_F(ProcessTest, RelayRunRestartsAWorkerThatDies) {
  auto run = start({RELAY_CLI_PATH, "run", kTinyConfig, "--workers", "2", "--steps", "100000",
                    "--groups-per-step", "4", "rollout.n=4", "trainer.max_staleness=1",
                    // The dead worker's leases go back after 2 s of silence.
                    "services.worker_timeout_s=2", "experiment.output_dir=" + base_},
                   base_ + "/run.log");
  const std::string metrics = run_dir() + "/metrics.jsonl";
  ASSERT_TRUE(wait_for([&] { return rl_steps(metrics) >= 3; }, 120s)) << run->output();
  std::vector<pid_t> workers = children(run->pid, "relay-rollout");
  ASSERT_EQ(workers.size(), 2u) << run->output();
  const int registered = registrations(run->output());
  ::kill(workers[0], SIGKILL);
  ASSERT_TRUE(wait_for(
      [&] {
        const std::vector<pid_t> now = children(run->pid, "relay-rollout");
        return now.size() == 2 && std::find(now.begin(), now.end(), workers[0]) == now.end();
      },
      60s))
      << run->output();
  // The new worker registers and steps keep coming.
  ASSERT_TRUE(wait_for([&] { return registrations(run->output()) > registered; }, 60s))
      << run->output();
  const int steps = rl_steps(metrics);
  ASSERT_TRUE(wait_for([&] { return rl_steps(metrics) > steps + 3; }, 60s)) << run->output();
  // The kill is reported as the kernel's would be, with the peak RSS.
  EXPECT_TRUE(std::regex_search(
      run->output(),
      std::regex(R"(worker local[01] was killed by SIGKILL \(probably out of memory: peak RSS )"
                 R"([0-9.]+ (KiB|MiB|GiB); see docs/services.md[^)]*\); restarting in 1 s)")))
      << run->output();
  const std::vector<pid_t> live = children(run->pid, "relay-rollout");
  run->kill(SIGTERM);
  ASSERT_EQ(run->wait(90s), 0) << run->output();
  EXPECT_NE(run->output().find("stopped: version"), std::string::npos) << run->output();
  EXPECT_NE(run->output().find("gave back"), std::string::npos) << "workers drained";
  for (pid_t p : live) EXPECT_FALSE(fs::exists("/proc/" + std::to_string(p))) << "worker " << p;
}

// Occurrences of `what` in `text`.
int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// `relay run` whose workers the kernel SIGKILLs at every start, as the
// out-of-memory killer does to a model too big for the machine: each death
// is reported as probably out of memory with the peak RSS, each worker is
// given up after dying that way 3 times in a row, and then the trainer is
// stopped at once (it checkpoints) and relay run exits non-zero saying every
// worker is gone. Before, relay run restarted each worker 20 times, backing
// off up to 30 s, and the trainer waited services.group_wait_s (600 s).
//
// The SIGKILL comes 5 s into each life: relay run starts relay-rollout from
// its own directory, so the test runs relay from a directory of its own (a
// hard link to the binary, which /proc/self/exe then names) in which
// relay-rollout is a script that leaves a timer behind and execs the real
// worker, whose pid is the script's. (It used to set a 1 s CPU limit, but a
// worker that mostly waits for leases can take over a minute of wall time to
// spend 1 s of CPU, and a life that long counts as healthy.)
TEST_F(ProcessTest, RelayRunGivesUpOnWorkersKilledThreeTimesInARowAndStops) {
  const std::string bin = base_ + "/bin";
  fs::create_directories(bin);
  std::error_code ec;
  fs::create_hard_link(RELAY_CLI_PATH, bin + "/relay", ec);
  if (ec) fs::copy_file(RELAY_CLI_PATH, bin + "/relay");  // /tmp on another filesystem
  fs::create_symlink(RELAY_TRAINER_PATH, bin + "/relay-trainer");
  {
    std::ofstream script(bin + "/relay-rollout");
    script << "#!/bin/sh\n(sleep 5; kill -KILL $$) > /dev/null 2>&1 &\nexec '" << RELAY_ROLLOUT_PATH
           << "' \"$@\"\n";
  }
  fs::permissions(bin + "/relay-rollout", fs::perms::owner_all, fs::perm_options::add);

  const auto t0 = std::chrono::steady_clock::now();
  // A batch larger than the workers live to make: the trainer only waits,
  // as it did in the user's report, and leaves the cores to the workers.
  auto run = start({bin + "/relay", "run", kTinyConfig, "--workers", "2", "--steps", "10",
                    "--groups-per-step", "1000", "rollout.n=4", "experiment.output_dir=" + base_},
                   base_ + "/run.log");
  const int code = run->wait(240s);
  const auto took = std::chrono::steady_clock::now() - t0;
  const std::string out = run->output();
  ASSERT_NE(code, -1) << "still running after 240 s\n" << out;
  EXPECT_EQ(code, 1) << out;
  // Three short lives (5 s each) and two backoffs (1 s, 2 s)
  // per worker, side by side, plus the trainer's start and checkpoint. In
  // CI's runs of 2026-11-27 that took 41 s on the 2-core machine, and 79 s
  // beside another test's processes: the bound is not a timing target, it
  // tells this behaviour from the old one, which took over 600 s (the
  // trainer's group_wait_s; the restarts alone, over 450 s).
  EXPECT_LT(took, 180s) << out;
  // Every death, named: 3 per worker, the first two restarted.
  const std::string oom = "was killed by SIGKILL (probably out of memory: peak RSS ";
  EXPECT_EQ(count(out, oom), 6) << out;
  for (const std::string w : {"local0", "local1"}) {
    EXPECT_EQ(count(out, "worker " + w + " " + oom), 3) << w << "\n" << out;
    EXPECT_TRUE(std::regex_search(
        out, std::regex("worker " + w + " was killed by SIGKILL [^\n]*; restarting in 1 s\n")))
        << w << "\n"
        << out;
    EXPECT_TRUE(std::regex_search(
        out, std::regex("worker " + w + " was killed by SIGKILL [^\n]*; restarting in 2 s\n")))
        << w << "\n"
        << out;
    EXPECT_TRUE(
        std::regex_search(out, std::regex("worker " + w +
                                          " was killed by SIGKILL [^\n]*; not restarting it: it "
                                          "died the same way 3 times in a row\n")))
        << w << "\n"
        << out;
  }
  EXPECT_EQ(count(out, "restarting in 4 s"), 0) << out;
  // The trainer was stopped, not left to wait: it drained and checkpointed.
  EXPECT_NE(out.find("every rollout worker is gone: the last, local"), std::string::npos) << out;
  EXPECT_NE(out.find("; stopping the trainer"), std::string::npos) << out;
  EXPECT_NE(out.find("stopped: version"), std::string::npos) << out;
  EXPECT_EQ(out.find("groups ready after"), std::string::npos) << "the trainer timed out\n" << out;
  // The last line says why the run ended.
  std::smatch last;
  ASSERT_TRUE(std::regex_search(
      out, last,
      std::regex(R"(relay run: every rollout worker is gone: the last, local[01], died the same )"
                 R"(way 3 times in a row \(killed by SIGKILL, probably out of memory, peak RSS )"
                 R"([0-9.]+ (KiB|MiB|GiB)\)\n$)")))
      << out;
}

// `relay run` with trainer.world_size 2: two relay-trainer processes that
// rendezvous through MASTER_ADDR/MASTER_PORT, split each batch and
// all-reduce the gradients. Both take part in the warm start and every RL
// step, and hold the same weights, bit for bit, when rank 0 stops them.
TEST_F(ProcessTest, RelayRunWithTwoTrainerRanksKeepsThemIdentical) {
  const std::string config = std::string(RELAY_SOURCE_DIR) + "/configs/arith.yaml";
  auto run = start(
      {RELAY_CLI_PATH, "run", config, "trainer.world_size=2", "rollout.workers=1",
       "experiment.steps=3", "experiment.groups_per_step=4", "rollout.n=4",
       "experiment.warm_start.sft_steps=5", "eval.prompts=0", "experiment.output_dir=" + base_},
      base_ + "/run.log");
  ASSERT_EQ(run->wait(240s), 0) << run->output();
  const std::string out = run->output();
  EXPECT_NE(out.find("done: version 8, step 3 of 3"), std::string::npos) << out;
  EXPECT_NE(out.find("trainer rank 1: stopped by rank 0 after 8 steps (0 failed)"),
            std::string::npos)
      << out;
  std::smatch m0, m1;
  ASSERT_TRUE(std::regex_search(out, m0, std::regex("trainer rank 0: weights digest ([0-9a-f]+)")))
      << out;
  ASSERT_TRUE(std::regex_search(out, m1, std::regex("trainer rank 1: weights digest ([0-9a-f]+)")))
      << out;
  EXPECT_EQ(m0[1].str(), m1[1].str()) << "the ranks' weights differ";
  // Only rank 0 serves (one "serving on port" line) and writes the run.
  EXPECT_EQ(registrations(out), 1) << out;
  size_t serving = 0;
  for (size_t at = out.find("serving on port"); at != std::string::npos;
       at = out.find("serving on port", at + 1)) {
    ++serving;
  }
  EXPECT_EQ(serving, 1u) << out;
  EXPECT_EQ(rl_steps(base_ + "/arith/metrics.jsonl"), 3);
}

// trainer.sharding=optimizer across processes: two ranks each hold half of
// AdamW's state and write the whole of it into their checkpoints (rank 1
// sends its part to rank 0), which three sharded ranks, then one replicated
// trainer, resume.
TEST_F(ProcessTest, ShardedOptimizerStateResumesUnderOtherWorldSizes) {
  const std::string config = std::string(RELAY_SOURCE_DIR) + "/configs/arith.yaml";
  const std::vector<std::string> common = {"rollout.workers=1", "experiment.groups_per_step=4",
                                           "rollout.n=4",       "experiment.warm_start.sft_steps=5",
                                           "eval.prompts=0",    "experiment.output_dir=" + base_};
  auto run_with = [&](const std::vector<std::string>& extra, const std::string& log) {
    return relay_run(config, common, extra, log);
  };
  std::string out = run_with(
      {"trainer.world_size=2", "trainer.sharding=optimizer", "experiment.steps=2"}, "run1.log");
  EXPECT_NE(out.find("done: version 7, step 2 of 2"), std::string::npos) << out;
  EXPECT_NE(out.find("trainer rank 1: stopped by rank 0 after 7 steps (0 failed)"),
            std::string::npos)
      << out;
  out = run_with(
      {"trainer.world_size=3", "trainer.sharding=optimizer", "experiment.steps=3", "--resume"},
      "run2.log");
  EXPECT_NE(out.find("resumed from"), std::string::npos) << out;
  EXPECT_NE(out.find("done: version 8, step 3 of 3"), std::string::npos) << out;
  std::smatch m0, m2;
  ASSERT_TRUE(std::regex_search(out, m0, std::regex("trainer rank 0: weights digest ([0-9a-f]+)")))
      << out;
  ASSERT_TRUE(std::regex_search(out, m2, std::regex("trainer rank 2: weights digest ([0-9a-f]+)")))
      << out;
  EXPECT_EQ(m0[1].str(), m2[1].str()) << "the ranks' weights differ";
  out = run_with({"experiment.steps=4", "--resume"}, "run3.log");
  EXPECT_NE(out.find("done: version 9, step 4 of 4"), std::string::npos) << out;
  EXPECT_EQ(rl_steps(base_ + "/arith/metrics.jsonl"), 4);
}

// The RL metrics of each step in a run's metrics.jsonl.
std::map<int64_t, nlohmann::json> rl_metrics(const std::string& path) {
  std::map<int64_t, nlohmann::json> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    nlohmann::json j = nlohmann::json::parse(line);
    if (j["phase"] == "rl") out[j["step"].get<int64_t>()] = j;
  }
  return out;
}

// trainer.sharding: full across processes: two ranks keep only their
// shards of the weights, through the warm start (an SFT trainer, then the RL
// trainer over what it left; it trains as two unsharded ranks do) and a KL
// reference sharded too; rank 0 publishes and checkpoints the whole weights
// (an ordinary model directory), and the run resumes on three fully sharded
// ranks, then on one.
TEST_F(ProcessTest, FullShardingWarmStartsTrainsAndResumesUnderOtherWorldSizes) {
  const std::string config = std::string(RELAY_SOURCE_DIR) + "/configs/arith.yaml";
  const std::vector<std::string> common = {"rollout.workers=1",
                                           "experiment.groups_per_step=4",
                                           "rollout.n=4",
                                           "experiment.warm_start.sft_steps=3",
                                           "eval.prompts=0",
                                           "trainer.kl_coef=0.01",
                                           "experiment.output_dir=" + base_};
  auto run_with = [&](const std::vector<std::string>& extra, const std::string& log) {
    return relay_run(config, common, extra, log);
  };
  std::string out =
      run_with({"trainer.world_size=2", "trainer.sharding=full", "experiment.steps=2"}, "run1.log");
  EXPECT_NE(out.find("done: version 5, step 2 of 2"), std::string::npos) << out;
  EXPECT_NE(out.find("trainer rank 1: stopped by rank 0 after 5 steps (0 failed)"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("trainer rank 1: weights sharded"), std::string::npos) << out;
  const std::string step2 = base_ + "/arith/checkpoints/step_000002";
  EXPECT_TRUE(fs::exists(step2 + "/config.json"));
  EXPECT_TRUE(fs::exists(step2 + "/model.safetensors"));
  const std::map<int64_t, nlohmann::json> first = rl_metrics(base_ + "/arith/metrics.jsonl");
  ASSERT_EQ(first.count(2), 1u);
  // Rank 0 keeps its shard: about half of the model rank 0 checkpoints.
  const double shard_bytes = first.at(2)["memory/weights_gb"].get<double>() * (1 << 30);
  EXPECT_GT(shard_bytes, 0);
  EXPECT_LT(shard_bytes, 0.6 * static_cast<double>(fs::file_size(step2 + "/model.safetensors")));
  // The warm start trains as two unsharded ranks do (the gradients' sums
  // differ in order only).
  ASSERT_NE(relay_run(config, common,
                      {"trainer.world_size=2", "experiment.steps=1", "experiment.name=arith_none"},
                      "none.log")
                .find("done: version 4, step 1 of 1"),
            std::string::npos);
  auto sft = [](const std::string& path) {
    std::vector<nlohmann::json> out;
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line)) {
      nlohmann::json j = nlohmann::json::parse(line);
      if (j["phase"] == "sft") out.push_back(j);
    }
    return out;
  };
  const auto sharded = sft(base_ + "/arith/metrics.jsonl");
  const auto unsharded = sft(base_ + "/arith_none/metrics.jsonl");
  ASSERT_EQ(sharded.size(), 3u);
  ASSERT_EQ(unsharded.size(), 3u);
  for (size_t k = 0; k < 3; ++k) {
    for (const char* key : {"sft_loss", "grad_norm"}) {
      const double a = sharded[k][key].get<double>(), b = unsharded[k][key].get<double>();
      EXPECT_NEAR(a, b, 1e-5 * std::abs(b)) << key << " at warm-start step " << k + 1;
    }
  }

  out =
      run_with({"trainer.world_size=3", "trainer.sharding=full", "experiment.steps=3", "--resume"},
               "run2.log");
  EXPECT_NE(out.find("resumed from"), std::string::npos) << out;
  EXPECT_NE(out.find("done: version 6, step 3 of 3"), std::string::npos) << out;
  out = run_with({"experiment.steps=4", "--resume"}, "run3.log");
  EXPECT_NE(out.find("done: version 7, step 4 of 4"), std::string::npos) << out;
  EXPECT_EQ(rl_steps(base_ + "/arith/metrics.jsonl"), 4);
}

// trainer.lora across processes: two trainer ranks train adapters on a
// frozen base (a fresh model.init model here, so the run saves it as
// checkpoints/base; its warm start trains the adapters too), the worker
// receives each version's adapters alone, checkpoints are PEFT adapter
// directories naming that base, a resumed run loads one, and `relay export
// --merge` turns it into a model directory that scores as the adapter does.
TEST_F(ProcessTest, LoraRunShipsAdaptersWritesPeftCheckpointsAndResumes) {
  const std::string config = std::string(RELAY_SOURCE_DIR) + "/configs/arith_lora.yaml";
  const std::vector<std::string> common = {"model.path=",
                                           "rollout.workers=1",
                                           "experiment.groups_per_step=4",
                                           "rollout.n=4",
                                           "experiment.warm_start.sft_steps=3",
                                           "eval.prompts=0",
                                           "trainer.kl_coef=0.01",
                                           "experiment.output_dir=" + base_};
  auto run_with = [&](const std::vector<std::string>& extra, const std::string& log) {
    return relay_run(config, common, extra, log);
  };
  std::string out = run_with({"trainer.world_size=2", "experiment.steps=2"}, "run1.log");
  EXPECT_NE(out.find("done: version 5, step 2 of 2"), std::string::npos) << out;
  std::smatch m0, m1;
  ASSERT_TRUE(std::regex_search(out, m0, std::regex("trainer rank 0: weights digest ([0-9a-f]+)")))
      << out;
  ASSERT_TRUE(std::regex_search(out, m1, std::regex("trainer rank 1: weights digest ([0-9a-f]+)")))
      << out;
  EXPECT_EQ(m0[1].str(), m1[1].str()) << "the ranks' weights differ";

  const std::string run = base_ + "/arith_lora";
  const std::string step2 = run + "/checkpoints/step_000002";
  EXPECT_TRUE(fs::exists(step2 + "/adapter_config.json"));
  EXPECT_TRUE(fs::exists(step2 + "/adapter_model.safetensors"));
  EXPECT_FALSE(fs::exists(step2 + "/config.json")) << "a LoRA checkpoint holds no base weights";
  EXPECT_TRUE(fs::exists(run + "/checkpoints/base/config.json"));
  EXPECT_FALSE(fs::exists(run + "/checkpoints/reference")) << "the base is the reference";
  std::ifstream cfg(step2 + "/adapter_config.json");
  const nlohmann::json adapter = nlohmann::json::parse(cfg);
  EXPECT_EQ(adapter["base_model_name_or_path"].get<std::string>(),
            fs::absolute(run + "/checkpoints/base").lexically_normal().string());
  EXPECT_EQ(adapter["r"], 8);
  // Each version ships the adapters: a fraction of the model's bytes.
  const auto metrics = rl_metrics(run + "/metrics.jsonl");
  ASSERT_EQ(metrics.size(), 2u);
  int64_t model_bytes = 0;
  for (const auto& e : fs::directory_iterator(run + "/checkpoints/base")) {
    if (e.path().extension() == ".safetensors") model_bytes += fs::file_size(e.path());
  }
  const double version_mb = metrics.at(2)["weights/version_mb"].get<double>();
  EXPECT_GT(version_mb, 0);
  EXPECT_LT(version_mb * (1 << 20), 0.5 * static_cast<double>(model_bytes)) << version_mb;
  EXPECT_GT(metrics.at(2)["kl_ref"].get<double>(), 0) << "the adapters moved off the base";

  out = run_with({"experiment.steps=3", "--resume"}, "run2.log");
  EXPECT_NE(out.find("resumed from " + step2), std::string::npos) << out;
  EXPECT_NE(out.find("done: version 6, step 3 of 3"), std::string::npos) << out;
  EXPECT_EQ(rl_steps(run + "/metrics.jsonl"), 3);

  // export: refused without --merge; with it, a model directory whose
  // log-probs are the adapter's.
  const std::string step3 = run + "/checkpoints/step_000003";
  auto refused =
      start({RELAY_CLI_PATH, "export", step3, "--out", base_ + "/merged"}, base_ + "/export0.log");
  EXPECT_EQ(refused->wait(60s), 1);
  EXPECT_NE(refused->output().find("pass --merge"), std::string::npos) << refused->output();
  auto exported = start({RELAY_CLI_PATH, "export", step3, "--out", base_ + "/merged", "--merge"},
                        base_ + "/export.log");
  ASSERT_EQ(exported->wait(60s), 0) << exported->output();
  EXPECT_TRUE(fs::exists(base_ + "/merged/config.json"));
  EXPECT_TRUE(fs::exists(base_ + "/merged/relay_tokenizer.json"));
  auto score = [&](const std::string& model, const std::string& log) {
    auto s =
        start({RELAY_CLI_PATH, "score", "--model", model, "--ids", "1,12,15,13,14,2,20", "--json"},
              base_ + "/" + log);
    EXPECT_EQ(s->wait(60s), 0) << s->output();
    const std::string text = s->output();
    return nlohmann::json::parse(text.substr(text.find('{')))["logprobs"];
  };
  const nlohmann::json merged = score(base_ + "/merged", "score_merged.log");
  const nlohmann::json side = score(step3, "score_adapter.log");
  const nlohmann::json base = score(run + "/checkpoints/base", "score_base.log");
  ASSERT_EQ(merged.size(), side.size());
  double moved = 0;
  for (size_t i = 0; i < merged.size(); ++i) {
    EXPECT_NEAR(merged[i].get<double>(), side[i].get<double>(), 1e-4) << i;
    moved = std::max(moved, std::fabs(side[i].get<double>() - base[i].get<double>()));
  }
  EXPECT_GT(moved, 1e-4) << "the adapter changed nothing";
}

// What relay-trainer says when resuming meets a damaged checkpoint: an
// emptied newest directory is a warning naming it and what it lacks (the
// run resumes from the one before); a truncated trainer_state.pt is one
// line naming the file, without LibTorch's stack trace; and when nothing is
// usable, --resume's error lists what it tried. Zero RL steps: a run only
// writes checkpoint zero, and a resumed one loads it and stops.
// Rewrites stored group `seq`'s first reward in place (raw RocksDB, as a
// build with looser checks, or a bit flip, would have left it): finite as a
// double, infinite as the float the trainer trains on.
void poison_stored_group(const std::string& store_dir, uint64_t seq) {
  rocksdb::DB* raw = nullptr;
  ASSERT_TRUE(rocksdb::DB::Open(rocksdb::Options(), store_dir, &raw).ok());
  std::unique_ptr<rocksdb::DB> db(raw);
  std::string key = "g/";
  for (int i = 7; i >= 0; --i) key.push_back(static_cast<char>((seq >> (8 * i)) & 0xff));
  std::string bytes;
  ASSERT_TRUE(db->Get(rocksdb::ReadOptions(), key, &bytes).ok());
  v1::StoredGroup rec;
  ASSERT_TRUE(rec.ParseFromString(bytes));
  rec.mutable_group()->mutable_trajectories(0)->set_reward(1e300);
  rocksdb::WriteOptions w;
  w.sync = true;
  ASSERT_TRUE(db->Put(w, key, rec.SerializeAsString()).ok());
}

// The reported failure: a group the trainer cannot train on is READY when a
// checkpoint is written, and every --resume met it again and died. Now the
// resumed trainer quarantines it (REJECTED in the store, logged by id) and
// finishes the run; a second resume from the same checkpoint does not meet
// it again.
TEST_F(ProcessTest, APoisonGroupReadyAtACheckpointDoesNotStopTheResumedRun) {
  const std::string checkpoints = run_dir() + "/checkpoints";
  // The victim must be a group the rewind to step 2 makes READY again: one
  // that had arrived when step 2's checkpoint was written (seq below its
  // store_next_seq) and was trained on later or never. Whether the worker
  // was that far ahead is timing (under load it may not have been), so the
  // first run is repeated, in a fresh directory, until it was. The worker
  // keeps 16 groups in flight (four steps' worth): its groups decode
  // together and arrive close together, so with 8 (two steps' worth) steps 1
  // and 2 could take every group that had arrived, and a full LibTorch 2.6
  // ctest run on a loaded 2-core VM saw no victim in eight attempts (with 4,
  // a CI run saw none in four).
  uint64_t victim = 0;
  std::string victim_id;
  for (int attempt = 0; attempt < 8 && victim == 0; ++attempt) {
    fs::remove_all(run_dir());
    const int port = free_port();
    auto trainer = start(trainer_args(port, 3), base_ + "/trainer1.log");
    std::vector<std::string> ahead = worker_args(port, "w");
    ahead.push_back("rollout.groups_in_flight=16");
    auto worker = start(ahead, base_ + "/w1.log");
    ASSERT_EQ(trainer->wait(180s), 0) << trainer->output();
    EXPECT_EQ(worker->wait(60s), 0) << worker->output();
    // Resume from step 2 (drop step 3's checkpoint).
    fs::remove_all(checkpoints + "/" + step_dir(3));
    ASSERT_TRUE(fs::exists(checkpoints + "/" + step_dir(2)));
    auto info = trainer::read_checkpoint(checkpoints + "/" + step_dir(2));
    ASSERT_TRUE(info.ok()) << info.status();
    store::StoreOptions o;
    o.path = run_dir() + "/store";
    o.read_only = true;
    auto st = store::RolloutStore::open(o).value();
    auto scanned = st->scan();
    ASSERT_TRUE(scanned.ok()) << scanned.status();
    // The oldest such group, which the resumed step 3 takes first.
    for (const store::StoredGroup& g : *scanned) {
      const bool restored = g.state == store::GroupState::kReady ||
                            (g.state == store::GroupState::kConsumed && g.consumed_version >= 2);
      if (restored && g.seq < info->store_next_seq && (victim == 0 || g.seq < victim)) {
        victim = g.seq;
        victim_id = g.group.group_id;
      }
    }
  }
  ASSERT_GT(victim, 0u) << "in eight runs, no group had arrived by step 2's checkpoint";
  poison_stored_group(run_dir() + "/store", victim);

  auto resume = [&](int steps, const std::string& log) {
    const int p = free_port();
    std::vector<std::string> args = trainer_args(p, steps);
    args.push_back("--resume");
    auto trainer = start(args, base_ + "/" + log + ".log");
    auto worker = start(worker_args(p, "w"), base_ + "/" + log + ".w.log");
    EXPECT_EQ(trainer->wait(180s), 0) << trainer->output();
    EXPECT_EQ(worker->wait(60s), 0) << worker->output();
    return trainer->output();
  };
  const std::string first = resume(4, "trainer2");
  EXPECT_NE(first.find("resumed from " + checkpoints + "/" + step_dir(2)), std::string::npos)
      << first;
  EXPECT_NE(first.find("group '" + victim_id + "' (store seq " + std::to_string(victim) +
                       ") quarantined"),
            std::string::npos)
      << first;
  EXPECT_GE(rl_steps(run_dir() + "/metrics.jsonl"), 4);
  {
    store::StoreOptions o;
    o.path = run_dir() + "/store";
    o.read_only = true;
    auto st = store::RolloutStore::open(o).value();
    const store::StoredGroup g = st->get(victim).value();
    EXPECT_EQ(g.state, store::GroupState::kRejected);
    EXPECT_NE(g.reject_reason.find("reward: 1e+300"), std::string::npos) << g.reject_reason;
  }
  // Again from step 2: the quarantined group stays out of the rewind.
  fs::remove_all(checkpoints + "/" + step_dir(4));
  fs::remove_all(checkpoints + "/" + step_dir(3));
  const std::string second = resume(4, "trainer3");
  EXPECT_NE(second.find("resumed from " + checkpoints + "/" + step_dir(2)), std::string::npos)
      << second;
  EXPECT_EQ(second.find("quarantined"), std::string::npos) << second;
}

TEST_F(ProcessTest, ResumeExplainsDamagedCheckpoints) {
  int n = 0;
  auto trainer_run = [&](bool resume) {
    std::vector<std::string> args = trainer_args(free_port(), 0);
    args.push_back("eval.prompts=0");
    if (resume) args.push_back("--resume");
    auto t = start(args, base_ + "/trainer" + std::to_string(++n) + ".log");
    const int code = t->wait(120s);
    return std::make_pair(code, t->output());
  };
  auto [code, out] = trainer_run(false);
  ASSERT_EQ(code, 0) << out;
  const std::string checkpoints = run_dir() + "/checkpoints";
  const std::string zero = checkpoints + "/" + step_dir(0);
  ASSERT_TRUE(fs::exists(zero + "/trainer_state.pt")) << out;

  fs::create_directories(checkpoints + "/" + step_dir(1));
  std::tie(code, out) = trainer_run(true);
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("warning: skipping checkpoint " + checkpoints + "/" + step_dir(1) +
                     ": no checkpoint.json (the directory is empty); resuming from " + zero + "\n"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("resumed from " + zero), std::string::npos) << out;

  const std::string state = zero + "/trainer_state.pt";
  fs::resize_file(state, fs::file_size(state) / 2);
  std::tie(code, out) = trainer_run(true);
  EXPECT_EQ(code, 1) << out;
  EXPECT_NE(out.find("relay-trainer: " + state + ": truncated or corrupt ("), std::string::npos)
      << out;
  EXPECT_EQ(out.find("frame #"), std::string::npos) << out;
  EXPECT_EQ(out.find("Exception raised from"), std::string::npos) << out;

  fs::remove(state);
  std::tie(code, out) = trainer_run(true);
  EXPECT_EQ(code, 1) << out;
  EXPECT_NE(
      out.find("relay-trainer: --resume: " + checkpoints + " holds no usable checkpoint; tried " +
               checkpoints + "/" + step_dir(1) + ": no checkpoint.json (the directory is empty); " +
               zero + ": no trainer_state.pt\n"),
      std::string::npos)
      << out;
}

// Stopping a run and resuming it from its checkpoint continues exactly: the
// metrics of the steps after the checkpoint match those of a run that never
// stopped, on the same seeds. Synchronous (max_staleness 0) with one worker,
// so each step's batch is determined by the prompt stream and the weights.
// Wall-clock metrics (time/, throughput/, store waits) are left out; the
// rest must agree to float rounding (the engine may batch the re-leased
// prompts differently, which moves logits in the last bits).
TEST_F(ProcessTest, ResumedRunRepeatsTheStepsOfAnUninterruptedOne) {
  // The main job's task and model after a short warm start: rewards are
  // mixed, so advantages, losses and gradients are not all zero.
  const std::vector<std::string> common = {"experiment.groups_per_step=4",
                                           "experiment.checkpoint_every=2",
                                           "experiment.warm_start.sft_steps=30",
                                           "eval.prompts=0",
                                           "rollout.n=4",
                                           "rollout.workers=1",
                                           "trainer.max_staleness=0"};
  const std::string config = std::string(RELAY_SOURCE_DIR) + "/configs/arith.yaml";
  auto trainer_run = [&](const std::string& name, int steps, bool resume, const std::string& log) {
    const int port = free_port();
    std::vector<std::string> args = {RELAY_TRAINER_PATH,
                                     config,
                                     "experiment.output_dir=" + base_,
                                     "experiment.name=" + name,
                                     "experiment.steps=" + std::to_string(steps),
                                     "--listen",
                                     "127.0.0.1:" + std::to_string(port)};
    args.insert(args.end(), common.begin(), common.end());
    if (resume) args.push_back("--resume");
    std::vector<std::string> wargs = {RELAY_ROLLOUT_PATH, config,
                                      "--trainer",        "127.0.0.1:" + std::to_string(port),
                                      "--name",           "w"};
    wargs.insert(wargs.end(), common.begin(), common.end());
    auto trainer = start(args, base_ + "/" + log + ".trainer.log");
    auto worker = start(wargs, base_ + "/" + log + ".worker.log");
    EXPECT_EQ(trainer->wait(180s), 0) << trainer->output();
    EXPECT_EQ(worker->wait(90s), 0) << worker->output();
    return trainer->output();
  };
  trainer_run("straight", 5, false, "straight");
  trainer_run("stopped", 2, false, "first");
  const std::string resumed = trainer_run("stopped", 5, true, "second");
  EXPECT_NE(resumed.find("resumed from " + base_ + "/stopped/checkpoints/step_000002"),
            std::string::npos)
      << resumed;

  const auto a = rl_metrics(base_ + "/straight/metrics.jsonl");
  const auto b = rl_metrics(base_ + "/stopped/metrics.jsonl");
  ASSERT_EQ(a.size(), 5u);
  ASSERT_EQ(b.size(), 5u);
  int compared = 0;
  for (int64_t step = 1; step <= 5; ++step) {
    for (const auto& [key, value] : a.at(step).items()) {
      if (!value.is_number() || key.rfind("time/", 0) == 0 || key.rfind("throughput/", 0) == 0 ||
          key.rfind("store/", 0) == 0 || key.rfind("memory/", 0) == 0) {
        continue;
      }
      ASSERT_TRUE(b.at(step).contains(key)) << key;
      const double x = value.get<double>(), y = b.at(step)[key].get<double>();
      if (std::isnan(x)) {
        EXPECT_TRUE(std::isnan(y)) << "step " << step << " " << key;
        continue;
      }
      EXPECT_NEAR(x, y, 1e-4 * std::max(1.0, std::fabs(x))) << "step " << step << " " << key;
      ++compared;
    }
  }
  EXPECT_GT(compared, 5 * 20) << "the metrics compared are the trainer's, not a handful";
  // The comparison can fail: at that tolerance consecutive steps differ.
  int differ = 0;
  for (const char* key : {"loss", "pg_loss", "grad_norm", "reward/mean", "entropy",
                          "response_length/mean", "advantages/std"}) {
    const double x = a.at(3)[key].get<double>(), y = a.at(4)[key].get<double>();
    if (std::fabs(x - y) > 1e-4 * std::max(1.0, std::fabs(x))) ++differ;
  }
  EXPECT_GE(differ, 4);
}

}  // namespace
}  // namespace relay
