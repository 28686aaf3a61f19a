#pragma once

// The processes of one `relay run` on this machine: relay-trainer's ranks
// and the rollout workers, started from a RunPlan and supervised until the
// trainer exits (a worker that dies is restarted, bin/supervise.h decides
// when not). run_command.cc makes the plan and reports how the run ended.

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "bin/supervise.h"
#include "relay/common/status.h"

namespace relay::cli {

// What relay run starts, worked out from its flags and the config.
struct RunPlan {
  std::string bin_dir;               // where relay-trainer and relay-rollout are
  std::vector<std::string> common;   // what every process gets: config, overrides, --model
  std::vector<std::string> trainer;  // relay-trainer's argv
  std::string port_file;             // where the trainer writes its port once serving
  std::string core_share;            // run.core_share when relay run set it (removed at the end)
  int workers = 0;
  int ranks = 1;  // trainer.data_parallel.world_size
  // ranks > 1: the torchrun variables every rank shares (trainer.rendezvous,
  // when set, wins over MASTER_ADDR/MASTER_PORT in relay-trainer).
  std::vector<std::string> rank_env;

  // rank_env plus RANK and LOCAL_RANK.
  std::vector<std::string> env_of_rank(int rank) const;
  // relay-rollout's argv for worker i of a trainer serving on `port`.
  std::vector<std::string> worker_args(int i, const std::string& port) const;
  static std::string worker_name(int i);  // "local<i>"
};

// relay-trainer's ranks. Rank 0 serves and writes the run; the others take
// the same arguments, open no port, write nothing to the run directory, and
// exit when rank 0 stops them.
class TrainerRanks {
 public:
  // Rank 0, then the others; on failure, stops those that started.
  Status start(const RunPlan& plan);
  pid_t leader() const { return leader_; }
  // The port rank 0 writes to `port_file` once it serves (after any warm
  // start). CANCELLED when `interrupted` says so first, INTERNAL when rank 0
  // dies first (the other ranks are stopped then).
  StatusOr<std::string> wait_for_port(const std::string& port_file,
                                      const std::function<bool()>& interrupted);
  // Waits up to `grace` for each of the other ranks to exit (rank 0 stops
  // them on its way out), kills those that do not; the worst exit code.
  int stop_followers(std::chrono::milliseconds grace);

 private:
  pid_t leader_ = -1;
  std::vector<pid_t> followers_;
};

// One rollout worker, as the supervisor sees it.
struct Worker {
  pid_t pid = -1;  // -1 while not running
  WorkerState state = WorkerState::kRunning;
  DeathRecord deaths;
  std::chrono::steady_clock::time_point started_at;
  std::chrono::steady_clock::time_point restart_at;  // while kRestarting
};

// The rollout workers, each restarted when it dies, within RestartPolicy.
class WorkerPool {
 public:
  WorkerPool(const RunPlan& plan, const std::string& port);
  // On failure, stops those that started.
  Status start();
  // One look at every worker. True once none is left, with why in
  // gone_reason() (the last worker given up on, and how it died).
  bool supervise(std::chrono::steady_clock::time_point now);
  std::string gone_reason() const;
  // SIGTERM each (it gives its leases back), SIGKILL after 10 s.
  void stop();

 private:
  const RestartPolicy policy_;
  std::vector<Worker> workers_;
  std::vector<std::string> names_;               // "local<i>"
  std::vector<std::vector<std::string>> argvs_;  // each worker's relay-rollout command
  std::string last_given_up_;
};

// How the run ended: the trainer's exit, and why it was stopped for want of
// workers if it was.
struct RunEnd {
  ChildExit trainer;
  std::string workers_gone;
};

// Supervises until rank 0 exits. A worker that dies while the trainer runs
// is started again (its leases expire and are re-leased by the trainer)
// until it has died the same way 3 times in a row or used up its restarts.
// Once no worker is left, the trainer is stopped at once: it would only wait
// services.group_wait_s for groups nobody makes. When `interrupted` says so,
// the workers are stopped first (they give their leases back), then the
// trainer (it checkpoints).
RunEnd supervise(TrainerRanks& ranks, WorkerPool& pool, const std::function<bool()>& interrupted);

}  // namespace relay::cli
