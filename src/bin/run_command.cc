// relay run: relay-trainer and rollout.workers relay-rollout workers on this
// machine as child processes, supervised: the trainer's port is handed to the
// workers, a worker that dies is restarted (unless it died the same way 3
// times in a row; bin/supervise.h), the trainer is stopped once no worker is
// left, the cores are split between the processes, the workers are stopped
// when the trainer ends, and Ctrl-C (or SIGTERM) drains them all: workers
// give their leases back, the trainer checkpoints. With trainer.world_size > 1 it starts that many
// trainer ranks, torchrun-style (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bin/commands.h"
#include "bin/supervise.h"
#include "relay/config/config.h"

extern char** environ;

namespace relay::cli {
namespace {

std::atomic<bool> g_interrupted{false};
void on_signal(int) { g_interrupted = true; }

// The directory this executable lives in: relay-trainer and relay-rollout
// are installed (and built) next to it.
std::string own_dir() {
  std::error_code ec;
  std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string(".") : exe.parent_path().string();
}

// Starts `args` with this process's environment plus `env` ("NAME=value",
// replacing a variable of the same name).
StatusOr<pid_t> spawn(const std::vector<std::string>& args,
                      const std::vector<std::string>& env = {}) {
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view var(*e);
    const bool replaced = std::any_of(env.begin(), env.end(), [&](const std::string& x) {
      const size_t eq = x.find('=');
      return var.substr(0, eq + 1) == std::string_view(x).substr(0, eq + 1);
    });
    if (!replaced) envp.push_back(*e);
  }
  for (const std::string& x : env) envp.push_back(const_cast<char*>(x.c_str()));
  envp.push_back(nullptr);
  pid_t pid = 0;
  const int rc = ::posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), envp.data());
  if (rc != 0) {
    return InternalError(absl::StrCat("cannot start ", args[0], ": ", std::strerror(rc)));
  }
  return pid;
}

// How the child ended, once it has; nullopt while it runs. Reaped with
// wait4() rather than waitpid() for its rusage: the peak RSS says whether a
// SIGKILL was probably the out-of-memory killer.
std::optional<ChildExit> poll_exit(pid_t pid) {
  int status = 0;
  rusage usage{};
  if (::wait4(pid, &status, WNOHANG, &usage) != pid) return std::nullopt;
  return child_exit(status, usage.ru_maxrss);
}

// SIGTERM, then SIGKILL after `grace`; how it ended.
ChildExit stop_child(pid_t pid, std::chrono::milliseconds grace) {
  if (std::optional<ChildExit> e = poll_exit(pid)) return *e;
  ::kill(pid, SIGTERM);
  const auto deadline = std::chrono::steady_clock::now() + grace;
  while (std::chrono::steady_clock::now() < deadline) {
    if (std::optional<ChildExit> e = poll_exit(pid)) return *e;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ::kill(pid, SIGKILL);
  int status = 0;
  rusage usage{};
  ::wait4(pid, &status, 0, &usage);
  ChildExit e = child_exit(status, usage.ru_maxrss);
  e.killed_by_supervisor = e.signaled && e.code == SIGKILL;
  return e;
}

// One rollout worker of relay run, as the supervisor sees it.
struct Worker {
  pid_t pid = -1;  // -1 while not running
  WorkerState state = WorkerState::kRunning;
  DeathRecord deaths;
  std::chrono::steady_clock::time_point started_at;
  std::chrono::steady_clock::time_point restart_at;  // while kRestarting
};

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

int fail(const Status& s) {
  std::fprintf(stderr, "relay run: %s\n", std::string(s.message()).c_str());
  return 1;
}

// A TCP port on 127.0.0.1 that nothing listens on now (the kernel's pick).
StatusOr<int> free_loopback_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  const int err = errno;
  ::close(fd);
  if (!ok) return InternalError(absl::StrCat("cannot pick a loopback port: ", std::strerror(err)));
  return static_cast<int>(ntohs(addr.sin_port));
}

}  // namespace

// Threads for each process when run.threads is 0: the cores split between
// the trainer and the workers, so W + 1 processes do not each start a pool
// the size of the machine. The trainer idles while workers generate and the
// workers idle while it trains, so each gets an equal share, at least 1.
namespace {
int threads_per_process(int cores, int workers) { return std::max(1, cores / (workers + 1)); }
}  // namespace

