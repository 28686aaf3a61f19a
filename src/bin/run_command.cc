// relay run: relay-trainer and W relay-rollout workers on this machine as
// child processes, supervised: the trainer's port is handed to the workers,
// the workers are stopped when the trainer ends, and Ctrl-C stops them all.

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bin/commands.h"
#include "relay/common/config.h"

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

StatusOr<pid_t> spawn(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int rc = ::posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ);
  if (rc != 0) {
    return InternalError(absl::StrCat("cannot start ", args[0], ": ", std::strerror(rc)));
  }
  return pid;
}

// Exit code of a finished child, or -1 while it runs.
int poll_exit(pid_t pid) {
  int status = 0;
  if (::waitpid(pid, &status, WNOHANG) != pid) return -1;
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

// SIGTERM, then SIGKILL after `grace`; the exit code.
int stop_child(pid_t pid, std::chrono::milliseconds grace) {
  int code = poll_exit(pid);
  if (code >= 0) return code;
  ::kill(pid, SIGTERM);
  const auto deadline = std::chrono::steady_clock::now() + grace;
  while (std::chrono::steady_clock::now() < deadline) {
    if ((code = poll_exit(pid)) >= 0) return code;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return 128 + SIGKILL;
}

int fail(const Status& s) {
  std::fprintf(stderr, "relay run: %s\n", std::string(s.message()).c_str());
  return 1;
}

}  // namespace

int run(const RunArgs& args) {
  if (args.workers < 1) return fail(InvalidArgumentError("--workers: must be >= 1"));
  StatusOr<ExperimentConfig> config = load_config(args.config_file, args.overrides);
  if (!config.ok()) return fail(config.status());
  const std::string run_dir =
      (std::filesystem::path(config->run.output_dir) / config->run.name).string();
  const std::string store = args.store.empty() ? run_dir + "/store" : args.store;
  std::error_code ec;
  std::filesystem::create_directories(run_dir, ec);
  if (ec) return fail(InternalError(absl::StrCat("cannot create ", run_dir, ": ", ec.message())));
  const std::string port_file = absl::StrCat(run_dir, "/trainer.port.", ::getpid());
  std::filesystem::remove(port_file, ec);

  const std::string dir = own_dir();
  std::vector<std::string> common = {args.config_file};
  for (const std::string& o : args.overrides) common.push_back(o);
  if (!args.model_dir.empty()) {
    common.push_back("--model");
    common.push_back(args.model_dir);
  }
  std::vector<std::string> trainer = {dir + "/relay-trainer"};
  trainer.insert(trainer.end(), common.begin(), common.end());
  for (const std::string& a : std::vector<std::string>{
           "--store", store, "--port-file", port_file, "--steps", std::to_string(args.steps),
           "--groups-per-step", std::to_string(args.groups_per_step), "--eval-prompts",
           std::to_string(args.eval_prompts), "--eval-every", std::to_string(args.eval_every)}) {
    trainer.push_back(a);
  }
  if (!args.metrics_out.empty()) {
    trainer.push_back("--metrics-out");
    trainer.push_back(args.metrics_out);
  }
  if (!args.save.empty()) {
    trainer.push_back("--save");
    trainer.push_back(args.save);
  }
  ::signal(SIGINT, on_signal);
  ::signal(SIGTERM, on_signal);
  StatusOr<pid_t> trainer_pid = spawn(trainer);
  if (!trainer_pid.ok()) return fail(trainer_pid.status());

  // The trainer writes its port once it serves.
  std::string port;
  while (port.empty()) {
    if (std::ifstream in(port_file); in) std::getline(in, port);
    if (!port.empty()) break;
    if (int code = poll_exit(*trainer_pid); code >= 0) {
      return fail(
          InternalError(absl::StrCat("relay-trainer exited with ", code, " before serving")));
    }
    if (g_interrupted) return stop_child(*trainer_pid, std::chrono::seconds(5));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::filesystem::remove(port_file, ec);

  std::vector<pid_t> workers;
  for (int i = 0; i < args.workers; ++i) {
    std::vector<std::string> w = {dir + "/relay-rollout"};
    w.insert(w.end(), common.begin(), common.end());
    for (const std::string& a : std::vector<std::string>{
             "--trainer", "127.0.0.1:" + port, "--name", absl::StrCat("local", i),
             "--groups-in-flight", std::to_string(args.groups_in_flight)}) {
      w.push_back(a);
    }
    StatusOr<pid_t> pid = spawn(w);
    if (!pid.ok()) {
      for (pid_t p : workers) stop_child(p, std::chrono::seconds(5));
      stop_child(*trainer_pid, std::chrono::seconds(5));
      return fail(pid.status());
    }
    workers.push_back(*pid);
  }

  int trainer_code = -1;
  while ((trainer_code = poll_exit(*trainer_pid)) < 0) {
    if (g_interrupted) {
      trainer_code = stop_child(*trainer_pid, std::chrono::seconds(10));
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  for (pid_t p : workers) stop_child(p, std::chrono::seconds(5));
  if (trainer_code != 0) {
    std::fprintf(stderr, "relay run: relay-trainer exited with %d\n", trainer_code);
  }
  return trainer_code;
}

}  // namespace relay::cli
