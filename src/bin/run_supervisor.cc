// The processes of one `relay run` (bin/run_supervisor.h).

#include "bin/run_supervisor.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "bin/child_process.h"

namespace relay::cli {

std::vector<std::string> RunPlan::env_of_rank(int rank) const {
  std::vector<std::string> env = rank_env;
  if (ranks > 1) {
    env.push_back(absl::StrCat("RANK=", rank));
    env.push_back(absl::StrCat("LOCAL_RANK=", rank));
  }
  return env;
}

std::vector<std::string> RunPlan::worker_args(int i, const std::string& port) const {
  std::vector<std::string> w = {bin_dir + "/relay-rollout"};
  w.insert(w.end(), common.begin(), common.end());
  for (const std::string& a :
       std::vector<std::string>{"--trainer", "127.0.0.1:" + port, "--name", worker_name(i)}) {
    w.push_back(a);
  }
  return w;
}

std::string RunPlan::worker_name(int i) { return absl::StrCat("local", i); }

Status TrainerRanks::start(const RunPlan& plan) {
  RELAY_ASSIGN_OR_RETURN(leader_, spawn(plan.trainer, plan.env_of_rank(0)));
  for (int rank = 1; rank < plan.ranks; ++rank) {
    StatusOr<pid_t> pid = spawn(plan.trainer, plan.env_of_rank(rank));
    if (!pid.ok()) {
      stop_child(leader_, std::chrono::seconds(30));
      stop_followers(std::chrono::seconds(5));
      return pid.status();
    }
    followers_.push_back(*pid);
  }
  return OkStatus();
}

StatusOr<std::string> TrainerRanks::wait_for_port(const std::string& port_file,
                                                  const std::function<bool()>& interrupted) {
  std::string port;
  for (;;) {
    if (std::ifstream in(port_file); in) std::getline(in, port);
    if (!port.empty()) break;
    if (std::optional<ChildExit> e = poll_exit(leader_)) {
      stop_followers(std::chrono::seconds(5));
      return InternalError(absl::StrCat("relay-trainer ", describe_exit(*e), " before serving"));
    }
    if (interrupted()) return CancelledError("interrupted before the trainer served");
    // A file, not an event: the trainer is another process.
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::error_code ec;
  std::filesystem::remove(port_file, ec);
  return port;
}

int TrainerRanks::stop_followers(std::chrono::milliseconds grace) {
  int worst = 0;
  for (size_t i = 0; i < followers_.size(); ++i) {
    const auto deadline = std::chrono::steady_clock::now() + grace;
    std::optional<ChildExit> e;
    while (!(e = poll_exit(followers_[i])) && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (!e) e = stop_child(followers_[i], std::chrono::milliseconds(0));
    if (shell_code(*e) != 0) {
      std::fprintf(stderr, "relay run: trainer rank %zu %s\n", i + 1, describe_exit(*e).c_str());
    }
    worst = std::max(worst, shell_code(*e));
  }
  followers_.clear();
  return worst;
}

namespace {

Status start_worker(Worker& w, const std::vector<std::string>& args) {
  RELAY_ASSIGN_OR_RETURN(w.pid, spawn(args));
  w.state = WorkerState::kRunning;
  w.started_at = std::chrono::steady_clock::now();
  return OkStatus();
}

// One look at worker `name`: reaps it if it ended and decides whether it is
// started again, or starts it when its backoff is over. When it gives up on
// the worker, returns why, to end a sentence that starts with the name
// ("died the same way 3 times in a row (killed by SIGKILL, ...)").
std::string supervise_worker(Worker& w, const std::string& name,
                             std::chrono::steady_clock::time_point now, const RestartPolicy& policy,
                             const std::vector<std::string>& args) {
  if (w.state == WorkerState::kRestarting && now >= w.restart_at) {
    if (Status st = start_worker(w, args); !st.ok()) {
      std::fprintf(stderr, "relay run: %s\n", std::string(st.message()).c_str());
      w.restart_at = now + std::chrono::seconds(30);
    }
    return "";
  }
  if (w.state != WorkerState::kRunning) return "";
  const std::optional<ChildExit> e = poll_exit(w.pid);
  if (!e) return "";
  w.pid = -1;
  // 0 is a worker that was told to stop or whose trainer went away for
  // good; anything else (a crash, a kill) is restarted.
  if (shell_code(*e) == 0) {
    w.state = WorkerState::kFinished;
    return "";
  }
  const auto uptime = std::chrono::duration_cast<std::chrono::milliseconds>(now - w.started_at);
  const RestartDecision decision = record_death(w.deaths, *e, uptime, policy);
  if (decision == RestartDecision::kRestart) {
    const std::chrono::seconds backoff = restart_backoff(w.deaths.restarts - 1);
    std::fprintf(stderr, "relay run: worker %s %s; restarting in %lld s\n", name.c_str(),
                 describe_exit(*e).c_str(), static_cast<long long>(backoff.count()));
    w.state = WorkerState::kRestarting;
    w.restart_at = now + backoff;
    return "";
  }
  const std::string why = give_up_reason(decision, w.deaths, policy);
  std::fprintf(stderr, "relay run: worker %s %s; not restarting it: it %s\n", name.c_str(),
               describe_exit(*e).c_str(), why.c_str());
  w.state = WorkerState::kGivenUp;
  return absl::StrCat(why, " (", describe_exit_briefly(w.deaths.last), ")");
}

}  // namespace

WorkerPool::WorkerPool(const RunPlan& plan, const std::string& port) : workers_(plan.workers) {
  for (int i = 0; i < plan.workers; ++i) {
    names_.push_back(RunPlan::worker_name(i));
    argvs_.push_back(plan.worker_args(i, port));
  }
}

Status WorkerPool::start() {
  for (size_t i = 0; i < workers_.size(); ++i) {
    if (Status st = start_worker(workers_[i], argvs_[i]); !st.ok()) {
      stop();
      return st;
    }
  }
  return OkStatus();
}

bool WorkerPool::supervise(std::chrono::steady_clock::time_point now) {
  std::vector<WorkerState> states;
  for (size_t i = 0; i < workers_.size(); ++i) {
    if (std::string why = supervise_worker(workers_[i], names_[i], now, policy_, argvs_[i]);
        !why.empty()) {
      last_given_up_ = absl::StrCat("the last, ", names_[i], ", ", why);
    }
    states.push_back(workers_[i].state);
  }
  return every_worker_gone(states);
}

std::string WorkerPool::gone_reason() const {
  return absl::StrCat("every rollout worker is gone: ", last_given_up_);
}

void WorkerPool::stop() {
  for (Worker& w : workers_) {
    if (w.pid > 0) stop_child(w.pid, std::chrono::seconds(10));
    w.pid = -1;
  }
}

RunEnd supervise(TrainerRanks& ranks, WorkerPool& pool, const std::function<bool()>& interrupted) {
  for (;;) {
    if (std::optional<ChildExit> e = poll_exit(ranks.leader())) return {*e, ""};
    if (interrupted()) {
      // Workers first (they give their leases back), then the trainer (it
      // checkpoints and flushes the store).
      pool.stop();
      return {stop_child(ranks.leader(), std::chrono::seconds(60)), ""};
    }
    if (pool.supervise(std::chrono::steady_clock::now())) {
      // SIGTERM: the trainer stops waiting for groups, checkpoints and exits.
      const std::string why = pool.gone_reason();
      std::fprintf(stderr, "relay run: %s; stopping the trainer\n", why.c_str());
      return {stop_child(ranks.leader(), std::chrono::seconds(60)), why};
    }
    // Children, not events: waitpid has no timeout, so look every 50 ms.
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

}  // namespace relay::cli