int run(const RunArgs& args) {
  std::vector<std::string> overrides = args.overrides;
  auto shorthand = [&](const std::optional<int64_t>& v, const char* key) {
    if (v) overrides.push_back(absl::StrCat(key, "=", *v));
  };
  shorthand(args.workers, "rollout.workers");
  shorthand(args.groups_in_flight, "rollout.groups_in_flight");
  shorthand(args.steps, "experiment.steps");
  shorthand(args.groups_per_step, "experiment.groups_per_step");
  shorthand(args.eval_prompts, "eval.prompts");
  shorthand(args.eval_every, "eval.every");
  StatusOr<ExperimentConfig> config = load_config(args.config_file, overrides);
  if (!config.ok()) return fail(config.status());
  const int workers = config->rollout.workers;
  const int ranks = config->trainer.data_parallel.world_size;
  if (config->run.threads == 0) {
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    overrides.push_back(
        absl::StrCat("run.threads=", threads_per_process(cores, workers + ranks - 1)));
  }
  const std::string run_dir =
      (std::filesystem::path(config->experiment.output_dir) / config->experiment.name).string();
  std::error_code ec;
  std::filesystem::create_directories(run_dir, ec);
  if (ec) return fail(InternalError(absl::StrCat("cannot create ", run_dir, ": ", ec.message())));
  const std::string port_file = absl::StrCat(run_dir, "/trainer.port.", ::getpid());
  std::filesystem::remove(port_file, ec);

  const std::string dir = own_dir();
  std::vector<std::string> common = {args.config_file};
  for (const std::string& o : overrides) common.push_back(o);
  if (!args.model_dir.empty()) {
    common.push_back("--model");
    common.push_back(args.model_dir);
  }
  std::vector<std::string> trainer = {dir + "/relay-trainer"};
  trainer.insert(trainer.end(), common.begin(), common.end());
  for (const std::string& a :
       std::vector<std::string>{"--run-dir", run_dir, "--port-file", port_file}) {
    trainer.push_back(a);
  }
  for (const auto& [flag, value] : std::vector<std::pair<std::string, std::string>>{
           {"--store", args.store}, {"--metrics-out", args.metrics_out}, {"--save", args.save}}) {
    if (value.empty()) continue;
    trainer.push_back(flag);
    trainer.push_back(value);
  }
  if (args.resume) trainer.push_back("--resume");
  ::signal(SIGINT, on_signal);
  ::signal(SIGTERM, on_signal);
  // trainer.world_size > 1: that many relay-trainer ranks on this machine,
  // rendezvousing as torchrun's variables say (trainer.rendezvous, when set,
  // wins over MASTER_ADDR/MASTER_PORT in relay-trainer).
  std::vector<std::string> rank_env;
  if (ranks > 1) {
    StatusOr<int> master_port = free_loopback_port();
    if (!master_port.ok()) return fail(master_port.status());
    rank_env = {"MASTER_ADDR=127.0.0.1", absl::StrCat("MASTER_PORT=", *master_port),
                absl::StrCat("WORLD_SIZE=", ranks)};
  }
  auto rank_args = [&](int rank) {
    std::vector<std::string> env = rank_env;
    if (ranks > 1) {
      env.push_back(absl::StrCat("RANK=", rank));
      env.push_back(absl::StrCat("LOCAL_RANK=", rank));
    }
    return env;
  };
  StatusOr<pid_t> trainer_pid = spawn(trainer, rank_args(0));
  if (!trainer_pid.ok()) return fail(trainer_pid.status());
  // The other ranks take the same arguments; they open no port and write
  // nothing to the run directory, and exit when rank 0 stops them.
  std::vector<pid_t> followers;
  auto stop_followers = [&](std::chrono::milliseconds grace) {
    int worst = 0;
    for (size_t i = 0; i < followers.size(); ++i) {
      const auto deadline = std::chrono::steady_clock::now() + grace;
      std::optional<ChildExit> e;
      while (!(e = poll_exit(followers[i])) && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      if (!e) e = stop_child(followers[i], std::chrono::milliseconds(0));
      if (shell_code(*e) != 0) {
        std::fprintf(stderr, "relay run: trainer rank %zu %s\n", i + 1, describe_exit(*e).c_str());
      }
      worst = std::max(worst, shell_code(*e));
    }
    followers.clear();
    return worst;
  };
  for (int rank = 1; rank < ranks; ++rank) {
    StatusOr<pid_t> pid = spawn(trainer, rank_args(rank));
    if (!pid.ok()) {
      stop_child(*trainer_pid, std::chrono::seconds(30));
      stop_followers(std::chrono::seconds(5));
      return fail(pid.status());
    }
    followers.push_back(*pid);
  }

  // The trainer writes its port once it serves (after any warm start).
  std::string port;
  while (port.empty()) {
    if (std::ifstream in(port_file); in) std::getline(in, port);
    if (!port.empty()) break;
    if (std::optional<ChildExit> e = poll_exit(*trainer_pid)) {
      stop_followers(std::chrono::seconds(5));
      return fail(
          InternalError(absl::StrCat("relay-trainer ", describe_exit(*e), " before serving")));
    }
    if (g_interrupted) {
      const ChildExit e = stop_child(*trainer_pid, std::chrono::seconds(30));
      stop_followers(std::chrono::seconds(10));
      return shell_code(e);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::filesystem::remove(port_file, ec);

  auto worker_args = [&](int i) {
    std::vector<std::string> w = {dir + "/relay-rollout"};
    w.insert(w.end(), common.begin(), common.end());
    for (const std::string& a : std::vector<std::string>{"--trainer", "127.0.0.1:" + port, "--name",
                                                         absl::StrCat("local", i)}) {
      w.push_back(a);
    }
    return w;
  };
  std::vector<Worker> pool(workers);
  auto stop_all = [&] {
    for (Worker& w : pool) {
      if (w.pid > 0) stop_child(w.pid, std::chrono::seconds(10));
      w.pid = -1;
    }
  };
  for (int i = 0; i < workers; ++i) {
    if (Status st = start_worker(pool[i], worker_args(i)); !st.ok()) {
      stop_all();
      stop_child(*trainer_pid, std::chrono::seconds(30));
      stop_followers(std::chrono::seconds(10));
      return fail(st);
    }
  }

  // Supervise: a worker that dies while the trainer runs is started again
  // (its leases expire and are re-leased by the trainer) until it has died
  // the same way 3 times in a row or used up its restarts (RestartPolicy).
  // Once no worker is left, the trainer is stopped at once: it would only
  // wait services.group_wait_s for groups nobody makes.
  const RestartPolicy policy;
  std::optional<ChildExit> trainer_exit;
  std::string workers_gone;  // set when relay run stopped the trainer for want of workers
  std::string last_given_up;
  while (!(trainer_exit = poll_exit(*trainer_pid))) {
    if (g_interrupted) {
      // Workers first (they give their leases back), then the trainer
      // (it checkpoints and flushes the store).
      stop_all();
      trainer_exit = stop_child(*trainer_pid, std::chrono::seconds(60));
      break;
    }
    const auto now = std::chrono::steady_clock::now();
    std::vector<WorkerState> states;
    for (int i = 0; i < workers; ++i) {
      const std::string name = absl::StrCat("local", i);
      if (std::string why = supervise_worker(pool[i], name, now, policy, worker_args(i));
          !why.empty()) {
        last_given_up = absl::StrCat("the last, ", name, ", ", why);
      }
      states.push_back(pool[i].state);
    }
    if (every_worker_gone(states)) {
      // SIGTERM: the trainer stops waiting for groups, checkpoints and exits.
      workers_gone = absl::StrCat("every rollout worker is gone: ", last_given_up);
      std::fprintf(stderr, "relay run: %s; stopping the trainer\n", workers_gone.c_str());
      trainer_exit = stop_child(*trainer_pid, std::chrono::seconds(60));
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  stop_all();
  // Rank 0 stops the others on its way out; a rank still running 10 s later
  // is killed.
  const int follower_code = stop_followers(std::chrono::seconds(10));
  const int trainer_code = shell_code(*trainer_exit);
  if (trainer_code != 0) {
    std::fprintf(stderr, "relay run: relay-trainer %s\n", describe_exit(*trainer_exit).c_str());
  }
  if (!workers_gone.empty()) {
    // Last, after the trainer's own lines: the reason the run ended.
    std::fprintf(stderr, "relay run: %s\n", workers_gone.c_str());
    return trainer_code != 0 ? trainer_code : 1;
  }
  return trainer_code != 0 ? trainer_code : follower_code;
}

}  // namespace relay::cli
